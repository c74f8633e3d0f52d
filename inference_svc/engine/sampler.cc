// Sampling pipeline: penalties -> greedy or (temperature -> top-k -> softmax -> top-p ->
// min-p -> draw). Candidates are ordered by logit (ties: lower id) so the draw is
// deterministic for a seed; they are sorted only where the draw reads them one by one.
#include "inference_svc/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace dsflash::engine {

namespace {

// The candidates of a draw in their order (logit descending, then id ascending: what a stable
// sort of the ids gives), sorted only where a draw reads them one by one: a vocabulary of 129k
// sorted whole took 13-19 ms a draw, more than the model's decode step. A sorted prefix serves
// top-k and the likely head; past it, a running sum crosses a threshold (top-p, the draw) by
// passing halves of the rest by their summed mass (split at the median candidate), sorting only
// the 64 or fewer it lands among. Throughout, candidates [0, n) hold the first n as a set and
// every range split is a contiguous run of the order. Each candidate's probability is
// exp(logit / T - max / T) / sum, as the full sort computed it.
class Candidates {
  using Entry = Sampler::Candidate;
  struct Before {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    }
  };
  static constexpr Before before{};

 public:
  // entries, weights: the sampler's scratch (kept between draws: fresh megabytes a draw cost
  // page faults).
  Candidates(const std::vector<float>& logits, float temperature, std::vector<Entry>& entries,
             std::vector<double>& weights)
      : t_(temperature), c_(entries), all_(weights) {
    c_.resize(logits.size());
    for (size_t j = 0; j < logits.size(); ++j) c_[j] = {logits[j], static_cast<int32_t>(j)};
    all_.clear();
  }

  // Sorts the first n candidates when n < V (a top-k draw then adds its normaliser exactly as
  // the full sort did), else the first 256 and keeps every weight (summed in storage order,
  // not the full sort's: only the last bits of the normaliser can differ).
  void normalise(size_t n) {
    sorted_ = std::min(n < c_.size() ? n : 256, c_.size());
    if (sorted_ < c_.size()) std::nth_element(c_.begin(), at(sorted_), c_.end(), before);
    std::sort(c_.begin(), at(sorted_), before);
    mx_ = c_[0].first / t_;
    sum_ = 0;
    if (n < c_.size()) {
      for (size_t i = 0; i < n; ++i) sum_ += weight(c_[i].first);
      return;
    }
    all_.resize(c_.size());
    for (const Entry& e : c_) sum_ += (all_[static_cast<size_t>(e.second)] = weight(e.first));
  }
  // Candidate k's probability, wherever it stands.
  double p(size_t k) const { return prob_of(c_[k]); }
  // The first i < n (in candidate order) at which the running sum of probabilities reaches x,
  // that candidate then at position i; n if the sum never gets there (rounding).
  size_t cross(double x, size_t n) {
    double acc = 0;
    for (size_t i = 0; i < std::min(n, sorted_); ++i) {
      if ((acc += p(i)) >= x) return i;
    }
    size_t lo = std::min(n, sorted_), hi = n;
    while (hi - lo > 64) {
      const size_t mid = lo + (hi - lo) / 2;
      std::nth_element(at(lo), at(mid), at(hi), before);
      double mass = 0;
      for (size_t k = lo; k < mid; ++k) mass += p(k);
      if (acc + mass >= x) {
        hi = mid;
      } else {
        acc += mass;
        lo = mid;
      }
    }
    for (size_t end : {hi, n}) {  // the landing run, then (rounding) the rest in order
      std::sort(at(lo), at(end), before);
      for (size_t k = lo; k < end; ++k) {
        if ((acc += p(k)) >= x) return k;
      }
      lo = end;
    }
    return n;
  }
  // Of the first n, keeps those of probability >= floor (a prefix of the order: probability
  // falls with it) at the front; returns how many (at least one). The sorted prefix is counted,
  // and only if all of it stays is the unsorted rest partitioned.
  size_t keep_at_least(double floor, size_t n) {
    const size_t head = std::min(n, sorted_);
    size_t k = 0;
    while (k < head && p(k) >= floor) ++k;
    if (k == head && n > head) {
      const auto kept = std::partition(at(head), at(n), [&](const Entry& e) { return prob_of(e) >= floor; });
      k = static_cast<size_t>(kept - c_.begin());
    }
    return std::max<size_t>(1, k);
  }
  int32_t id(size_t i) const { return c_[i].second; }

 private:
  std::vector<Entry>::iterator at(size_t k) { return c_.begin() + static_cast<long>(k); }
  double weight(float logit) const { return std::exp(logit / t_ - mx_); }
  double prob_of(const Entry& e) const {
    return (all_.empty() ? weight(e.first) : all_[static_cast<size_t>(e.second)]) / sum_;
  }

  float t_;
  std::vector<Entry>& c_;
  size_t sorted_ = 0;
  double mx_ = 0, sum_ = 0;
  std::vector<double>& all_;  // every id's weight, when the normaliser covers them all
};

}  // namespace

int32_t Sampler::sample(std::vector<float>& logits, const std::vector<int32_t>& generated) {
  kernels::sample::apply_edits(logits.data(), kernels::sample::make_edits(generated, {}, penalties()), penalties());
  if (p_.temperature <= 0.0f) {
    return kernels::sample::argmax(logits.data(), static_cast<int64_t>(logits.size()));
  }
  Candidates c(logits, p_.temperature, entries_, weights_);
  size_t n = logits.size();
  if (p_.top_k > 0) n = std::min<size_t>(n, static_cast<size_t>(p_.top_k));
  c.normalise(n);
  if (p_.top_p < 1.0f) n = std::min(n, c.cross(p_.top_p, n) + 1);
  if (p_.min_p > 0.0f) n = c.keep_at_least(c.p(0) * p_.min_p, n);
  double total = 0;
  for (size_t k = 0; k < n; ++k) total += c.p(k);
  return c.id(std::min(c.cross(next_uniform() * total, n), n - 1));
}

kernels::sample::DrawLogprobs Sampler::raw_logprobs(const std::vector<float>& raw, int32_t chosen, uint32_t top_n) {
  kernels::sample::DrawLogprobs d;
  const float mx = *std::max_element(raw.begin(), raw.end());
  double sum = 0;
  for (float l : raw) sum += std::exp(static_cast<double>(l - mx));
  d.lse = mx + static_cast<float>(std::log(sum));
  d.chosen_logit = raw[chosen];
  if (top_n > 0) {
    std::vector<int32_t> ids(raw.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t n = std::min<size_t>(top_n, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(n), ids.end(), [&](int32_t a, int32_t b) {
      return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
    });
    for (size_t i = 0; i < n; ++i) {
      d.top_ids.push_back(ids[i]);
      d.top_logits.push_back(raw[ids[i]]);
    }
  }
  return d;
}

TokenLogprob Sampler::logprobs(int32_t chosen, const kernels::sample::DrawLogprobs& d) {
  TokenLogprob out;
  out.token = chosen;
  out.logprob = d.chosen_logit - d.lse;
  out.top_ids = d.top_ids;
  for (float l : d.top_logits) out.top_logprobs.push_back(l - d.lse);
  return out;
}

TokenLogprob Sampler::logprobs(const std::vector<float>& raw, int32_t chosen, uint32_t top_n) {
  return logprobs(chosen, raw_logprobs(raw, chosen, top_n));
}

}  // namespace dsflash::engine
