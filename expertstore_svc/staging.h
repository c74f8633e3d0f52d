// The staging path from disk to arena slots: a ring of page-locked, 4 KiB-aligned buffers
// and a slice reader that fills them with O_DIRECT reads where the file system allows it
// (falling back to buffered pread, reported, where it does not) and drops the page cache
// behind itself with posix_fadvise(DONTNEED). Pinning failure is an error, not a fallback.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/status.h"
#include "expertstore_svc/arena.h"

namespace dsflash::expertstore {

inline constexpr uint64_t kDirectAlign = 4096;

class StagingRing {
 public:
  // n buffers of `bytes` each (rounded up to 4 KiB), page-locked for copies into `pin_for`
  // (mlock for a host arena, CUDA host registration for a device arena) unless it is null.
  static StatusOr<std::unique_ptr<StagingRing>> create(size_t n, size_t bytes, Arena* pin_for);
  ~StagingRing();
  uint8_t* take();  // blocks until a buffer is free
  void give(uint8_t* buffer);
  size_t in_use() const;
  size_t size() const { return buffers_.size(); }
  size_t buffer_bytes() const { return bytes_; }
  bool pinned() const { return pin_for_ != nullptr; }

 private:
  StagingRing() = default;
  std::vector<uint8_t*> buffers_;
  std::vector<uint8_t*> free_;
  size_t bytes_ = 0;
  Arena* pin_for_ = nullptr;
  size_t pinned_count_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

// Reads byte ranges of a model's shards into staging buffers.
class SliceReader {
 public:
  // Opens a second descriptor per shard with O_DIRECT when `direct` and supported.
  static StatusOr<std::unique_ptr<SliceReader>> open(const gguf::Model& model, bool direct);
  ~SliceReader();
  // Reads [offset, offset + bytes) of `shard` into `buffer` (buffer_bytes long, 4 KiB
  // aligned); *data points at the first requested byte inside the buffer.
  Status read(uint32_t shard, uint64_t offset, uint64_t bytes, uint8_t* buffer, size_t buffer_bytes,
              const uint8_t** data) const;
  bool direct() const { return direct_; }
  // Staging bytes needed for a slice of `bytes` (alignment slack on both ends).
  static size_t staging_bytes(uint64_t bytes) { return (bytes + 2 * kDirectAlign + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

 private:
  SliceReader() = default;
  const gguf::Model* model_ = nullptr;
  std::vector<int> direct_fds_;  // -1 where O_DIRECT is unavailable
  bool direct_ = false;
};

}  // namespace dsflash::expertstore
