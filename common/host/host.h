// The host's memory as the kernel reports it, and byte sizes as command lines write them.
// On GB10 the GPU's allocations come out of the same LPDDR5X as the CPU's, and cudaMemGetInfo
// misleads there (spec/serving.md §6.6): /proc/meminfo's MemAvailable is the figure to watch.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"

namespace dsflash::host {

struct MemInfo {
  uint64_t total = 0;      // MemTotal, bytes
  uint64_t available = 0;  // MemAvailable, bytes
};

// Parses /proc/meminfo's text ("MemTotal:  131072000 kB" lines); DATA_LOSS names a missing or
// malformed field.
StatusOr<MemInfo> parse_meminfo(absl::string_view text);
// Reads and parses `path` (default /proc/meminfo).
StatusOr<MemInfo> read_meminfo(const std::string& path = "/proc/meminfo");

// "4G", "512M", "1.5T", "100000" (bytes; K, M, G, T are powers of 1024) -> bytes; false when
// `v` is not such a size or is not positive.
bool parse_size(const std::string& v, uint64_t* out);

}  // namespace dsflash::host
