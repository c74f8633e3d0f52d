#include "inference_svc/model/engram_rows.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace dsflash::model {

void prefetch_rows(const kernels::Weight& table, const int64_t* ids, int64_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (int64_t i = 0; i < n; ++i) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(table.data + static_cast<uint64_t>(ids[i]) * table.row_bytes);
    const uintptr_t first = begin & ~(page - 1), end = begin + table.row_bytes;
    // Advice only: a table that is not file-backed (or a kernel that declines) reads on copy.
    (void)::madvise(reinterpret_cast<void*>(first), end - first, MADV_WILLNEED);
  }
}

void copy_rows(const kernels::Weight& table, const int64_t* ids, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + static_cast<uint64_t>(i) * table.row_bytes,
                table.data + static_cast<uint64_t>(ids[i]) * table.row_bytes, table.row_bytes);
  }
}

}  // namespace dsflash::model
