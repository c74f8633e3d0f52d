// Raw O_DIRECT reads of expert slices, the disk's rate for the benchmarks to compare with
// (bench/expertstore_bench.cc, bench/expert_stream_bench.cc).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "common/status.h"
#include "expertstore_svc/staging.h"

namespace dsflash::bench {

struct SliceRef {
  uint32_t shard;
  uint64_t offset, bytes;
};

// Raw O_DIRECT pread of every slice with `threads` threads: bytes/s.
inline StatusOr<double> raw_pread_rate(const gguf::Model& m, const std::vector<SliceRef>& slices, int threads) {
  std::vector<int> fds;
  for (size_t i = 0; i < m.n_shards(); ++i) {
    const int fd = ::open(m.shard(i).path().c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("O_DIRECT open of ", m.shard(i).path(), " failed"));
    fds.push_back(fd);
  }
  uint64_t max_bytes = 0, total = 0;
  for (const auto& s : slices) max_bytes = std::max(max_bytes, s.bytes), total += s.bytes;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      const size_t cap = expertstore::SliceReader::staging_bytes(max_bytes);
      void* buf = nullptr;
      if (posix_memalign(&buf, 4096, cap) != 0) return failed.store(true);
      for (size_t i; (i = next++) < slices.size();) {
        const SliceRef& s = slices[i];
        const uint64_t a = s.offset / 4096 * 4096, e = (s.offset + s.bytes + 4095) / 4096 * 4096;
        for (uint64_t done = 0; a + done < s.offset + s.bytes;) {
          const ssize_t n = ::pread(fds[s.shard], static_cast<uint8_t*>(buf) + done, e - a - done, static_cast<off_t>(a + done));
          if (n <= 0) {
            failed = true;
            break;
          }
          done += static_cast<uint64_t>(n);
        }
      }
      std::free(buf);
    });
  }
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int fd : fds) ::close(fd);
  if (failed) return absl::DataLossError("raw pread failed");
  return static_cast<double>(total) / s;
}

}  // namespace dsflash::bench
