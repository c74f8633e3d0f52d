// Block-wide reductions shared by the kernels.
#pragma once

namespace dsflash::kernels::cuda {

// Sum of v over a block of kThreads threads (a multiple of 32, at most 1024): warp shuffles,
// then the warp sums by the first warp. Every thread gets the result; `part` is shared memory
// of kThreads / 32 floats, free again on return (the call may be repeated).
template <int kThreads>
__device__ float block_sum(float v, float* part) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float x = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (threadIdx.x == 0) part[0] = x;
  }
  __syncthreads();
  const float r = part[0];
  __syncthreads();
  return r;
}

}  // namespace dsflash::kernels::cuda
