// Sampling pipeline: penalties -> greedy or (temperature -> top-k -> softmax -> top-p ->
// min-p -> draw). Candidates are ordered by logit (ties: lower id) so the draw is
// deterministic for a seed; they are sorted only as far as the draw reads them.
#include "inference_svc/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <utility>

namespace dsflash::engine {

namespace {

// The candidates of a draw in their order (logit descending, then id ascending: what a stable
// sort of the ids gives), sorted only as far as a draw reads them: a vocabulary of 129k sorted
// whole took ~15-25 ms a token, more than the model's decode step, while top-k, top-p, min-p and
// most draws stop within the first few hundred. Each candidate's probability is
// exp(logit / T - max / T) / sum, as the full sort computed it.
class Candidates {
  using Entry = std::pair<float, int32_t>;  // (logit, id)
  static bool before(const Entry& a, const Entry& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }

 public:
  Candidates(const std::vector<float>& logits, float temperature) : t_(temperature), c_(logits.size()) {
    for (size_t j = 0; j < logits.size(); ++j) c_[j] = {logits[j], static_cast<int32_t>(j)};
  }

  // Sorts the first min(m, V) candidates (into place; earlier ones stay put).
  void sort_prefix(size_t m) {
    m = std::min(m, c_.size());
    if (m <= sorted_) return;
    const auto from = at(sorted_), to = at(m);
    if (m < c_.size()) std::nth_element(from, to, c_.end(), before);
    std::sort(from, to, before);
    sorted_ = m;
  }
  // Sets the normaliser: the sum over the first n candidates (in candidate order when n < V, so
  // a top-k draw adds exactly as the full sort did; over the whole vocabulary in id order, each
  // weight kept for the draw).
  void normalise(size_t n) {
    sort_prefix(std::min<size_t>(n, 256));
    mx_ = c_[0].first / t_;
    sum_ = 0;
    if (n < c_.size()) {
      sort_prefix(n);
      for (size_t i = 0; i < n; ++i) sum_ += weight(c_[i].first);
      return;
    }
    all_.resize(c_.size());
    for (const Entry& e : c_) sum_ += (all_[static_cast<size_t>(e.second)] = weight(e.first));
  }
  // The i-th candidate's probability (sorting further on demand, doubling).
  double prob(size_t i) {
    if (i >= sorted_) sort_prefix(std::max(2 * sorted_, i + 1));
    while (prob_.size() <= i) prob_.push_back(p(prob_.size()));
    return prob_[i];
  }
  // The sum of all V probabilities, in id order (no sort; after normalise(V)).
  double total_all() const {
    double total = 0;
    for (double w : all_) total += w / sum_;
    return total;
  }
  // The draw: the first of the first n candidates at which r, less each probability in
  // candidate order, reaches zero (the n-th if rounding never gets there). Past the sorted
  // prefix (n = V: a pure temperature draw) halves of the rest are passed by their summed mass
  // (split at the median candidate), so only the 64 or fewer the draw lands among are sorted.
  int32_t draw(size_t n, double r) {
    for (size_t i = 0; i < std::min(n, sorted_); ++i) {
      if ((r -= prob(i)) <= 0) return c_[i].second;
    }
    if (n <= sorted_) return c_[n - 1].second;
    size_t lo = sorted_, hi = c_.size();
    while (hi - lo > 64) {
      const size_t mid = lo + (hi - lo) / 2;
      std::nth_element(at(lo), at(mid), at(hi), before);
      double mass = 0;
      for (size_t k = lo; k < mid; ++k) mass += p(k);
      if (mass >= r) {
        hi = mid;
      } else {
        r -= mass;
        lo = mid;
      }
    }
    for (size_t end : {hi, c_.size()}) {  // the landing run, then (rounding) the rest in order
      std::sort(at(lo), at(end), before);
      for (size_t k = lo; k < end; ++k) {
        if ((r -= p(k)) <= 0) return c_[k].second;
      }
      lo = end;
    }
    return c_.back().second;
  }

 private:
  std::vector<Entry>::iterator at(size_t k) { return c_.begin() + static_cast<long>(k); }
  double weight(float logit) const { return std::exp(logit / t_ - mx_); }
  // Candidate k's probability, wherever it stands.
  double p(size_t k) const {
    return (all_.empty() ? weight(c_[k].first) : all_[static_cast<size_t>(c_[k].second)]) / sum_;
  }

  float t_;
  std::vector<Entry> c_;
  size_t sorted_ = 0;
  double mx_ = 0, sum_ = 0;
  std::vector<double> all_;   // every id's weight, when the normaliser covers them all
  std::vector<double> prob_;  // the sorted candidates' probabilities so far
};

}  // namespace

int32_t Sampler::sample(std::vector<float>& logits, const std::vector<int32_t>& generated) {
  const size_t V = logits.size();
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
  Candidates c(logits, p_.temperature);
  size_t n = V;
  if (p_.top_k > 0) n = std::min<size_t>(n, static_cast<size_t>(p_.top_k));
  c.normalise(n);
  if (p_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < n && (keep == 0 || acc < p_.top_p)) acc += c.prob(keep++);
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const double floor = c.prob(0) * p_.min_p;
    size_t keep = 1;
    while (keep < n && c.prob(keep) >= floor) ++keep;
    n = keep;
  }
  double total = 0;
  if (n < V) {
    for (size_t i = 0; i < n; ++i) total += c.prob(i);
  } else {
    total = c.total_all();
  }
  std::uniform_real_distribution<double> u(0.0, total);
  return c.draw(n, u(rng_));
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
