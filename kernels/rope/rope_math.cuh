// The rotation of one RoPE pair on the CUDA backend (rope.cu's kernel and the fused attention
// row kernel): fp32 angle, bf16 results, as kernels::rope::apply.
#pragma once

#include <cuda_bf16.h>

namespace dsflash::kernels::rope::detail {

// Pair i of tail (values 2i, 2i + 1) rotated by angle a (backwards when inverse).
__device__ __forceinline__ void rotate_pair(float* tail, int i, float a, bool inverse) {
  float s, c;
  sincosf(a, &s, &c);
  if (inverse) s = -s;
  const float re = tail[2 * i], im = tail[2 * i + 1];
  tail[2 * i] = __bfloat162float(__float2bfloat16_rn(re * c - im * s));
  tail[2 * i + 1] = __bfloat162float(__float2bfloat16_rn(re * s + im * c));
}

}  // namespace dsflash::kernels::rope::detail
