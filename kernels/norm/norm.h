// RMSNorm exactly as the reference (spec §2.8): n = x * rsqrt(mean(x^2) + eps) in fp32, then
// y = bf16(w * n). Rows of length n over n_rows rows; in-place allowed.
#pragma once

#include <cstdint>

namespace dsflash::kernels {

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);

}  // namespace dsflash::kernels
