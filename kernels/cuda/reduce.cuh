// Block-wide reductions shared by the kernels.
#pragma once

#include <cooperative_groups.h>

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

// block_sum over a thread block cluster of kCtas CTAs that together hold kThreads threads, vt
// = rank * (kThreads / kCtas) + threadIdx.x: the same warp sums and the same reduction of them
// as block_sum over one block of kThreads, so the same result bit for bit. Every thread of the
// cluster calls it; every thread gets the result.
template <int kThreads, int kCtas>
__device__ float cluster_sum(float v, int vt) {
  static_assert(kThreads / 32 <= 32 && kThreads % (32 * kCtas) == 0);
  __shared__ float part[kThreads / 32];  // rank 0's holds every warp's sum
  __shared__ float total;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  float* part0 = cluster.map_shared_rank(part, 0);
  if ((threadIdx.x & 31) == 0) part0[vt >> 5] = v;
  cluster.sync();
  if (threadIdx.x < 32) {
    float x = threadIdx.x < kThreads / 32 ? part0[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (threadIdx.x == 0) total = x;
  }
  cluster.sync();  // rank 0's part is read by every CTA before any leaves; total is visible
  return total;
}

// cluster_sum of kN values at once (v[i] becomes its sum over the cluster): two cluster
// barriers for all kN, each value's tree as cluster_sum's.
template <int kThreads, int kCtas, int kN>
__device__ void cluster_sums(float (&v)[kN], int vt) {
  static_assert(kThreads / 32 <= 32 && kThreads % (32 * kCtas) == 0 && kN <= kThreads / kCtas);
  __shared__ float part[kN][kThreads / 32];  // rank 0's holds every warp's sums
  __shared__ float total[kN];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  float(*part0)[kThreads / 32] = cluster.map_shared_rank(part, 0);
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    for (int o = 16; o > 0; o >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
    if ((threadIdx.x & 31) == 0) part0[i][vt >> 5] = v[i];
  }
  cluster.sync();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = w; i < kN; i += kThreads / kCtas / 32) {  // rank 0's values, a warp a value
    float x = lane < kThreads / 32 ? part0[i][lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (lane == 0) total[i] = x;
  }
  cluster.sync();  // rank 0's parts are read by every CTA before any leaves; total is visible
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = total[i];
}

}  // namespace dsflash::kernels::cuda
