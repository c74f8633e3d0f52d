// Agreement of two logits arrays [rows][V]: median, 99th percentile and max |difference|,
// and how many rows pick the same argmax (golden README §4.4).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dsflash::testing {

struct Agreement {
  double median = 0, p99 = 0, max = 0;
  int argmax_same = 0, rows = 0;
};

inline Agreement compare(const std::vector<float>& got, const std::vector<float>& want, int64_t V) {
  Agreement a;
  std::vector<double> d;
  const int64_t rows = static_cast<int64_t>(want.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = &got[r * V];
    const float* w = &want[r * V];
    for (int64_t i = 0; i < V; ++i) d.push_back(std::fabs(g[i] - w[i]));
    a.argmax_same += std::max_element(g, g + V) - g == std::max_element(w, w + V) - w;
  }
  a.rows = static_cast<int>(rows);
  std::sort(d.begin(), d.end());
  a.median = d[d.size() / 2];
  a.p99 = d[d.size() * 99 / 100];
  a.max = d.back();
  return a;
}

}  // namespace dsflash::testing
