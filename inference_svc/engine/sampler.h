// Token sampling: repetition / presence / frequency penalties over the generated history,
// temperature (0 = greedy), top-k, top-p, min-p, and a seeded RNG so that the same seed and
// request give the same tokens. Also log-probabilities of the model's raw distribution.
// One Sampler per request; not thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernels/sample/sample.h"

namespace dsflash::engine {

struct SamplingParams {
  float temperature = 1.0f;        // 0: greedy
  int32_t top_k = 0;               // 0: off
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // 1: off (CTRL-style: divide positive, multiply negative logits)
  float presence_penalty = 0.0f;   // subtracted once per token id present in the output
  float frequency_penalty = 0.0f;  // subtracted per occurrence in the output
  uint64_t seed = 0;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  // Picks the next token from logits [V] (modified in place) given the tokens generated so far.
  int32_t sample(std::vector<float>& logits, const std::vector<int32_t>& generated);
  // The same draw made elsewhere (the device: kernels/sample/sample_cuda.h): its filters, its
  // penalties, and its uniform in [0, 1) (0 when greedy), taken from the seeded generator as
  // sample() takes it, so a seed gives the same tokens either way (up to summation rounding).
  kernels::sample::Params params() const { return {p_.temperature, p_.top_k, p_.top_p, p_.min_p}; }
  kernels::sample::Penalties penalties() const {
    return {p_.repetition_penalty, p_.presence_penalty, p_.frequency_penalty};
  }
  double next_uniform() { return p_.temperature > 0.0f ? std::generate_canonical<double, 53>(rng_) : 0.0; }
  // Log-softmax of raw logits: the chosen token's value and the top-n alternatives.
  static TokenLogprob logprobs(const std::vector<float>& raw, int32_t chosen, uint32_t top_n);
  // The same from what a draw reports (the device sampler's, or raw_logprobs'): logit - lse each.
  static TokenLogprob logprobs(int32_t chosen, const kernels::sample::DrawLogprobs& d);
  // What the device sampler reports for raw logits, computed here.
  static kernels::sample::DrawLogprobs raw_logprobs(const std::vector<float>& raw, int32_t chosen, uint32_t top_n);

  using Candidate = std::pair<float, int32_t>;  // (logit, id)

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<Candidate> entries_;  // scratch of sample(), kept between draws
  std::vector<double> weights_;
};

}  // namespace dsflash::engine
