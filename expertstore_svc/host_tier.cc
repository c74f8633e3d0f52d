// HostTier (see host_tier.h).
#include "expertstore_svc/host_tier.h"

#include <sys/mman.h>

#include "absl/strings/str_cat.h"

namespace dsflash::expertstore {
namespace {
int64_t key_of(uint32_t layer, uint32_t expert) { return static_cast<int64_t>(uint64_t{layer} << 32 | expert); }
}  // namespace

StatusOr<std::unique_ptr<HostTier>> HostTier::create(uint64_t bytes, uint64_t slot_bytes, Arena* pin_for) {
  const uint64_t n = slot_bytes == 0 ? 0 : bytes / slot_bytes;
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat("a host cache of ", bytes, " bytes holds no expert of ", slot_bytes,
                                                   " bytes"));
  }
  std::unique_ptr<HostTier> t(new HostTier());
  t->bytes_ = n * slot_bytes;
  t->slot_bytes_ = slot_bytes;
  void* p = ::mmap(nullptr, t->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot reserve a host cache of ", t->bytes_, " bytes"));
  }
  t->base_ = static_cast<uint8_t*>(p);
  if (pin_for != nullptr) {
    const Status s = pin_for->pin(t->base_, t->bytes_);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("page-locking a host cache of ", t->bytes_, " bytes: ", s.message()));
    }
    t->pinned_for_ = pin_for;
  }
  t->entries_.resize(static_cast<size_t>(n));
  return t;
}

HostTier::~HostTier() {
  if (base_ == nullptr) return;
  if (pinned_for_ != nullptr) pinned_for_->unpin(base_, bytes_);
  ::munmap(base_, bytes_);
}

HostTier::Handle HostTier::find(uint32_t layer, uint32_t expert) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = index_.find(key_of(layer, expert));
  if (it == index_.end()) return {};
  Entry& e = entries_[it->second];
  ++e.users;
  e.last_use = ++clock_;
  ++hits_;
  return Handle{it->second, base_ + uint64_t{it->second} * slot_bytes_, false};
}

HostTier::Handle HostTier::take_for(uint32_t layer, uint32_t expert) {
  std::lock_guard<std::mutex> l(mu_);
  if (index_.count(key_of(layer, expert)) != 0) return {};  // another load filled it meanwhile
  uint32_t best = UINT32_MAX;
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.users != 0) continue;
    if (e.key < 0) {
      best = i;
      break;
    }
    if (best == UINT32_MAX || e.last_use < entries_[best].last_use) best = i;
  }
  if (best == UINT32_MAX) return {};
  Entry& e = entries_[best];
  if (e.key >= 0) index_.erase(e.key);
  e.key = key_of(layer, expert);
  e.users = 1;
  e.last_use = ++clock_;
  return Handle{best, base_ + uint64_t{best} * slot_bytes_, true};
}

void HostTier::release(const Handle& h, bool filled) {
  if (!h) return;
  std::lock_guard<std::mutex> l(mu_);
  Entry& e = entries_[h.entry];
  --e.users;
  if (!h.fill) return;
  if (filled) {
    index_[e.key] = h.entry;
  } else {
    e.key = -1;
  }
}

uint64_t HostTier::hits() const {
  std::lock_guard<std::mutex> l(mu_);
  return hits_;
}

}  // namespace dsflash::expertstore
