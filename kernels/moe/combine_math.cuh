// A decode token's MoE output on the CUDA backend (moe.cu's combine_routed_kernel, and hc.cu's
// post joined to the next norm, which adds it up where it reads it): one definition of a value.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dsflash::kernels::moe::detail {

// Value d of token t: its K routed rows of y (row t K + k: expert e_t[k]'s output, ids distinct)
// summed in ascending expert id from 0.0f, then the shared expert's value, rounded to bf16.
__device__ __forceinline__ float combine_routed_value(const float* __restrict__ y, const int32_t* __restrict__ e_t,
                                                      int64_t K, int64_t D, int64_t t, int64_t d, float shared) {
  float acc = 0.0f;
  int32_t prev = -1;
  for (int64_t n = 0; n < K; ++n) {  // the next larger expert id each time
    int64_t best = -1;
    for (int64_t k = 0; k < K; ++k) {
      if (e_t[k] > prev && (best < 0 || e_t[k] < e_t[best])) best = k;
    }
    acc = __fadd_rn(acc, y[(t * K + best) * D + d]);
    prev = e_t[best];
  }
  return __bfloat162float(__float2bfloat16_rn(__fadd_rn(acc, shared)));
}

// The same value with the order found once for all of a token's values: kMaxRouted experts at
// most. order[n] = the position in e_t of its n-th smallest id (routed_order), then the K rows'
// values loaded together and summed in that order (routed_sum): combine_routed_value's sum.
constexpr int kMaxRouted = 8;

__device__ __forceinline__ void routed_order(const int32_t* __restrict__ e_t, int K, int (&order)[kMaxRouted]) {
  int32_t id[kMaxRouted];
#pragma unroll
  for (int k = 0; k < kMaxRouted; ++k) id[k] = k < K ? e_t[k] : 0;
#pragma unroll
  for (int n = 0; n < kMaxRouted; ++n) order[n] = 0;
#pragma unroll
  for (int k = 0; k < kMaxRouted; ++k) {  // id k's rank: how many of the (distinct) ids are smaller
    int rank = 0;
#pragma unroll
    for (int m = 0; m < kMaxRouted; ++m) rank += m < K && id[m] < id[k];
#pragma unroll
    for (int n = 0; n < kMaxRouted; ++n) {
      if (k < K && rank == n) order[n] = k;
    }
  }
}

__device__ __forceinline__ float routed_sum(const float* __restrict__ y, const int* order, int K,
                                            int64_t D, int64_t t, int64_t d, float shared) {
  float v[kMaxRouted];
#pragma unroll
  for (int n = 0; n < kMaxRouted; ++n) v[n] = n < K ? y[(t * K + order[n]) * D + d] : 0.0f;
  float acc = 0.0f;
#pragma unroll
  for (int n = 0; n < kMaxRouted; ++n) {
    if (n < K) acc = __fadd_rn(acc, v[n]);
  }
  return __bfloat162float(__float2bfloat16_rn(__fadd_rn(acc, shared)));
}

}  // namespace dsflash::kernels::moe::detail
