// The router's top-k of one token on one warp (device code shared by moe.cu's route_kernel and
// the routed experts' gate/up GEMV that routes for itself, gemv_mma.cu).
#pragma once

#include <cstdint>

#include "kernels/moe/moe_cuda.h"

namespace dsflash::kernels::moe {

// Token t of route(): sqrt-softplus scores and biased scores in score / biased ([E], shared
// memory of the calling warp, with taken [E]), then k rounds of a warp arg-max (ties towards
// the lower index) over the experts not yet chosen; experts et[k] and weights wt[k] (lane 0
// writes them). Every lane of the warp calls it.
__device__ __forceinline__ void route_warp(const float* __restrict__ logits_t, const float* __restrict__ bias,
                                           int64_t E, int64_t k, bool norm_topk, float route_scale, float* score,
                                           float* biased, uint8_t* taken, int32_t* et, float* wt) {
  const int lane = threadIdx.x & 31;
  for (int64_t e = lane; e < E; e += 32) {
    const float z = logits_t[e];
    const float sp = z > 20.0f ? z : log1pf(expf(z));
    score[e] = sqrtf(sp);
    biased[e] = __fadd_rn(score[e], bias[e]);
    taken[e] = 0;
  }
  __syncwarp();
  for (int64_t r = 0; r < k; ++r) {
    float best = -INFINITY;
    int32_t arg = -1;
    for (int64_t e = lane; e < E; e += 32) {
      if (!taken[e] && (arg < 0 || biased[e] > best)) {
        best = biased[e];
        arg = static_cast<int32_t>(e);
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int32_t oa = __shfl_xor_sync(0xffffffffu, arg, off);
      if (oa >= 0 && (arg < 0 || ob > best || (ob == best && oa < arg))) {
        best = ob;
        arg = oa;
      }
    }
    if (lane == 0) {
      et[r] = arg;
      taken[arg] = 1;
    }
    __syncwarp();
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int64_t r = 0; r < k; ++r) sum = __fadd_rn(sum, score[et[r]]);
    for (int64_t r = 0; r < k; ++r) {
      float w = score[et[r]];
      if (norm_topk && k > 1) w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
      wt[r] = __fmul_rn(w, route_scale);
    }
  }
  __syncwarp();
}

}  // namespace dsflash::kernels::moe
