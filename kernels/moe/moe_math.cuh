// The MoE's per-value arithmetic on the device, shared by its own kernels (moe.cu) and the
// routed experts' GEMVs that finish a row tile with it (linear/gemv_mma.cu): one definition,
// so the fused and the separate forms round alike bit for bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/math.cuh"

namespace dsflash::kernels::moe {

// The clamped SwiGLU of one gate value g and up value u, times the route weight w, rounded to
// bf16 (moe::swiglu on the CPU): limit > 0 clamps u to [-limit, limit] and g from above.
__device__ __forceinline__ float swiglu_value(float g, float u, float limit, float w) {
  if (limit > 0) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  return cuda::round_bf16(__fmul_rn(w, __fmul_rn(silu, u)));
}

// The most routed outputs a token's sum takes with every row loaded at once.
constexpr int kCombineMaxK = 8;

// Each of K <= kCombineMaxK distinct expert ids' rank among them (0: the lowest).
struct RoutedOrder {
  int rank[kCombineMaxK];
  __device__ __forceinline__ RoutedOrder(const int32_t* __restrict__ e, int64_t K) {
    int32_t id[kCombineMaxK];
#pragma unroll
    for (int k = 0; k < kCombineMaxK; ++k) id[k] = k < K ? e[k] : 0;
#pragma unroll
    for (int k = 0; k < kCombineMaxK; ++k) {
      rank[k] = 0;
#pragma unroll
      for (int j = 0; j < kCombineMaxK; ++j) rank[k] += j < K && id[j] < id[k] ? 1 : 0;
    }
  }
  // v[k] (k < K: expert e[k]'s output) summed from 0.0f in ascending expert id, from constant
  // register indices.
  __device__ __forceinline__ float sum(const float (&v)[kCombineMaxK], int64_t K) const {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kCombineMaxK; ++r) {
      if (r >= K) break;
      float pick = 0.0f;
#pragma unroll
      for (int k = 0; k < kCombineMaxK; ++k) pick = k < K && rank[k] == r ? v[k] : pick;
      acc = __fadd_rn(acc, pick);
    }
    return acc;
  }
};

// A decode token's MoE output at one value: its K routed outputs y[k * stride] (k < K), summed
// in ascending expert id, plus the shared expert's sh, rounded to bf16. The loads go through
// L2 (__ldcg): the routed outputs may have been written by other CTAs of the running kernel.
__device__ __forceinline__ float routed_output(const RoutedOrder& order, const float* __restrict__ y, int64_t stride,
                                               int64_t K, float sh) {
  float v[kCombineMaxK];
#pragma unroll
  for (int k = 0; k < kCombineMaxK; ++k) v[k] = k < K ? __ldcg(y + k * stride) : 0.0f;
  return cuda::round_bf16(__fadd_rn(order.sum(v, K), sh));
}

}  // namespace dsflash::kernels::moe
