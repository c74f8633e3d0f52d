// The expert slot table: the shared-memory structure through which the expert store and
// its clients agree on which expert occupies which arena slot, without an RPC on a hit.
//
// Layout (one region, little-endian, 64-byte aligned entries):
//   Header | ExpertEntry[n_layers * n_experts] | SlotEntry[n_slots]
// ExpertEntry.slot: 1 + slot index of a ready copy of the expert, 0 when not resident.
// SlotEntry.generation: even = stable (ready or empty), odd = being refilled; bumped by the
// store around every refill. SlotEntry.leases: lease count, or kLocked while the store owns
// the slot for a refill. A client takes a lease by CAS-incrementing an unlocked count and then
// re-checking that the slot still holds its expert at the same generation; the store evicts
// only by CAS-ing a zero count to kLocked, so a leased slot is never evicted or overwritten.
// SlotEntry.last_use: a tick clients write on every hit; eviction takes the unleased slot with
// the oldest tick (LRU among unleased slots).
//
// Thread- and process-safe through atomics on the shared region; the store is the only
// writer of the mapping and of generations.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/status.h"

namespace dsflash::expertstore {

inline constexpr uint64_t kSlotTableMagic = 0x31454c42544c5344ull;  // "DSLTBLE1"
inline constexpr uint32_t kLocked = 0x80000000u;

struct alignas(64) SlotTableHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t n_layers;
  uint32_t n_experts;  // per layer
  uint32_t n_slots;
  uint64_t slot_bytes;
};

struct alignas(64) ExpertEntry {
  std::atomic<uint32_t> slot;  // 1 + slot, 0 = not resident
};

struct alignas(64) SlotEntry {
  std::atomic<uint64_t> generation;
  std::atomic<uint32_t> leases;
  std::atomic<int32_t> expert;  // layer * n_experts + expert, -1 = empty
  std::atomic<uint64_t> last_use;
};

// A lease on one slot: valid while held; names the generation it was taken at.
struct Lease {
  uint32_t slot = 0;
  uint64_t generation = 0;
};

class SlotTable {
 public:
  // Bytes of a table for this geometry.
  static size_t bytes(uint32_t n_layers, uint32_t n_experts, uint32_t n_slots);
  // Formats `mem` (bytes(...) long, zeroed or not) as an empty table (the store).
  static SlotTable create(void* mem, uint32_t n_layers, uint32_t n_experts, uint32_t n_slots, uint64_t slot_bytes);
  // Attaches to a formatted region of `size` bytes (a client); checks magic and geometry.
  static StatusOr<SlotTable> attach(void* mem, size_t size);

  const SlotTableHeader& header() const { return *h_; }

  // ---- client side (hit path: no RPC) ----
  // A lease on the resident copy of (layer, expert), or nullopt if not resident now.
  std::optional<Lease> try_acquire(uint32_t layer, uint32_t expert, uint64_t tick);
  void release(const Lease& lease);

  // ---- store side ----
  // Picks and locks a slot for a refill: an empty slot first, else the least recently used
  // unleased slot (its expert is unmapped). nullopt when every slot is leased.
  std::optional<uint32_t> lock_victim();
  // Marks a locked slot as holding (layer, expert), ready, and maps the expert to it.
  void publish(uint32_t slot, uint32_t layer, uint32_t expert, uint64_t tick);
  // Unlocks a locked slot as empty (a failed load).
  void abandon(uint32_t slot);

  uint32_t resident_slot(uint32_t layer, uint32_t expert) const;  // 1 + slot, or 0
  uint32_t leased_slots() const;
  // Checks every invariant (mapping and slots agree, generations even when unlocked, no
  // expert mapped twice); an error names the first violation. For tests and debugging.
  Status verify_integrity() const;

 private:
  SlotTableHeader* h_ = nullptr;
  ExpertEntry* experts_ = nullptr;
  SlotEntry* slots_ = nullptr;
};

}  // namespace dsflash::expertstore
