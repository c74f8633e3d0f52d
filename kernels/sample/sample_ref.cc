// The sampling definition (sample.h), on the host.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "kernels/sample/sample.h"

namespace dsflash::kernels::sample {

std::vector<Edit> make_edits(const std::vector<int32_t>& generated, const std::vector<int32_t>& banned,
                             const Penalties& p) {
  std::map<int32_t, Edit> by_id;
  for (int32_t t : banned) by_id[t] = Edit{t, 0, 1};
  if (p.repetition != 1.0f || p.presence != 0.0f || p.frequency != 0.0f) {
    for (int32_t t : generated) {
      Edit& e = by_id[t];
      e.id = t;
      ++e.count;
    }
  }
  std::vector<Edit> out;
  out.reserve(by_id.size());
  for (const auto& [id, e] : by_id) out.push_back(e);
  return out;
}

void apply_edits(float* logits, const std::vector<Edit>& edits, const Penalties& p) {
  for (const Edit& e : edits) logits[e.id] = edited(logits[e.id], e, p);
}

int32_t argmax(const float* logits, int64_t V) {
  return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
}

int32_t draw_reference(const float* logits, int64_t V, const Params& p, double u01) {
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t n = ids.size();
  if (p.top_k > 0) n = std::min<size_t>(n, static_cast<size_t>(p.top_k));
  std::vector<double> prob(n);
  const double mx = logits[ids[0]] / p.temperature;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(logits[ids[i]] / p.temperature - mx));
  for (double& q : prob) q /= sum;
  if (p.top_p < 1.0f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < n && (keep == 0 || acc < p.top_p)) acc += prob[keep++];
    n = keep;
  }
  if (p.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < n && prob[keep] >= prob[0] * p.min_p) ++keep;
    n = keep;
  }
  double r = u01 * std::accumulate(prob.begin(), prob.begin() + static_cast<long>(n), 0.0);
  for (size_t i = 0; i < n; ++i) {
    if ((r -= prob[i]) <= 0) return ids[i];
  }
  return ids[n - 1];
}

}  // namespace dsflash::kernels::sample
