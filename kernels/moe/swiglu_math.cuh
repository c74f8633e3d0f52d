// The SwiGLU of one value (kernels/moe swiglu's arithmetic on the device), shared by
// swiglu_kernel and the expert down GEMV that forms its input from gate and up (gemv_mma.cu):
// bf16(w * (silu(g) * u)), g and u clamped to the limit when it is positive.
#pragma once

#include "kernels/cuda/math.cuh"

namespace dsflash::kernels::moe::detail {

__device__ __forceinline__ float swiglu_value(float g, float u, float limit, float w) {
  if (limit > 0) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  return cuda::round_bf16(__fmul_rn(w, __fmul_rn(silu, u)));
}

}  // namespace dsflash::kernels::moe::detail
