// A small persistent thread pool for the CPU backend: parallel_for over [0, n) in contiguous
// chunks. One pool per process, sized to the available cores (DSF_THREADS overrides).
// Thread-safe: concurrent parallel_for calls are serialised.
#pragma once

#include <cstdint>
#include <functional>

namespace dsflash::kernels::cpu {

// Runs fn(begin, end) over disjoint chunks covering [0, n); returns when all are done.
// Work below `min_chunk` items runs inline on the caller.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);
// Threads the pool uses (>= 1).
int n_threads();

}  // namespace dsflash::kernels::cpu
