// The expert slot table: the shared-memory structures through which the expert store and
// its clients agree on which expert occupies which arena slot, with no RPC on a hit.
//
// Two regions (little-endian, 64-byte aligned entries):
//   table  (store writes, clients map read-only): TableHeader | ExpertEntry[n_layers*n_experts]
//          | SlotEntry[n_slots]
//   leases (store and clients write): LeaseHeader | SessionEntry[kMaxSessions]
//          | SlotLeases[n_slots] (one 64-byte line per slot: a use tick and one lease count
//          per session) | uses: uint32[n_layers*n_experts] (leases taken per expert, aged)
// ExpertEntry.slot: 1 + slot index of a ready copy of the expert, 0 when not resident.
// SlotEntry.generation: even = stable, odd = being refilled; bumped by the store around a
// refill. SlotEntry.locked: 1 while the store owns the slot for a refill.
//
// Leases are counts per (slot, session), so the store can drop every lease of a session
// whose client died. A client takes a lease by incrementing its count and then re-reading
// the slot (not locked, same expert, even generation); the store evicts by setting `locked`
// and then reading every count of the slot, backing off if any is non-zero. Both sides write
// then read with sequentially consistent atomics, so at least one of them sees the other: a
// leased slot is never evicted or overwritten. Eviction takes an empty slot, else the unleased
// slot with the oldest use tick (LRU among unleased slots; clients write the tick on every
// hit), or, with set_eviction(f), a random one among the oldest fraction f of them, or, with
// set_least_frequent(period), the one whose expert was leased least often (counts halved every
// `period` ticks, so popularity can drift; ties by use tick). Use ticks come from one clock in
// the lease region that the store and every client advance.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/status.h"

namespace dsflash::expertstore {

inline constexpr uint64_t kSlotTableMagic = 0x32454c42544c5344ull;  // "DSLTBLE2"
inline constexpr uint64_t kLeaseTableMagic = 0x3253455341454c44ull;  // "DLEASES2"
inline constexpr uint32_t kSessions = 14;  // sessions per store: 8 + 14 * 4 bytes = one line per slot

struct alignas(64) TableHeader {
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
  std::atomic<uint32_t> locked;
  std::atomic<int32_t> expert;  // layer * n_experts + expert, -1 = empty
  std::atomic<uint64_t> loaded_tick;
};

struct alignas(64) LeaseHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t n_slots;
  // The use clock every process ticks (SlotTable::next_tick): the store's loads and the
  // clients' hits order on one time line, so LRU compares like with like.
  std::atomic<uint64_t> clock;
};

// Written by the client that owns the session (hits are counted without an RPC).
struct alignas(64) SessionEntry {
  std::atomic<uint64_t> hits;
};

struct alignas(64) SlotLeases {
  std::atomic<uint64_t> last_use;
  std::atomic<uint32_t> count[kSessions];
};
static_assert(sizeof(SlotLeases) == 64);

// A lease on one slot, held by one session; names the generation it was taken at.
struct Lease {
  uint32_t session = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;
};

