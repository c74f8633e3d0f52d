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
#include "kernels/linear/linear.h"

namespace dsflash::expertstore {

class Arena {
 public:
  virtual ~Arena() = default;
  virtual std::string mechanism() const = 0;  // "memfd", "cuda-vmm-fd", "cuda-ipc"
  virtual uint64_t bytes() const = 0;
  virtual int fd() const = 0;                   // shareable fd, or -1
  virtual std::string ipc_handle() const { return {}; }  // cudaIpcMemHandle_t bytes ("cuda-ipc")
  virtual uint8_t* host_data() const = 0;       // null for device memory
  virtual uint8_t* device_data() const { return nullptr; }
  // Copies n bytes into the arena at `offset`; returns when the bytes are in place.
  virtual Status copy_in(uint64_t offset, const uint8_t* src, size_t n) = 0;
  // Copies w's rows (host memory, GGUF order) into the arena at `offset` in the device tile
  // order (kernels::to_tiles_cuda); returns when they are in place. Device arenas only.
  virtual Status copy_in_tiles(uint64_t offset, const kernels::Weight& w);
  // Page-locks a staging buffer for copies into this arena (mlock for host memory, CUDA
  // host registration for device memory); unpin undoes it.
  virtual Status pin(void* p, size_t n);
  virtual void unpin(void* p, size_t n);
};

// A device arena (CUDA builds with a GPU): `mechanism` "auto" probes for VMM with POSIX-fd
// handles (2 MiB granularity) and falls back to legacy cudaIpcMemHandle_t; "cuda-vmm-fd" or
// "cuda-ipc" forces one. `report` gets a line saying what was chosen and why.
StatusOr<std::unique_ptr<Arena>> create_device_arena(uint64_t bytes, int device, const std::string& mechanism,
                                                     std::string* report);

// The client side of a device arena: another process's arena mapped into this one.
class DeviceArenaMapping {
 public:
  // "cuda-vmm-fd": imports `fd` (ownership taken). "cuda-ipc": opens `handle`.
  static StatusOr<std::unique_ptr<DeviceArenaMapping>> import(const std::string& mechanism, int fd,
                                                              const std::string& handle, uint64_t bytes, int device);
  ~DeviceArenaMapping();
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  DeviceArenaMapping() = default;
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  // The mapping's CUDA state, which only a build with CUDA reads.
  [[maybe_unused]] uint64_t mapped_ = 0;
  [[maybe_unused]] unsigned long long handle_ = 0;
  [[maybe_unused]] bool ipc_ = false;
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
