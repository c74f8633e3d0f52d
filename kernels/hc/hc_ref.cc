// Hyper-connection ops in the reference's fp32 order (kernel_cpu.py hc_split_sinkhorn).
#include <cmath>

#include "common/quant/numeric.h"
#include "kernels/hc/hc.h"
#include "kernels/hc/split_math.h"

namespace dsflash::kernels::hc {

void mixes(const float* h, const float* fn, int C, int64_t D, float norm_eps, float* m) {
  const int64_t n = C * D;
  const int M = (2 + C) * C;
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += h[i] * h[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + norm_eps);
  for (int k = 0; k < M; ++k) {
    const float* row = fn + k * n;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += h[i] * row[i];
    m[k] = acc * r;
  }
}

Split split(const float* m, const float* scale, const float* base, int C, int iters, float eps) {
  Split s{};
  float comb[Split::kMaxC * Split::kMaxC];
  detail::split_token(m, scale, base, C, iters, eps, s.pre, s.post, comb);
  for (int i = 0; i < C; ++i) {
    for (int j = 0; j < C; ++j) s.comb[i][j] = comb[i * C + j];
  }
  return s;
}

void pre(const float* h, const float* w, int C, int64_t D, float* y) {
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int c = 0; c < C; ++c) acc += w[c] * h[c * D + d];
    y[d] = quant::round_bf16(acc);
  }
}

void post(const float* x, const float* res, const Split& s, int C, int64_t D, float* y) {
  for (int j = 0; j < C; ++j) {
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int i = 0; i < C; ++i) acc += s.comb[i][j] * res[i * D + d];
      y[j * D + d] = quant::round_bf16(s.post[j] * x[d] + acc);
    }
  }
}

}  // namespace dsflash::kernels::hc
