// dsflash.v1.ExpertStore over gRPC, on top of a Store: sessions whose lifetime is a
// server stream (the store drops a session's leases when the stream ends), the companion
// Unix socket that hands a session its arena / slot-table / lease-table fds, and the
// Prometheus metrics of the store.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "dsflash/v1/expertstore.grpc.pb.h"
#include "expertstore_svc/store.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dsflash::expertstore {

// The store's metrics (dsflash_expertstore_*); counters that live in shared memory (hits
// counted by clients) are brought up to date by refresh().
class StoreMetrics {
 public:
  explicit StoreMetrics(const Store& store);
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  void on_load(const LoadEvent& ev);
  void on_acquire(const std::string& code);
  void refresh();  // call before each scrape or periodically

 private:
  const Store& store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::mutex mu_;
  StoreStats last_;
  prometheus::Counter *hits_, *misses_, *evictions_, *bytes_read_, *prefetches_, *host_tier_hits_;
  prometheus::Family<prometheus::Counter>* loads_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Family<prometheus::Counter>* acquires_;
  prometheus::Histogram *read_s_, *copy_s_, *queue_s_, *demand_load_s_, *prefetch_load_s_;
  prometheus::Gauge *resident_slots_, *resident_bytes_, *capacity_slots_, *capacity_bytes_, *leased_, *sessions_,
      *ring_in_use_, *ring_size_, *queued_demand_, *queued_prefetch_;
};

class ExpertStoreService final : public dsflash::v1::ExpertStore::CallbackService {
 public:
  // `fd_socket`: the Unix socket path for fd hand-over (served by this object).
  static StatusOr<std::unique_ptr<ExpertStoreService>> create(Store& store, StoreMetrics* metrics,
                                                              const std::string& fd_socket);
  ~ExpertStoreService() override;
  // Ends every session stream with UNAVAILABLE and refuses new ones (shutdown).
  void shutdown();
  size_t sessions() const;

  grpc::ServerWriteReactor<dsflash::v1::SessionEvent>* OpenSession(grpc::CallbackServerContext* ctx,
                                                                   const dsflash::v1::OpenSessionRequest* req) override;
  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx, const dsflash::v1::AcquireRequest* req,
                                    dsflash::v1::AcquireResponse* resp) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* ctx, const dsflash::v1::PrefetchRequest* req,
                                     dsflash::v1::PrefetchResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const dsflash::v1::ReleaseRequest* req,
                                    dsflash::v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const dsflash::v1::GetStatsRequest* req,
                                     dsflash::v1::StoreStats* resp) override;

 private:
  class SessionReactor;
  ExpertStoreService(Store& store, StoreMetrics* metrics) : store_(store), metrics_(metrics) {}
  void fd_loop();
  void serve_fds(int conn);
  StatusOr<SessionRow> lease_row(uint64_t session_id) const;
  void end_session(uint64_t session_id);
  dsflash::v1::SessionInfo describe() const;

  Store& store_;
  StoreMetrics* metrics_;
  std::string fd_socket_, fingerprint_;
  int listen_fd_ = -1;
  int ro_arena_fd_ = -1, ro_table_fd_ = -1;
  std::thread fd_thread_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::mt19937_64 rng_{std::random_device{}()};
  std::map<uint64_t, SessionReactor*> sessions_;  // by session id, while the stream is open
  std::map<uint64_t, SessionRow> rows_;           // session id -> lease row
};

}  // namespace dsflash::expertstore
