// Hyper-connection ops in the reference's fp32 order (kernel_cpu.py hc_split_sinkhorn).
#include <cmath>

#include "common/quant/numeric.h"
#include "kernels/hc/hc.h"

namespace dsflash::kernels::hc {
namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

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
  for (int i = 0; i < C; ++i) {
    s.pre[i] = sigmoid(m[i] * scale[0] + base[i]) + eps;
    s.post[i] = 2.0f * sigmoid(m[C + i] * scale[1] + base[C + i]);
  }
  auto& c = s.comb;
  for (int i = 0; i < C; ++i) {
    float mx = -INFINITY;
    for (int j = 0; j < C; ++j) {
      c[i][j] = m[2 * C + i * C + j] * scale[2] + base[2 * C + i * C + j];
      mx = std::fmax(mx, c[i][j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < C; ++j) sum += (c[i][j] = std::exp(c[i][j] - mx));
    for (int j = 0; j < C; ++j) c[i][j] = c[i][j] / sum + eps;
  }
  auto col_norm = [&] {
    for (int j = 0; j < C; ++j) {
      float sum = 0.0f;
      for (int i = 0; i < C; ++i) sum += c[i][j];
      for (int i = 0; i < C; ++i) c[i][j] = c[i][j] / (sum + eps);
    }
  };
  auto row_norm = [&] {
    for (int i = 0; i < C; ++i) {
      float sum = 0.0f;
      for (int j = 0; j < C; ++j) sum += c[i][j];
      for (int j = 0; j < C; ++j) c[i][j] = c[i][j] / (sum + eps);
    }
  };
  col_norm();
  for (int it = 0; it < iters - 1; ++it) {
    row_norm();
    col_norm();
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
