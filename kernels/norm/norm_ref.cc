#include <cmath>

#include "common/quant/numeric.h"
#include "kernels/norm/norm.h"

namespace dsflash::kernels {

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    float* yr = y + r * n;
    for (int64_t i = 0; i < n; ++i) yr[i] = quant::round_bf16(w[i] * (xr[i] * inv));
  }
}

}  // namespace dsflash::kernels
