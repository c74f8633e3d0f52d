// Helpers of the standalone CUDA benchmarks (icache_bench, chain_bench): CUDA errors end the
// program with the call named, a spin queued before a timed launch, medians.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call) bench::check((call), #call)

namespace bench {

inline void check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, call, cudaGetErrorString(e));
  std::exit(1);
}

// Spins `cycles` clocks on one thread: queued before a timed launch, so that the launch is on
// the GPU's queue when its start event fires and the time is the GPU's work, not the host's
// launch latency (~20 us at 40,000 cycles).
__global__ void delay_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
