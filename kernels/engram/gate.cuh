// The Engram gate of one stream from its three row sums (kernels::engram::gate_update on the
// CPU, the same operations in its order), shared by engram.cu's launch and the fused sub-layer
// exit of hc.cu (post_gate_pre_norm_cuda).
#pragma once

#include <math.h>

#include <cstdint>

namespace dsflash::kernels::engram {

// hh = sum h^2, kk = sum key^2, dot = sum (h w) key over the D values of a row.
__device__ __forceinline__ float gate_of(float hh, float kk, float dot, int64_t D, float eps) {
  const float fd = static_cast<float>(D);
  const float inv_sqrt_d = static_cast<float>(1.0 / sqrt(static_cast<double>(D)));
  const float rstd = __fmul_rn(1.0f / sqrtf(hh / fd + eps), 1.0f / sqrtf(kk / fd + eps));
  const float v = __fmul_rn(__fmul_rn(dot, rstd), inv_sqrt_d);
  return 1.0f / (1.0f + expf(-copysignf(sqrtf(fmaxf(fabsf(v), 1e-6f)), v)));
}

}  // namespace dsflash::kernels::engram
