// The end-to-end golden checks shared by every backend's test (golden README §4.4): the
// bounds on prefill and teacher-forced decode logits, and the runs that produce them.
#pragma once

#include <vector>

#include "gtest/gtest.h"
#include "inference_svc/model/model.h"
#include "tests/golden_data.h"
#include "tests/model/logits_compare.h"

namespace dsflash::testing {

// The tiny model amplifies 1-ulp differences through FP4/FP8 rounding points and small-margin
// top-k decisions (golden README §3): sub-layers are checked to a few ulps in
// golden_layers_test; end to end we bound the median, the 99th percentile and the argmax.
inline void expect_golden_prefill_bounds(const Agreement& a, int len) {
  EXPECT_LT(a.median, 0.01) << len;
  EXPECT_LT(a.p99, 0.35) << len;
  EXPECT_LT(a.max, 1.0) << len;
  EXPECT_GE(a.argmax_same, a.rows * 9 / 10) << len;
}

inline void expect_golden_decode_bounds(const Agreement& a) {
  EXPECT_LT(a.median, 0.02);
  EXPECT_LT(a.p99, 0.35);
  EXPECT_GE(a.argmax_same, a.rows * 8 / 10);
}

// Feeds decode.input_tokens at decode.positions to `seq` (prefilled with decode.prompt_tokens)
// and returns every step's logits, rows in step order.
inline std::vector<float> teacher_forced_decode(const model::Model& m, model::Sequence& seq) {
  const Golden& g = Golden::get();
  const auto inputs = g.ints("decode.input_tokens");
  const auto positions = g.ints("decode.positions");
  std::vector<float> logits, all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(seq.n_past, positions[i]);
    const Status s = m.forward(seq, {inputs[i]}, false, &logits);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return all;
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// Prefill of tokens[0, k) then teacher-forced decode steps up to the last token: the logits
// of positions k-1 .. n-2, the rows a prefill of all n tokens gives there.
inline std::vector<float> prefill_then_decode(const model::Model& m, const std::vector<int32_t>& tokens, int k) {
  auto seq = m.new_sequence();
  EXPECT_NE(seq, nullptr);
  std::vector<float> logits, got;
  if (seq == nullptr) return got;
  Status s = m.forward(*seq, std::vector<int32_t>(tokens.begin(), tokens.begin() + k), false, &logits);
  EXPECT_TRUE(s.ok()) << s;
  got = logits;
  for (size_t i = k; s.ok() && i + 1 < tokens.size(); ++i) {
    s = m.forward(*seq, {tokens[i]}, false, &logits);
    EXPECT_TRUE(s.ok()) << s;
    got.insert(got.end(), logits.begin(), logits.end());
  }
  return got;
}

}  // namespace dsflash::testing
