// Slot table operations (see slot_table.h for the protocol).
#include "expertstore_svc/slot_table.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dsflash::expertstore {
namespace {

constexpr uint32_t kVersion = 4;

}  // namespace

size_t SlotTable::table_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t n_slots) {
  return sizeof(TableHeader) + sizeof(ExpertEntry) * static_cast<size_t>(n_layers) * n_experts +
         sizeof(SlotEntry) * static_cast<size_t>(n_slots);
}

size_t SlotTable::lease_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t n_slots) {
  return sizeof(LeaseHeader) + sizeof(SessionEntry) * kSessions + sizeof(SlotLeases) * static_cast<size_t>(n_slots) +
         sizeof(std::atomic<uint32_t>) * static_cast<size_t>(n_layers) * n_experts;
}

SlotTable SlotTable::create(void* table, void* leases, uint32_t n_layers, uint32_t n_experts, uint32_t n_slots,
                            uint64_t slot_bytes) {
  SlotTable t;
  auto* p = static_cast<uint8_t*>(table);
  t.h_ = new (p) TableHeader{kSlotTableMagic, kVersion, n_layers, n_experts, n_slots, slot_bytes};
  t.experts_ = reinterpret_cast<ExpertEntry*>(p + sizeof(TableHeader));
  t.slots_ = reinterpret_cast<SlotEntry*>(p + sizeof(TableHeader) + sizeof(ExpertEntry) * size_t{n_layers} * n_experts);
  for (size_t i = 0; i < size_t{n_layers} * n_experts; ++i) new (&t.experts_[i]) ExpertEntry{};
  for (uint32_t s = 0; s < n_slots; ++s) new (&t.slots_[s]) SlotEntry{}, t.slots_[s].expert.store(-1);
  auto* q = static_cast<uint8_t*>(leases);
  t.lh_ = new (q) LeaseHeader{kLeaseTableMagic, kVersion, n_slots, {}};
  t.sessions_ = reinterpret_cast<SessionEntry*>(q + sizeof(LeaseHeader));
  t.leases_ = reinterpret_cast<SlotLeases*>(q + sizeof(LeaseHeader) + sizeof(SessionEntry) * kSessions);
  for (uint32_t i = 0; i < kSessions; ++i) new (&t.sessions_[i]) SessionEntry{};
  for (uint32_t s = 0; s < n_slots; ++s) new (&t.leases_[s]) SlotLeases{};
  t.uses_ = reinterpret_cast<std::atomic<uint32_t>*>(t.leases_ + n_slots);
  for (size_t i = 0; i < size_t{n_layers} * n_experts; ++i) new (&t.uses_[i]) std::atomic<uint32_t>(0);
  return t;
}

StatusOr<SlotTable> SlotTable::attach(const void* table, size_t table_size, void* leases, size_t leases_size) {
  if (table_size < sizeof(TableHeader) || leases_size < sizeof(LeaseHeader)) {
    return absl::InvalidArgumentError("slot table region too small for its header");
  }
  SlotTable t;
  auto* p = static_cast<uint8_t*>(const_cast<void*>(table));  // read-only mapping: never written here
  t.h_ = reinterpret_cast<TableHeader*>(p);
  auto* lh = static_cast<LeaseHeader*>(leases);
  t.lh_ = lh;
  if (t.h_->magic != kSlotTableMagic || t.h_->version != kVersion || lh->magic != kLeaseTableMagic ||
      lh->version != kVersion) {
    return absl::InvalidArgumentError("slot table region has a bad magic or version");
  }
  if (table_bytes(t.h_->n_layers, t.h_->n_experts, t.h_->n_slots) > table_size || lh->n_slots != t.h_->n_slots ||
      lease_bytes(t.h_->n_layers, t.h_->n_experts, lh->n_slots) > leases_size) {
    return absl::InvalidArgumentError(absl::StrCat("slot table geometry (", t.h_->n_layers, " layers x ", t.h_->n_experts,
                                                   " experts, ", t.h_->n_slots, " slots) does not fit its regions"));
  }
  t.experts_ = reinterpret_cast<ExpertEntry*>(p + sizeof(TableHeader));
  t.slots_ = reinterpret_cast<SlotEntry*>(p + sizeof(TableHeader) +
                                          sizeof(ExpertEntry) * size_t{t.h_->n_layers} * t.h_->n_experts);
  auto* q = static_cast<uint8_t*>(leases);
  t.sessions_ = reinterpret_cast<SessionEntry*>(q + sizeof(LeaseHeader));
  t.leases_ = reinterpret_cast<SlotLeases*>(q + sizeof(LeaseHeader) + sizeof(SessionEntry) * kSessions);
  t.uses_ = reinterpret_cast<std::atomic<uint32_t>*>(t.leases_ + lh->n_slots);
  return t;
}

