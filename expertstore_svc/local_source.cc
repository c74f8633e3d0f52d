#include "expertstore_svc/local_source.h"

namespace dsflash::expertstore {
namespace {

kernels::Weight view(const uint8_t* slot, const Slice& s, int64_t cols) {
  kernels::Weight w;
  w.type = s.type;
  w.cols = cols;
  w.row_bytes = *quant::row_bytes(s.type, static_cast<uint64_t>(cols));
  w.rows = static_cast<int64_t>(s.bytes / w.row_bytes);
  w.data = slot + s.slot_offset;
  return w;
}

}  // namespace

StatusOr<model::ExpertWeights> LocalStoreSource::acquire(int layer, int expert) {
  if (layer < 0 || expert < 0) return absl::OutOfRangeError("negative layer or expert");
  ASSIGN_OR_RETURN(const ExpertSlices sl, store_.slices().at(static_cast<uint32_t>(layer), static_cast<uint32_t>(expert)));
  ASSIGN_OR_RETURN(const Lease lease, store_.acquire(Store::kLocal, static_cast<uint32_t>(layer), static_cast<uint32_t>(expert)));
  {
    std::lock_guard<std::mutex> l(mu_);
    leases_.emplace(std::make_pair(layer, expert), lease);
  }
  const uint8_t* slot = store_.arena().host_data() + uint64_t{lease.slot} * store_.slices().slot_bytes();
  const int64_t D = store_.config().n_embd, F = store_.config().expert_ffn;
  return model::ExpertWeights{view(slot, sl.gate, D), view(slot, sl.up, D), view(slot, sl.down, F)};
}

void LocalStoreSource::release(int layer, int expert) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = leases_.find(std::make_pair(layer, expert));
  if (it == leases_.end()) return;
  (void)store_.release(it->second);
  leases_.erase(it);
}

size_t LocalStoreSource::held() const {
  std::lock_guard<std::mutex> l(mu_);
  return leases_.size();
}

}  // namespace dsflash::expertstore
