#include "expertstore_svc/arena.h"

#include <cstring>

namespace dsflash::expertstore {

StatusOr<std::unique_ptr<HostArena>> HostArena::create(uint64_t bytes) {
  auto a = std::make_unique<HostArena>();
  ASSIGN_OR_RETURN(a->region_, ipc::SharedRegion::create("dsflash-expert-arena", bytes));
  return a;
}

Status HostArena::copy_in(uint64_t offset, const uint8_t* src, size_t n) {
  if (offset + n > region_.size()) return absl::InternalError("copy past the end of the expert arena");
  std::memcpy(region_.data() + offset, src, n);
  return absl::OkStatus();
}

}  // namespace dsflash::expertstore
