// Sampling pipeline: penalties -> greedy or (temperature -> top-k -> softmax -> top-p ->
// min-p -> draw). Candidates are kept sorted by logit (ties: lower id) so the draw is
// deterministic for a seed.
#include "inference_svc/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace dsflash::engine {

int32_t Sampler::sample(std::vector<float>& logits, const std::vector<int32_t>& generated) {
  const int32_t V = static_cast<int32_t>(logits.size());
  if (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : generated) ++counts[t];
    for (const auto& [t, n] : counts) {
      float& l = logits[t];
      if (p_.repetition_penalty != 1.0f) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
      l -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(n);
    }
  }
  if (p_.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t n = ids.size();
  if (p_.top_k > 0) n = std::min<size_t>(n, static_cast<size_t>(p_.top_k));
  std::vector<double> prob(n);
  const double mx = logits[ids[0]] / p_.temperature;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(logits[ids[i]] / p_.temperature - mx));
  for (double& q : prob) q /= sum;
  if (p_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < n && (keep == 0 || acc < p_.top_p)) acc += prob[keep++];
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const double floor = prob[0] * p_.min_p;
    size_t keep = 1;
    while (keep < n && prob[keep] >= floor) ++keep;
    n = keep;
  }
  const double total = std::accumulate(prob.begin(), prob.begin() + static_cast<long>(n), 0.0);
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r <= 0) return ids[i];
  }
  return ids[n - 1];
}

TokenLogprob Sampler::logprobs(const std::vector<float>& raw, int32_t chosen, uint32_t top_n) {
  const float mx = *std::max_element(raw.begin(), raw.end());
  double sum = 0;
  for (float l : raw) sum += std::exp(static_cast<double>(l - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  TokenLogprob out;
  out.token = chosen;
  out.logprob = raw[chosen] - lse;
  if (top_n > 0) {
    std::vector<int32_t> ids(raw.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t n = std::min<size_t>(top_n, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(n), ids.end(), [&](int32_t a, int32_t b) {
      return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
    });
    for (size_t i = 0; i < n; ++i) {
      out.top_ids.push_back(ids[i]);
      out.top_logprobs.push_back(raw[ids[i]] - lse);
    }
  }
  return out;
}

}  // namespace dsflash::engine
