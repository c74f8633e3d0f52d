// The optional host-memory tier between the disk and the arena (StoreOptions::host_cache_bytes,
// `dsflash-expertstore --host-cache SIZE`): slot-sized entries of page-locked host memory with
// their own LRU. A load whose expert is in the tier copies it from there into the arena slot
// and reads nothing from disk; a load from disk also fills a tier entry. Worth it where host
// memory is larger than the device arena and faster than the disk (an H200 host); pointless on
// GB10's unified memory, so off by default. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "expertstore_svc/arena.h"

namespace dsflash::expertstore {

class HostTier {
 public:
  // n = bytes / slot_bytes entries (InvalidArgument when 0), page-locked for copies into
  // `pin_for` (see Arena::pin) unless it is null.
  static StatusOr<std::unique_ptr<HostTier>> create(uint64_t bytes, uint64_t slot_bytes, Arena* pin_for);
  ~HostTier();

  // An entry in use: its bytes stay put (never evicted) until release(); `fill` entries are
  // being written and become visible to find() at release().
  struct Handle {
    uint32_t entry = UINT32_MAX;
    uint8_t* data = nullptr;  // slot_bytes, the matrices at their slot offsets
    bool fill = false;
    explicit operator bool() const { return data != nullptr; }
  };
  // The entry holding (layer, expert), or an empty handle.
  Handle find(uint32_t layer, uint32_t expert);
  // An entry to fill with (layer, expert): the least recently used one nobody is using (its
  // expert is dropped), or an empty handle when every entry is in use.
  Handle take_for(uint32_t layer, uint32_t expert);
  // Ends a find() or take_for(); `filled` publishes a take_for() entry (false: left empty).
  void release(const Handle& h, bool filled = true);

  uint32_t entries() const { return static_cast<uint32_t>(entries_.size()); }
  uint64_t hits() const;

 private:
  struct Entry {
    int64_t key = -1;  // layer << 32 | expert, -1 = empty
    uint32_t users = 0;
    uint64_t last_use = 0;
  };
  HostTier() = default;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0, slot_bytes_ = 0;
  Arena* pinned_for_ = nullptr;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::map<int64_t, uint32_t> index_;  // key -> entry (filled entries only)
  uint64_t clock_ = 0, hits_ = 0;
};

}  // namespace dsflash::expertstore
