#include "expertstore_svc/arena.h"

#include <cstring>

namespace dsflash::expertstore {

StatusOr<std::unique_ptr<HostArena>> HostArena::create(uint64_t bytes) {
  auto a = std::make_unique<HostArena>();
  ASSIGN_OR_RETURN(a->region_, ipc::SharedRegion::create("dsflash-expert-arena", bytes));
  // Touch every page once at start-up so that no load pays a first-write fault (on some
  // virtual machines the first write to a page costs more than reading it from disk).
  std::memset(a->region_.data(), 0, bytes);
  return a;
}

Status HostArena::copy_in(uint64_t offset, const uint8_t* src, size_t n) {
  if (offset + n > region_.size()) return absl::InternalError("copy past the end of the expert arena");
  std::memcpy(region_.data() + offset, src, n);
  return absl::OkStatus();
}

}  // namespace dsflash::expertstore
