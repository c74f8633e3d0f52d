// The expert store core: the shard set, the slice map, a memfd arena of fixed-size slots
// sized from a memory budget, the shared slot table, and reader threads that load missed
// experts (demand before prefetch) into slots. Process-agnostic: the gRPC service and the
// in-process expert source both sit on top of it. Thread-safe.
//
// Not here yet (see the issue note): the CUDA VMM / IPC device arena, the pinned staging
// ring with O_DIRECT reads, and the gRPC service with per-session leases.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/ipc/shm.h"
#include "expertstore_svc/slice_map.h"
#include "expertstore_svc/slot_table.h"

namespace dsflash::expertstore {

struct StoreOptions {
  uint64_t budget_bytes = 1ull << 30;  // arena bytes
  int reader_threads = 2;
};

struct StoreStats {
  uint64_t hits = 0, misses = 0, evictions = 0, loads = 0, bytes_read = 0, prefetches = 0;
  uint32_t slots = 0, resident = 0, leased = 0;
};

class Store {
 public:
  // Opens the model (any shard of a set), builds the slice map and the arena. Errors: missing
  // or corrupt shards, absent or misshapen expert tensors, a budget below one layer's top-k.
  static StatusOr<std::unique_ptr<Store>> open(const std::string& model_path, StoreOptions options);
  ~Store();

  const config::ModelConfig& config() const { return cfg_; }
  const SliceMap& slices() const { return slices_; }
  SlotTable& table() { return table_; }
  const ipc::SharedRegion& arena() const { return arena_; }
  const ipc::SharedRegion& table_region() const { return table_mem_; }

  // A lease on (layer, expert), loading it on a miss (blocks until ready or failed).
  StatusOr<Lease> acquire(uint32_t layer, uint32_t expert);
  // Queues a low-priority load (dropped if resident or already queued).
  void prefetch(uint32_t layer, uint32_t expert);
  void release(const Lease& lease);
  StoreStats stats() const;
  uint64_t tick() { return ++tick_; }

 private:
  struct Load {
    uint32_t layer, expert;
    bool done = false;
    Status status;
    std::condition_variable cv;
  };
  Store() = default;
  void reader_loop();
  Status load_into(uint32_t layer, uint32_t expert);

  std::unique_ptr<gguf::Model> model_;
  config::ModelConfig cfg_;
  SliceMap slices_;
  ipc::SharedRegion arena_, table_mem_;
  SlotTable table_;
  std::atomic<uint64_t> tick_{0};

  mutable std::mutex mu_;
  std::condition_variable work_cv_, slot_cv_;
  std::deque<std::shared_ptr<Load>> demand_, prefetch_;
  std::map<uint64_t, std::shared_ptr<Load>> inflight_;  // layer * n_experts + expert
  std::vector<std::thread> readers_;
  bool stop_ = false;
  StoreStats stats_;
};

}  // namespace dsflash::expertstore
