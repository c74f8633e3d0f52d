// The expert arena: n_slots fixed-size slots in memory that both processes can reach.
// Host arena: a memfd region (the CPU backend; the fd travels over SCM_RIGHTS). Device arena
// (CUDA builds, issue 7): device memory from the VMM API with a POSIX-fd handle, or a legacy
// cudaIpcMemHandle_t. copy_in() is the last stage of a load (memcpy, or H2D on a stream).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/ipc/shm.h"
#include "common/status.h"

namespace dsflash::expertstore {

class Arena {
 public:
  virtual ~Arena() = default;
  virtual std::string mechanism() const = 0;  // "memfd", "cuda-vmm-fd", "cuda-ipc"
  virtual uint64_t bytes() const = 0;
  virtual int fd() const = 0;                   // shareable fd, or -1
  virtual uint8_t* host_data() const = 0;       // null for device memory
  // Copies n bytes into the arena at `offset`; returns when the bytes are in place.
  virtual Status copy_in(uint64_t offset, const uint8_t* src, size_t n) = 0;
};

class HostArena final : public Arena {
 public:
  static StatusOr<std::unique_ptr<HostArena>> create(uint64_t bytes);
  std::string mechanism() const override { return "memfd"; }
  uint64_t bytes() const override { return region_.size(); }
  int fd() const override { return region_.fd(); }
  uint8_t* host_data() const override { return region_.data(); }
  Status copy_in(uint64_t offset, const uint8_t* src, size_t n) override;

 private:
  ipc::SharedRegion region_;
};

}  // namespace dsflash::expertstore
