#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/quant/numeric.h"
#include "kernels/attn/attn.h"

namespace dsflash::kernels::attn {

void sparse_attn(const float* q, int H, int64_t Dh, const float* kv, const int32_t* idx, int64_t n_idx,
                 const float* sink, float scale, float* o) {
  constexpr int64_t kChunk = 64;
  std::vector<float> acc(static_cast<size_t>(Dh)), part(static_cast<size_t>(Dh));
  std::vector<float> logit(kChunk), p(kChunk);
  for (int h = 0; h < H; ++h) {
    const float* qh = q + h * Dh;
    std::fill(acc.begin(), acc.end(), 0.0f);
    float m = -1e30f, L = 0.0f;
    for (int64_t c0 = 0; c0 < n_idx; c0 += kChunk) {
      const int64_t cn = std::min(kChunk, n_idx - c0);
      float cmax = -INFINITY;
      for (int64_t k = 0; k < cn; ++k) {
        const int32_t j = idx[c0 + k];
        if (j < 0) {
          logit[k] = -INFINITY;
          continue;
        }
        const float* row = kv + static_cast<int64_t>(j) * Dh;
        float dot = 0.0f;
        for (int64_t d = 0; d < Dh; ++d) dot += qh[d] * row[d];
        logit[k] = dot * scale;
        cmax = std::fmax(cmax, logit[k]);
      }
      const float m_new = std::fmax(m, cmax);
      const float rescale = std::exp(m - m_new);
      float psum = 0.0f;
      for (int64_t k = 0; k < cn; ++k) psum += (p[k] = std::exp(logit[k] - m_new));
      L = L * rescale + psum;
      // The chunk's value sum is formed first, then added to the rescaled accumulator.
      std::fill(part.begin(), part.end(), 0.0f);
      for (int64_t k = 0; k < cn; ++k) {
        const int32_t j = idx[c0 + k];
        if (j < 0) continue;
        const float pb = quant::round_bf16(p[k]);
        const float* row = kv + static_cast<int64_t>(j) * Dh;
        for (int64_t d = 0; d < Dh; ++d) part[d] += pb * row[d];
      }
      for (int64_t d = 0; d < Dh; ++d) acc[d] = acc[d] * rescale + part[d];
      m = m_new;
    }
    L += std::exp(sink[h] - m);
    for (int64_t d = 0; d < Dh; ++d) o[h * Dh + d] = quant::round_bf16(acc[d] / L);
  }
}

void pool_group(const float* k, const float* s, int r, int64_t n, float* latent) {
  for (int64_t c = 0; c < n; ++c) {
    float mx = -INFINITY;
    for (int t = 0; t < r; ++t) mx = std::fmax(mx, s[t * n + c]);
    float den = 0.0f;
    for (int t = 0; t < r; ++t) den += std::exp(s[t * n + c] - mx);
    float acc = 0.0f;
    for (int t = 0; t < r; ++t) acc += k[t * n + c] * (std::exp(s[t * n + c] - mx) / den);
    latent[c] = quant::round_bf16(acc);
  }
}

void index_scores(const float* q, int Hi, int64_t Di, const float* keys, int64_t n_keys, const float* w,
                  float* score) {
  for (int64_t t = 0; t < n_keys; ++t) {
    const float* kt = keys + t * Di;
    float sum = 0.0f;
    for (int h = 0; h < Hi; ++h) {
      const float* qh = q + h * Di;
      float dot = 0.0f;
      for (int64_t d = 0; d < Di; ++d) dot += qh[d] * kt[d];
      const float relu = std::fmax(quant::round_bf16(dot), 0.0f);
      sum += quant::round_bf16(relu * w[h]);
    }
    score[t] = quant::round_bf16(sum);
  }
}

std::vector<int32_t> topk_ascending(const float* v, int64_t n, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  order.resize(static_cast<size_t>(std::min(n, k)));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<uint8_t> candidate_mask(const float* score, int64_t n, int64_t compress_len, int64_t topk_blocks,
                                    int64_t block) {
  const int64_t n_blocks = (n + block - 1) / block;
  std::vector<float> bs(static_cast<size_t>(n_blocks), -INFINITY);
  for (int64_t i = 0; i < n; ++i) bs[i / block] = std::fmax(bs[i / block], score[i]);
  const int64_t last = (compress_len - 1) >= 0 ? (compress_len - 1) / block : -1;
  if (last >= 0 && last < n_blocks) bs[last] = INFINITY;
  std::vector<int32_t> order(static_cast<size_t>(n_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bs[a] > bs[b]; });
  std::vector<uint8_t> keep(static_cast<size_t>(n_blocks), 0);
  for (int64_t i = 0; i < std::min(topk_blocks, n_blocks); ++i) keep[order[i]] = bs[order[i]] > -INFINITY;
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mask[i] = keep[i / block];
  return mask;
}

}  // namespace dsflash::kernels::attn
