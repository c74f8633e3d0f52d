// model::ExpertSource over an in-process Store: the forward pass computes with pointers into
// the store's arena and holds a lease on each expert between acquire() and release().
// (The cross-process client follows the same pattern over the shared slot table.)
#pragma once

#include <map>
#include <mutex>

#include "expertstore_svc/store.h"
#include "inference_svc/model/model.h"

namespace dsflash::expertstore {

class LocalStoreSource final : public model::ExpertSource {
 public:
  explicit LocalStoreSource(Store& store) : store_(store) {}
  StatusOr<model::ExpertWeights> acquire(int layer, int expert) override;
  void release(int layer, int expert) override;
  const uint8_t* arena_base() const override { return nullptr; }  // hands out views, not slots
  size_t held() const;

 private:
  Store& store_;
  mutable std::mutex mu_;
  std::multimap<std::pair<int, int>, Lease> leases_;
};

}  // namespace dsflash::expertstore