class SlotTable {
 public:
  static size_t table_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t n_slots);
  static size_t lease_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t n_slots);
  // Formats both regions (zeroed or not) as an empty table (the store).
  static SlotTable create(void* table, void* leases, uint32_t n_layers, uint32_t n_experts, uint32_t n_slots,
                          uint64_t slot_bytes);
  // Attaches to formatted regions (a client); checks magic, version and geometry.
  static StatusOr<SlotTable> attach(const void* table, size_t table_size, void* leases, size_t leases_size);

  const TableHeader& header() const { return *h_; }
  // The next tick of the shared use clock (store and clients alike pass it to try_acquire and
  // publish).
  uint64_t next_tick() { return lh_->clock.fetch_add(1, std::memory_order_relaxed) + 1; }

  // ---- client side (hit path: no RPC) ----
  // A lease for `session` on the resident copy of (layer, expert), or nullopt if it is not
  // resident now (or being refilled).
  std::optional<Lease> try_acquire(uint32_t session, uint32_t layer, uint32_t expert, uint64_t tick);
  void release(const Lease& lease);
  void count_hit(uint32_t session) { sessions_[session].hits.fetch_add(1, std::memory_order_relaxed); }

  // ---- store side ----
  // Picks and locks a slot for a refill: an empty slot first, else the least recently used
  // unleased slot (its expert is unmapped; *evicted says whether it held one). nullopt when
  // every slot is leased or locked.
  std::optional<uint32_t> lock_victim(bool* evicted = nullptr);
  // The victim among occupied unleased slots: 0 = the least recently used; f in (0, 1] = a
  // random one among the oldest f of them (at least one), which breaks strict LRU's lockstep
  // when the working set slightly exceeds the arena (spec/peers-perf.md §2.4).
  void set_eviction(double oldest_fraction, uint64_t seed = 1);
  // The victim among occupied unleased slots: the least often leased expert, leases counted
  // per expert (resident or not) and halved every `aging_ticks` of the use clock; 0 turns it
  // off (then set_eviction's policy). A slot loaded and not leased since is passed over for
  // aging_ticks / 64 ticks, at least 64 (unless nothing else can go): a miss's client takes its lease just
  // after the load, and a new expert has no count yet. On routing with skewed expert
  // popularity it keeps the popular set that recency alone churns (bench/expert_cache_sim on
  // a recorded trace).
  void set_least_frequent(uint64_t aging_ticks);
  // Leases taken on (layer, expert) since the last halvings (a hit or a load's first lease).
  uint32_t uses(uint32_t layer, uint32_t expert) const {
    return uses_[layer * h_->n_experts + expert].load(std::memory_order_relaxed);
  }
  // Marks a locked slot as holding (layer, expert), ready, and maps the expert to it.
  void publish(uint32_t slot, uint32_t layer, uint32_t expert, uint64_t tick);
  // Unlocks a locked slot as empty (a failed load).
  void abandon(uint32_t slot);
  // Drops every lease of `session` (its client is gone) and zeroes its entry; returns the
  // number of leases dropped.
  uint64_t clear_session(uint32_t session);

  uint32_t resident_slot(uint32_t layer, uint32_t expert) const;  // 1 + slot, or 0
  uint32_t leased_slots() const;
  uint64_t session_leases(uint32_t session) const;
  uint32_t lease_count(uint32_t session, uint32_t slot) const {
    return leases_[slot].count[session].load(std::memory_order_relaxed);
  }
  uint64_t session_hits(uint32_t session) const { return sessions_[session].hits.load(std::memory_order_relaxed); }
  // Checks every invariant (mapping and slots agree, generations even when unlocked, no
  // expert mapped twice); an error names the first violation. For tests and debugging.
  Status verify_integrity() const;

 private:
  bool leased(uint32_t slot) const;
  uint64_t next_random();

  TableHeader* h_ = nullptr;
  LeaseHeader* lh_ = nullptr;
  ExpertEntry* experts_ = nullptr;
  SlotEntry* slots_ = nullptr;
  SessionEntry* sessions_ = nullptr;
  SlotLeases* leases_ = nullptr;
  std::atomic<uint32_t>* uses_ = nullptr;
  double oldest_fraction_ = 0;
  uint64_t aging_ticks_ = 0, next_aging_ = 0;  // least-frequent eviction (store side)
  uint64_t fresh_ticks_ = 0;  // how long a load not yet leased is kept from eviction
  uint64_t rng_ = 1;
  std::vector<std::pair<uint64_t, uint32_t>> candidates_;  // (use, slot) scratch of lock_victim
  // Ages the use counts when the clock has passed next_aging_ (least-frequent eviction).
  void age_uses();
};

}  // namespace dsflash::expertstore
