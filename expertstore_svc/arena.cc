#include "expertstore_svc/arena.h"

#include <unistd.h>

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dsflash::expertstore {

StatusOr<std::unique_ptr<HostArena>> HostArena::create(uint64_t bytes) {
  auto a = std::make_unique<HostArena>();
  ASSIGN_OR_RETURN(a->region_, ipc::SharedRegion::create("dsflash-expert-arena", bytes));
  // Touch every page once at start-up so that no load pays a first-write fault (on some
  // virtual machines the first write to a page costs more than reading it from disk).
  std::memset(a->region_.data(), 0, bytes);
  return a;
}

Status Arena::copy_in_tiles(uint64_t, const kernels::Weight&) {
  return absl::FailedPreconditionError(absl::StrCat("the ", mechanism(), " arena keeps experts in the GGUF order only"));
}

Status HostArena::copy_in(uint64_t offset, const uint8_t* src, size_t n) {
  if (offset + n > region_.size()) return absl::InternalError("copy past the end of the expert arena");
  std::memcpy(region_.data() + offset, src, n);
  return absl::OkStatus();
}

Status Arena::pin(void* p, size_t n) {
  if (::mlock(p, n) == 0) return absl::OkStatus();
  const int err = errno;
  rlimit lim{};
  ::getrlimit(RLIMIT_MEMLOCK, &lim);
  return absl::ResourceExhaustedError(absl::StrCat(
      "mlock of ", n / 1024, " KiB: ", std::strerror(err), "; RLIMIT_MEMLOCK is ",
      lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(lim.rlim_cur / 1024, " KiB")));
}

void Arena::unpin(void* p, size_t n) { ::munlock(p, n); }

#ifndef DSF_HAVE_CUDA
StatusOr<std::unique_ptr<Arena>> create_device_arena(uint64_t, int, const std::string&, std::string*) {
  return absl::UnimplementedError("this build has no CUDA support: use --arena host");
}

StatusOr<std::unique_ptr<DeviceArenaMapping>> DeviceArenaMapping::import(const std::string& mechanism, int fd,
                                                                         const std::string&, uint64_t, int) {
  if (fd >= 0) ::close(fd);
  return absl::UnimplementedError(absl::StrCat("this build has no CUDA support to map a ", mechanism, " arena"));
}

DeviceArenaMapping::~DeviceArenaMapping() = default;
#endif

}  // namespace dsflash::expertstore
