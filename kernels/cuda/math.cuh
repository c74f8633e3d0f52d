// Device scalar helpers shared by the kernels: the bf16 rounding point, warp sums and the
// order-preserving key of a float (for radix selection).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dsflash::kernels::cuda {

// bf16(x) as a float, round to nearest even (quant::round_bf16 on the host).
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

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
