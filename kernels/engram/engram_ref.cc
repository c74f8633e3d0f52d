#include <cmath>

#include "common/quant/numeric.h"
#include "kernels/engram/engram.h"

namespace dsflash::kernels::engram {

void hash_ids(const config::EngramConfig& cfg, size_t e, const int64_t* history, int64_t n_history, int64_t* out) {
  const uint32_t N = cfg.max_ngram;
  const uint32_t heads = cfg.n_heads;
  const uint64_t* mult = cfg.multipliers.data() + e * N;
  const uint64_t* primes = cfg.primes.data() + e * cfg.cols();
  const uint64_t* offsets = cfg.offsets.data() + e * cfg.cols();
  int64_t x = 0;
  for (uint32_t k = 0; k < N; ++k) {
    const int64_t tok = static_cast<int64_t>(k) < n_history ? history[n_history - 1 - k] : static_cast<int64_t>(cfg.pad_id);
    const int64_t p = tok * static_cast<int64_t>(mult[k]);
    x = k == 0 ? p : (x ^ p);
    if (k == 0) continue;
    for (uint32_t h = 0; h < heads; ++h) {
      const uint32_t col = (k - 1) * heads + h;
      out[col] = static_cast<int64_t>(static_cast<uint64_t>(x) % primes[col] + offsets[col]);
    }
  }
}

void gate_update(float* h, const float* kv, const float* qk, int C, int64_t D, float eps, float* gate) {
  const float* value = kv + C * D;
  const float inv_sqrt_d = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));  // fp32(dim^-0.5)
  for (int c = 0; c < C; ++c) {
    float* hc = h + c * D;
    const float* key = kv + c * D;
    const float* w = qk + c * D;
    float hh = 0.0f, kk = 0.0f, dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      hh += hc[d] * hc[d];
      kk += key[d] * key[d];
      dot += hc[d] * w[d] * key[d];
    }
    const float rstd = (1.0f / std::sqrt(hh / static_cast<float>(D) + eps)) * (1.0f / std::sqrt(kk / static_cast<float>(D) + eps));
    const float v = dot * rstd * inv_sqrt_d;
    const float g = 1.0f / (1.0f + std::exp(-std::copysign(std::sqrt(std::fmax(std::fabs(v), 1e-6f)), v)));
    if (gate) gate[c] = g;
    for (int64_t d = 0; d < D; ++d) hc[d] = quant::round_bf16(hc[d] + g * value[d]);
  }
}

}  // namespace dsflash::kernels::engram