std::optional<Lease> SlotTable::try_acquire(uint32_t session, uint32_t layer, uint32_t expert, uint64_t tick) {
  const int32_t id = static_cast<int32_t>(layer * h_->n_experts + expert);
  const uint32_t mapped = experts_[id].slot.load(std::memory_order_acquire);
  if (mapped == 0) return std::nullopt;
  const uint32_t slot = mapped - 1;
  SlotEntry& s = slots_[slot];
  std::atomic<uint32_t>& count = leases_[slot].count[session];
  count.fetch_add(1, std::memory_order_seq_cst);
  // Counted: the store cannot lock the slot from now on, unless it locked it before (seen here).
  const uint64_t gen = s.generation.load(std::memory_order_seq_cst);
  if (s.locked.load(std::memory_order_seq_cst) != 0 || (gen & 1) != 0 ||
      s.expert.load(std::memory_order_seq_cst) != id) {
    count.fetch_sub(1, std::memory_order_seq_cst);
    return std::nullopt;
  }
  leases_[slot].last_use.store(tick, std::memory_order_relaxed);
  uses_[id].fetch_add(1, std::memory_order_relaxed);
  return Lease{session, slot, gen};
}

void SlotTable::release(const Lease& lease) {
  leases_[lease.slot].count[lease.session].fetch_sub(1, std::memory_order_seq_cst);
}

bool SlotTable::leased(uint32_t slot) const {
  for (uint32_t i = 0; i < kSessions; ++i) {
    if (leases_[slot].count[i].load(std::memory_order_seq_cst) != 0) return true;
  }
  return false;
}

void SlotTable::set_eviction(double oldest_fraction, uint64_t seed) {
  oldest_fraction_ = std::clamp(oldest_fraction, 0.0, 1.0);
  rng_ = seed;
}

void SlotTable::set_least_frequent(uint64_t aging_ticks) {
  aging_ticks_ = aging_ticks;
  fresh_ticks_ = std::max<uint64_t>(64, aging_ticks / 64);
  next_aging_ = lh_->clock.load(std::memory_order_relaxed) + aging_ticks;
}

void SlotTable::age_uses() {
  const uint64_t now = lh_->clock.load(std::memory_order_relaxed);
  if (now < next_aging_) return;
  // A client's increment racing with the halving may be lost: a count is a heuristic.
  for (size_t i = 0; i < size_t{h_->n_layers} * h_->n_experts; ++i) {
    uses_[i].store(uses_[i].load(std::memory_order_relaxed) / 2, std::memory_order_relaxed);
  }
  next_aging_ = now + aging_ticks_;
}

