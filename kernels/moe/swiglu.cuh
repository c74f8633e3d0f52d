// The clamped SwiGLU of one value (kernels::moe::swiglu on the CPU, the same operations in its
// order), shared by moe.cu's launch and the fused routed-expert FFN (linear/experts_ffn.cu).
#pragma once

#include "kernels/cuda/math.cuh"

namespace dsflash::kernels::moe {

// bf16(w x silu(g) x u), g and u clamped to limit first where limit > 0.
__device__ __forceinline__ float swiglu_value(float g, float u, float limit, float w) {
  if (limit > 0) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  return cuda::round_bf16(__fmul_rn(w, __fmul_rn(silu, u)));
}

}  // namespace dsflash::kernels::moe
