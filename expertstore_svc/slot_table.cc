// Slot table operations (see slot_table.h for the protocol).
#include "expertstore_svc/slot_table.h"

#include <cstring>
#include <vector>
#include <new>

#include "absl/strings/str_cat.h"

namespace dsflash::expertstore {

size_t SlotTable::bytes(uint32_t n_layers, uint32_t n_experts, uint32_t n_slots) {
  return sizeof(SlotTableHeader) + sizeof(ExpertEntry) * static_cast<size_t>(n_layers) * n_experts +
         sizeof(SlotEntry) * static_cast<size_t>(n_slots);
}

SlotTable SlotTable::create(void* mem, uint32_t n_layers, uint32_t n_experts, uint32_t n_slots, uint64_t slot_bytes) {
  SlotTable t;
  auto* p = static_cast<uint8_t*>(mem);
  t.h_ = new (p) SlotTableHeader{kSlotTableMagic, 1, n_layers, n_experts, n_slots, slot_bytes};
  t.experts_ = reinterpret_cast<ExpertEntry*>(p + sizeof(SlotTableHeader));
  t.slots_ = reinterpret_cast<SlotEntry*>(p + sizeof(SlotTableHeader) + sizeof(ExpertEntry) * size_t{n_layers} * n_experts);
  for (size_t i = 0; i < size_t{n_layers} * n_experts; ++i) new (&t.experts_[i]) ExpertEntry{};
  for (uint32_t s = 0; s < n_slots; ++s) {
    SlotEntry* e = new (&t.slots_[s]) SlotEntry{};
    e->expert.store(-1);
  }
  return t;
}

StatusOr<SlotTable> SlotTable::attach(void* mem, size_t size) {
  if (size < sizeof(SlotTableHeader)) return absl::InvalidArgumentError("slot table region too small for its header");
  SlotTable t;
  auto* p = static_cast<uint8_t*>(mem);
  t.h_ = reinterpret_cast<SlotTableHeader*>(p);
  if (t.h_->magic != kSlotTableMagic || t.h_->version != 1) {
    return absl::InvalidArgumentError("slot table region has a bad magic or version");
  }
  if (bytes(t.h_->n_layers, t.h_->n_experts, t.h_->n_slots) > size) {
    return absl::InvalidArgumentError(absl::StrCat("slot table geometry (", t.h_->n_layers, " layers x ", t.h_->n_experts,
                                                   " experts, ", t.h_->n_slots, " slots) exceeds the ", size, "-byte region"));
  }
  t.experts_ = reinterpret_cast<ExpertEntry*>(p + sizeof(SlotTableHeader));
  t.slots_ = reinterpret_cast<SlotEntry*>(p + sizeof(SlotTableHeader) +
                                          sizeof(ExpertEntry) * size_t{t.h_->n_layers} * t.h_->n_experts);
  return t;
}

std::optional<Lease> SlotTable::try_acquire(uint32_t layer, uint32_t expert, uint64_t tick) {
  const int32_t id = static_cast<int32_t>(layer * h_->n_experts + expert);
  const uint32_t mapped = experts_[id].slot.load(std::memory_order_acquire);
  if (mapped == 0) return std::nullopt;
  SlotEntry& s = slots_[mapped - 1];
  uint32_t n = s.leases.load(std::memory_order_acquire);
  do {
    if (n & kLocked) return std::nullopt;  // being refilled
  } while (!s.leases.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel));
  // Leased: the slot cannot be refilled now. Confirm it still holds this expert, ready.
  const uint64_t gen = s.generation.load(std::memory_order_acquire);
  if ((gen & 1) != 0 || s.expert.load(std::memory_order_acquire) != id) {
    s.leases.fetch_sub(1, std::memory_order_acq_rel);
    return std::nullopt;
  }
  s.last_use.store(tick, std::memory_order_relaxed);
  return Lease{mapped - 1, gen};
}

void SlotTable::release(const Lease& lease) { slots_[lease.slot].leases.fetch_sub(1, std::memory_order_acq_rel); }

std::optional<uint32_t> SlotTable::lock_victim() {
  // Empty slots first, then the unleased slot with the oldest use.
  std::optional<uint32_t> best;
  uint64_t best_use = UINT64_MAX;
  for (uint32_t i = 0; i < h_->n_slots; ++i) {
    SlotEntry& s = slots_[i];
    if (s.leases.load(std::memory_order_acquire) != 0) continue;
    const bool empty = s.expert.load(std::memory_order_acquire) < 0;
    const uint64_t use = empty ? 0 : s.last_use.load(std::memory_order_relaxed) + 1;
    if (use < best_use) {
      best_use = use;
      best = i;
      if (empty) break;
    }
  }
  if (!best) return std::nullopt;
  SlotEntry& s = slots_[*best];
  uint32_t zero = 0;
  if (!s.leases.compare_exchange_strong(zero, kLocked, std::memory_order_acq_rel)) {
    return lock_victim();  // a client leased it meanwhile: choose again
  }
  const int32_t old = s.expert.load(std::memory_order_acquire);
  if (old >= 0) experts_[old].slot.store(0, std::memory_order_release);
  s.generation.fetch_add(1, std::memory_order_acq_rel);  // odd: refilling
  s.expert.store(-1, std::memory_order_release);
  return best;
}

void SlotTable::publish(uint32_t slot, uint32_t layer, uint32_t expert, uint64_t tick) {
  SlotEntry& s = slots_[slot];
  const int32_t id = static_cast<int32_t>(layer * h_->n_experts + expert);
  s.expert.store(id, std::memory_order_release);
  s.last_use.store(tick, std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_acq_rel);  // even: ready
  s.leases.store(0, std::memory_order_release);          // unlock
  experts_[id].slot.store(slot + 1, std::memory_order_release);
}

void SlotTable::abandon(uint32_t slot) {
  SlotEntry& s = slots_[slot];
  s.generation.fetch_add(1, std::memory_order_acq_rel);
  s.leases.store(0, std::memory_order_release);
}

uint32_t SlotTable::resident_slot(uint32_t layer, uint32_t expert) const {
  return experts_[layer * h_->n_experts + expert].slot.load(std::memory_order_acquire);
}

uint32_t SlotTable::leased_slots() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < h_->n_slots; ++i) {
    const uint32_t l = slots_[i].leases.load(std::memory_order_acquire);
    n += (l != 0 && !(l & kLocked)) ? 1 : 0;
  }
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
    const uint32_t l = slots_[s].leases.load();
    const uint64_t g = slots_[s].generation.load();
    if (!(l & kLocked) && (g & 1)) return absl::InternalError(absl::StrCat("slot ", s, " is unlocked at odd generation ", g));
    const int32_t e = slots_[s].expert.load();
    if (e >= 0 && seen[s] != e) return absl::InternalError(absl::StrCat("slot ", s, " holds expert ", e, " but is not mapped"));
  }
  return absl::OkStatus();
}

}  // namespace dsflash::expertstore
