// The expert store core: the shard set, the slice map, an arena of fixed-size slots sized
// from a memory budget, the shared slot and lease tables, client sessions, a staging ring
// and reader threads that load missed experts (demand before prefetch) into slots, through
// an optional host-memory tier.
// Process-agnostic: the gRPC service (server.h) and the in-process expert source both sit
// on top of it. Thread-safe.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/ipc/shm.h"
#include "expertstore_svc/arena.h"
#include "expertstore_svc/host_tier.h"
#include "expertstore_svc/slice_map.h"
#include "expertstore_svc/slot_table.h"
#include "expertstore_svc/staging.h"

namespace dsflash::expertstore {

struct StoreOptions {
  uint64_t budget_bytes = 1ull << 30;  // arena bytes
  int reader_threads = 8;  // more reads in flight: 16 vs 4 decoded 20 % faster (bench/results.csv)
  int staging_buffers = 0;  // 0: two per reader thread
  bool pin_staging = true;  // page-lock the staging ring (failure is an error)
  bool direct_io = true;    // O_DIRECT reads where the file system supports them
  // Where the slots live: "host" (memfd), "device" (CUDA device memory), or "auto" (device
  // when this build has CUDA and a GPU is present). The CPU backend reads only "host".
  std::string arena = "host";
  int device = 0;
  std::string device_mechanism = "auto";  // "auto", "cuda-vmm-fd", "cuda-ipc"
  // Eviction among unleased slots. By default the least often leased expert (counts halved
  // every 16 uses per expert of the use clock; SlotTable::set_least_frequent): on the routing
  // recorded on the H200 with skewed expert popularity it hit 0.69 at a 25 % arena and 0.87 at
  // 50 %, against strict LRU's 0.47 and 0.81 (bench/expert_cache_sim --trace). Else, with
  // evict_least_frequent off: 0 = strict LRU; f in (0, 1] = a random victim among the oldest
  // f of them (SlotTable::set_eviction).
  bool evict_least_frequent = true;
  double evict_oldest_fraction = 0;
  // Bytes of the host-memory tier between disk and arena (host_tier.h); 0: none.
  uint64_t host_cache_bytes = 0;
  // With a device arena, keep the Q2_K / Q3_K slices in the device tile order the inference
  // process's tensor-core GEMVs read fastest (kernels/linear/tiles.h; SliceLayout.tiles tells
  // the client); the GGUF order where off, or in a host arena.
  bool tiles = true;
};

// One finished load, for metrics.
struct LoadEvent {
  uint32_t layer = 0, expert = 0;
  bool ok = true, demand = true, evicted = false;
  bool host_tier = false;  // copied from the host tier (no disk read)
  absl::StatusCode code = absl::StatusCode::kOk;
  uint64_t bytes = 0;
  double queue_s = 0, read_s = 0, copy_s = 0, total_s = 0;  // total: enqueue to ready
};

struct StoreStats {
  uint64_t hits = 0, misses = 0, evictions = 0, loads = 0, load_failures = 0, bytes_read = 0, prefetches = 0;
  uint32_t slots = 0, resident = 0, leased = 0, sessions = 0;
  uint64_t ring_in_use = 0, ring_size = 0;
  uint64_t queued_demand = 0, queued_prefetch = 0;  // loads waiting for a reader
  uint64_t host_tier_hits = 0;  // loads served by the host tier
  uint32_t host_tier_slots = 0;
};

// A client session: its row of the lease table and which opening of that row it is (a closed
// row is reused), so a call that outlives its session cannot act on the row's next holder.
struct SessionRow {
  uint32_t row = 0;
  uint64_t epoch = 0;
};

class Store {
 public:
  static constexpr uint32_t kLocalSession = 0;  // the in-process user's row (tests, benchmarks)
  static constexpr SessionRow kLocal{kLocalSession, 0};

  // Opens the model (any shard of a set), builds the slice map, the arena and the staging
  // ring. Errors: missing or corrupt shards, absent or misshapen expert tensors, a budget
  // below one layer's top-k, a staging ring that cannot be page-locked.
  static StatusOr<std::unique_ptr<Store>> open(const std::string& model_path, StoreOptions options);
  ~Store();
  // Wakes every waiter with UNAVAILABLE and stops the readers (shutdown); idempotent.
  void stop();

