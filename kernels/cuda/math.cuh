// Device scalar helpers shared by the kernels: the bf16 rounding point, SwiGLU, warp sums and the
// order-preserving key of a float (for radix selection).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dsflash::kernels::cuda {

// bf16(x) as a float, round to nearest even (quant::round_bf16 on the host).
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// SwiGLU of one gate value g and up value u as kernels::moe::swiglu computes it (moe_ref.cc),
// one IEEE fp32 operation at a time: where limit > 0 the gate clamped above and the up to
// [-limit, limit]; silu(g) u scaled by w, rounded to bf16. The SwiGLU launch and the expert GEMV
// that forms its input as it reads it (gemv_mma.cu) both use it, so they agree bit for bit.
__device__ __forceinline__ float swiglu_value(float g, float u, float limit, float w) {
  if (limit > 0) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  return round_bf16(__fmul_rn(w, __fmul_rn(silu, u)));
}

// Sum over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Unsigned key with the order of the floats (-0 taken as +0, so equal values have equal keys).
__device__ __forceinline__ uint32_t ordered_key(float x) {
  uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace dsflash::kernels::cuda
