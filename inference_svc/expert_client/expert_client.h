// ExpertClient: the inference process's side of the expert store. A model::ExpertSource
// that keeps a session with dsflash-expertstore, maps its arena (a memfd for the CPU backend,
// device memory imported by VMM fd or CUDA IPC handle for the CUDA backend), its slot table
// (read-only) and its lease table, serves hits from shared memory with no RPC, sends misses over gRPC
// (Acquire) and hints a layer's experts (Prefetch), and releases leases in place after the
// layer's expert compute.
//
// The session is kept by a background thread: when the store goes away, in-flight acquires
// fail with UNAVAILABLE, connected() turns false, and the thread reconnects every
// reconnect_interval until the store is back. Nothing blocks longer than acquire_timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/config/config.h"
#include "common/status.h"
#include "inference_svc/model/model.h"

namespace grpc {
class ClientContext;
}
namespace dsflash::v1 {
class SessionInfo;
}

namespace dsflash::expertclient {

struct ClientOptions {
  std::string address;  // "unix:/path" or "host:port"
  std::string client_name = "dsflash-inference";
  // The client's fingerprint of its model's expert tensors (gguf::Model::fingerprint
  // ("_exps.")): a store serving another model is refused. Empty: not checked.
  std::string model_fingerprint;
  std::chrono::milliseconds acquire_timeout{60000};
  std::chrono::milliseconds reconnect_interval{500};
  // The CUDA backend's client: the store must have a device arena, which this process imports
  // (VMM fd or CUDA IPC handle) on `device`; acquired matrices are device pointers into it.
  // false: a memfd arena mapped into this process (the CPU backend).
  bool device_arena = false;
  int device = 0;
};

// Called after every acquire with whether it was a hit and how long it took.
using FetchObserver = std::function<void(bool hit, double seconds)>;

class ExpertClient final : public model::ExpertSource {
 public:
  // Starts the session thread; does not wait for the store (see wait_connected()).
  ExpertClient(ClientOptions options, const config::ModelConfig& cfg);
  ~ExpertClient() override;

  bool connected() const;
  // Waits up to `timeout` for a session; the error names the store and the last failure.
  Status wait_connected(std::chrono::milliseconds timeout) const;
  // UNAVAILABLE naming the store and the reason while there is no session.
  Status availability() const;
  void set_observer(FetchObserver f) { observer_ = std::move(f); }

  StatusOr<model::ExpertWeights> acquire(int layer, int expert) override;
  void release(int layer, int expert) override;
  void prefetch(int layer, const std::vector<int>& experts) override;
  kernels::Backend memory() const override {
    return options_.device_arena ? kernels::Backend::kCuda : kernels::Backend::kCpu;
  }
  size_t lease_budget() const override;
  const uint8_t* arena_base() const override;

  size_t held() const;
  // Whether (layer, expert) is resident in the store's arena now (no lease taken).
  bool resident(int layer, int expert) const;
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Session;
  void run();
  StatusOr<std::shared_ptr<Session>> open_session();
  // open_session's steps: the store's description against this model and backend, the fds
  // handed over on its socket, and their mappings.
  Status check_session(const dsflash::v1::SessionInfo& in) const;
  static StatusOr<std::vector<int>> receive_fds(const dsflash::v1::SessionInfo& in, size_t n_fds);
  Status map_session(Session& s, std::vector<int>& fds) const;
  std::shared_ptr<Session> current() const;
  model::ExpertWeights view(const Session& s, int layer, uint32_t slot) const;

  const ClientOptions options_;
  const config::ModelConfig cfg_;
  FetchObserver observer_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> hits_{0}, misses_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::shared_ptr<Session> session_;
  grpc::ClientContext* connecting_ = nullptr;  // the stream being opened (cancelled on stop)
  std::string last_error_ = "not connected yet";
  struct Held;
  std::multimap<std::pair<int, int>, std::shared_ptr<Held>> held_;
  std::thread thread_;
};

}  // namespace dsflash::expertclient
