#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/quant/numeric.h"
#include "kernels/moe/moe.h"

namespace dsflash::kernels::moe {

Route route(const float* logits, const float* bias, int64_t E, int64_t k, bool norm_topk, float route_scale) {
  std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const float z = logits[e];
    const float sp = z > 20.0f ? z : std::log1p(std::exp(z));
    score[e] = std::sqrt(sp);
    biased[e] = score[e] + bias[e];
  }
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return biased[a] > biased[b]; });
  Route r;
  r.experts.assign(order.begin(), order.begin() + k);
  float sum = 0.0f;
  for (int32_t e : r.experts) {
    r.weights.push_back(score[e]);
    sum += score[e];
  }
  for (float& w : r.weights) {
    if (norm_topk && k > 1) w /= (sum + 1e-20f);
    w *= route_scale;
  }
  return r;
}

void swiglu(float* a, const float* b, int64_t n, float limit, float weight) {
  for (int64_t i = 0; i < n; ++i) {
    float g = a[i], u = b[i];
    if (limit > 0) {
      u = std::clamp(u, -limit, limit);
      g = std::fmin(g, limit);
    }
    const float silu = g / (1.0f + std::exp(-g));
    a[i] = quant::round_bf16(weight * (silu * u));
  }
}

}  // namespace dsflash::kernels::moe