uint64_t SlotTable::next_random() {  // splitmix64
  uint64_t z = (rng_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::optional<uint32_t> SlotTable::lock_victim(bool* evicted) {
  if (aging_ticks_ > 0) age_uses();
  const uint64_t now = lh_->clock.load(std::memory_order_relaxed);
  for (;;) {
    // Empty slots first, then by the eviction policy among the unleased slots.
    std::optional<uint32_t> best, best_fresh;
    uint64_t best_use = UINT64_MAX, best_fresh_use = UINT64_MAX;
    bool empty = false;
    candidates_.clear();
    for (uint32_t i = 0; i < h_->n_slots; ++i) {
      const SlotEntry& s = slots_[i];
      if (s.locked.load(std::memory_order_acquire) != 0 || leased(i)) continue;
      if (s.expert.load(std::memory_order_acquire) < 0) {
        best = i;
        empty = true;
        break;
      }
      const uint64_t use = std::max(leases_[i].last_use.load(std::memory_order_relaxed),
                                    s.loaded_tick.load(std::memory_order_relaxed));
      if (aging_ticks_ > 0) {  // least often leased first, then least recently
        const int32_t e = s.expert.load(std::memory_order_acquire);
        const uint64_t n = e >= 0 ? std::min<uint32_t>(uses_[e].load(std::memory_order_relaxed), (1u << 24) - 1) : 0;
        const uint64_t key = (n << 40) | std::min<uint64_t>(use, (1ull << 40) - 1);
        // A load not yet leased (its client is on the way; a new expert counts nothing yet)
        // goes only when nothing else can, for a while after it was loaded.
        const uint64_t loaded = s.loaded_tick.load(std::memory_order_relaxed);
        const bool fresh = loaded > leases_[i].last_use.load(std::memory_order_relaxed) && now < loaded + fresh_ticks_;
        uint64_t& b = fresh ? best_fresh_use : best_use;
        if (key < b) {
          b = key;
          (fresh ? best_fresh : best) = i;
        }
        continue;
      }
      if (use < best_use) {
        best_use = use;
        best = i;
      }
      if (oldest_fraction_ > 0) candidates_.push_back({use, i});
    }
    if (!best) best = best_fresh;
    if (!best) return std::nullopt;
    if (!empty && candidates_.size() > 1) {
      const size_t k = std::max<size_t>(1, static_cast<size_t>(std::ceil(oldest_fraction_ * candidates_.size())));
      std::nth_element(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(k - 1), candidates_.end());
      best = candidates_[next_random() % k].second;
    }
    SlotEntry& s = slots_[*best];
    uint32_t zero = 0;
    if (!s.locked.compare_exchange_strong(zero, 1, std::memory_order_seq_cst)) continue;
    if (leased(*best)) {  // a client leased it between the scan and the lock: choose again
      s.locked.store(0, std::memory_order_seq_cst);
      continue;
    }
    const int32_t old = s.expert.load(std::memory_order_acquire);
    if (old >= 0) experts_[old].slot.store(0, std::memory_order_release);
    if (evicted) *evicted = old >= 0;
    s.generation.fetch_add(1, std::memory_order_seq_cst);  // odd: refilling
    s.expert.store(-1, std::memory_order_seq_cst);
    return best;
  }
}

void SlotTable::publish(uint32_t slot, uint32_t layer, uint32_t expert, uint64_t tick) {
  SlotEntry& s = slots_[slot];
  const int32_t id = static_cast<int32_t>(layer * h_->n_experts + expert);
  s.expert.store(id, std::memory_order_seq_cst);
  s.loaded_tick.store(tick, std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_seq_cst);  // even: ready
  s.locked.store(0, std::memory_order_seq_cst);
  experts_[id].slot.store(slot + 1, std::memory_order_release);
}

void SlotTable::abandon(uint32_t slot) {
  SlotEntry& s = slots_[slot];
  s.generation.fetch_add(1, std::memory_order_seq_cst);
  s.locked.store(0, std::memory_order_seq_cst);
}

uint64_t SlotTable::clear_session(uint32_t session) {
  uint64_t dropped = 0;
  for (uint32_t s = 0; s < h_->n_slots; ++s) dropped += leases_[s].count[session].exchange(0, std::memory_order_seq_cst);
  sessions_[session].hits.store(0, std::memory_order_relaxed);
  return dropped;
}

uint32_t SlotTable::resident_slot(uint32_t layer, uint32_t expert) const {
  return experts_[layer * h_->n_experts + expert].slot.load(std::memory_order_acquire);
}

uint32_t SlotTable::leased_slots() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < h_->n_slots; ++i) n += leased(i) ? 1 : 0;
  return n;
}

uint64_t SlotTable::session_leases(uint32_t session) const {
  uint64_t n = 0;
  for (uint32_t s = 0; s < h_->n_slots; ++s) n += leases_[s].count[session].load(std::memory_order_relaxed);
  return n;
}

Status SlotTable::verify_integrity() const {
  const size_t n_ids = size_t{h_->n_layers} * h_->n_experts;
  std::vector<int> seen(h_->n_slots, -1);
  for (size_t id = 0; id < n_ids; ++id) {
    const uint32_t m = experts_[id].slot.load();
    if (m == 0) continue;
    if (m > h_->n_slots) return absl::InternalError(absl::StrCat("expert ", id, " maps to slot ", m - 1, " of ", h_->n_slots));
    if (seen[m - 1] >= 0) return absl::InternalError(absl::StrCat("slot ", m - 1, " is mapped by two experts"));
    seen[m - 1] = static_cast<int>(id);
    if (slots_[m - 1].expert.load() != static_cast<int32_t>(id)) {
      return absl::InternalError(absl::StrCat("expert ", id, " maps to slot ", m - 1, " which holds ", slots_[m - 1].expert.load()));
    }
  }
  for (uint32_t s = 0; s < h_->n_slots; ++s) {
    const uint64_t g = slots_[s].generation.load();
    if (slots_[s].locked.load() == 0 && (g & 1)) {
      return absl::InternalError(absl::StrCat("slot ", s, " is unlocked at odd generation ", g));
    }
    const int32_t e = slots_[s].expert.load();
    if (e >= 0 && seen[s] != e) return absl::InternalError(absl::StrCat("slot ", s, " holds expert ", e, " but is not mapped"));
    for (uint32_t i = 0; i < kSessions; ++i) {
      if (leases_[s].count[i].load() > (1u << 30)) {
        return absl::InternalError(absl::StrCat("slot ", s, " has an underflowed lease count for session ", i));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dsflash::expertstore
