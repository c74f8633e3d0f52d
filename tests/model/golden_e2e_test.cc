// End-to-end agreement with the official reference on the tiny golden model: prefill logits
// of every prompt and the teacher-forced decode trace (golden README §4.4).
#include <algorithm>
#include <cmath>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "inference_svc/model/model.h"
#include "tests/golden_data.h"
#include "tests/model/golden_checks.h"

namespace dsflash::model {
namespace {

using testing::compare;
using testing::expect_golden_decode_bounds;
using testing::expect_golden_prefill_bounds;
using testing::Golden;
using testing::prefill_then_decode;
using testing::teacher_forced_decode;

class GoldenModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto f = gguf::Model::open(testing::golden_dir() + "/tiny_a.gguf");
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = std::move(*f).release();
    auto m = Model::load(*file_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m).release();
  }
  static gguf::Model* file_;
  static Model* model_;
};
gguf::Model* GoldenModel::file_ = nullptr;
Model* GoldenModel::model_ = nullptr;

TEST_F(GoldenModel, PrefillLogitsOfEveryPrompt) {
  const Golden& g = Golden::get();
  for (int len : {1, 3, 16, 17, 41}) {
    const auto tokens = g.ints("prompt.len" + std::to_string(len) + ".tokens");
    auto seq = model_->new_sequence();
    std::vector<float> logits;
    ASSERT_TRUE(model_->forward(*seq, tokens, true, &logits).ok());
    const auto a = compare(logits, g.at("prefill.len" + std::to_string(len) + ".logits").values, 512);
    std::printf("prefill len %2d: median |d| %.2e  p99 %.2e  max %.2e  argmax %d/%d\n", len, a.median, a.p99, a.max,
                a.argmax_same, a.rows);
    expect_golden_prefill_bounds(a, len);
  }
}

TEST_F(GoldenModel, TeacherForcedDecodeTrace) {
  const Golden& g = Golden::get();
  auto seq = model_->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(model_->forward(*seq, g.ints("decode.prompt_tokens"), false, &logits).ok());
  const auto p = compare(logits, g.at("decode.prefill_last_logits").values, 512);
  EXPECT_LT(p.max, 0.1);
  const std::vector<float> all = teacher_forced_decode(*model_, *seq);
  const auto a = compare(all, g.at("decode.logits").values, 512);
  std::printf("decode trace: median |d| %.2e  p99 %.2e  max %.2e  argmax %d/%d\n", a.median, a.p99, a.max,
              a.argmax_same, a.rows);
  expect_golden_decode_bounds(a);
}

// Our own engine: prefill(41) equals prefill(k) + (41 - k) teacher-forced decode steps.
TEST_F(GoldenModel, DecodeEqualsPrefill) {
  const Golden& g = Golden::get();
  const auto tokens = g.ints("prompt.len41.tokens");
  auto full = model_->new_sequence();
  std::vector<float> ref;
  ASSERT_TRUE(model_->forward(*full, tokens, true, &ref).ok());
  for (int k : {1, 17}) {
    const std::vector<float> got = prefill_then_decode(*model_, tokens, k);
    const std::vector<float> want(ref.begin() + (k - 1) * 512, ref.begin() + 40 * 512);
    const auto a = compare(got, want, 512);
    std::printf("prefill(41) vs prefill(%d)+decode: median %.2e  p99 %.2e  max %.2e  argmax %d/%d\n", k, a.median, a.p99,
                a.max, a.argmax_same, a.rows);
    EXPECT_LT(a.median, 0.01) << k;
    EXPECT_GE(a.argmax_same, a.rows * 9 / 10) << k;
  }
}

TEST_F(GoldenModel, RejectsBadCalls) {
  auto seq = model_->new_sequence();
  std::vector<float> logits;
  EXPECT_EQ(model_->forward(*seq, {}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->forward(*seq, {512}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->forward(*seq, {-1}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->forward(*seq, std::vector<int32_t>(129, 5), false, &logits).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(model_->forward(*seq, std::vector<int32_t>(120, 5), false, &logits).ok());
  EXPECT_EQ(model_->forward(*seq, std::vector<int32_t>(9, 5), false, &logits).code(), absl::StatusCode::kOutOfRange);
}

// Options of the CUDA backend are refused on the CPU backend, naming the option.
TEST_F(GoldenModel, RefusesCudaOnlyOptions) {
  LoadOptions q8;
  q8.expert_act_q8 = true;
  auto m = Model::load(*file_, nullptr, q8);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("--expert-activations q8"), absl::string_view::npos) << m.status();
}

// A prefill split into chunks computes the same logits as one prefill: each query lists its
// window in the same order, so the arithmetic is identical.
TEST_F(GoldenModel, ChunkedPrefillEqualsPrefill) {
  const Golden& g = Golden::get();
  const auto tokens = g.ints("prompt.len41.tokens");
  auto full = model_->new_sequence();
  std::vector<float> ref;
  ASSERT_TRUE(model_->forward(*full, tokens, true, &ref).ok());
  for (const std::vector<int>& chunks : {std::vector<int>{17, 24}, std::vector<int>{10, 7, 1, 23}, std::vector<int>{3, 5, 33}}) {
    auto seq = model_->new_sequence();
    std::vector<float> got, logits;
    size_t at = 0;
    for (int n : chunks) {
      ASSERT_TRUE(model_->forward(*seq, std::vector<int32_t>(tokens.begin() + at, tokens.begin() + at + n), true, &logits).ok());
      got.insert(got.end(), logits.begin(), logits.end());
      at += n;
    }
    const auto a = compare(got, ref, 512);
    std::printf("prefill(41) vs chunks: max %.2e  argmax %d/%d\n", a.max, a.argmax_same, a.rows);
    EXPECT_EQ(a.max, 0.0);
  }
}

}  // namespace
}  // namespace dsflash::model