  const config::ModelConfig& config() const { return cfg_; }
  const gguf::Model& model() const { return *model_; }
  const SliceMap& slices() const { return slices_; }
  SlotTable& table() { return table_; }
  Arena& arena() const { return *arena_; }
  const ipc::SharedRegion& table_region() const { return table_mem_; }
  const ipc::SharedRegion& lease_region() const { return lease_mem_; }
  bool direct_io() const { return reader_->direct(); }
  // Called by the reader threads after each load (may be set while they run).
  void set_load_observer(std::function<void(const LoadEvent&)> f) {
    std::lock_guard<std::mutex> l(observer_mu_);
    on_load_ = std::make_shared<const std::function<void(const LoadEvent&)>>(std::move(f));
  }

  // Client sessions: a row of the lease table. ResourceExhausted when all are taken.
  StatusOr<SessionRow> open_session();
  // Drops every lease the session holds (its client is gone); returns how many. Nothing for a
  // session already closed.
  uint64_t close_session(SessionRow session);

  // A lease for `session` on (layer, expert), loading it on a miss (blocks until ready or
  // failed). OutOfRange for an expert that does not exist; Unavailable once the session has
  // closed (also while this call waited for the load).
  StatusOr<Lease> acquire(SessionRow session, uint32_t layer, uint32_t expert);
  // Queues a load (dropped if resident or already queued): low priority, or with `demand` at
  // demand priority (promoting a queued prefetch of the same expert). Returns whether a
  // load was queued or promoted.
  bool prefetch(uint32_t layer, uint32_t expert, bool demand = false);
  Status release(const Lease& lease);
  // Release for a client's session: Unavailable once it has closed (its leases went with it).
  Status release(SessionRow session, uint32_t slot, uint64_t generation);
  StoreStats stats() const;
  uint64_t tick() { return table_.next_tick(); }

 private:
  struct Load {
    uint32_t layer, expert;
    bool demand = true, done = false;
    Status status;
    std::chrono::steady_clock::time_point queued;
    std::condition_variable cv;
  };
  Store() = default;
  void reader_loop();
  Status load_into(Load& job, LoadEvent& ev);
  Status copy_from_tier(const ExpertSlices& sl, const HostTier::Handle& cached, uint64_t base, LoadEvent& ev);
  Status read_from_disk(const Load& job, const ExpertSlices& sl, uint64_t base, LoadEvent& ev);
  // One slice's bytes (host memory, GGUF order) into the slot at base, in the slice's order.
  Status copy_slice(uint64_t base, const Slice& s, const uint8_t* data);
  StatusOr<uint32_t> wait_for_victim(bool* evicted);
  bool is_open(SessionRow s) const;  // under mu_

  std::unique_ptr<gguf::Model> model_;
  config::ModelConfig cfg_;
  SliceMap slices_;
  std::unique_ptr<Arena> arena_;
  ipc::SharedRegion table_mem_, lease_mem_;
  SlotTable table_;
  std::unique_ptr<StagingRing> ring_;
  std::unique_ptr<SliceReader> reader_;
  std::unique_ptr<HostTier> tier_;  // null: no host tier
  std::mutex observer_mu_;
  std::shared_ptr<const std::function<void(const LoadEvent&)>> on_load_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<std::shared_ptr<Load>> demand_, prefetch_;
  std::map<uint64_t, std::shared_ptr<Load>> inflight_;  // layer * n_experts + expert
  std::deque<uint32_t> free_sessions_;                   // least recently freed first
  std::array<bool, kSessions> open_{};                   // rows held by a session (kLocalSession always)
  std::array<uint64_t, kSessions> epoch_{};              // the opening of each row (kLocalSession: 0)
  uint64_t opened_ = 0;                                  // openings so far
  std::vector<std::thread> readers_;
  bool stop_ = false;
  StoreStats stats_;
  uint64_t retired_hits_ = 0;  // hits counted by sessions that have closed
};

}  // namespace dsflash::expertstore
