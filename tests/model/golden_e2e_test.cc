// End-to-end agreement with the official reference on the tiny golden model: prefill logits
// of every prompt and the teacher-forced decode trace (golden README §4.4).
#include <algorithm>
#include <cmath>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "inference_svc/model/model.h"
#include "tests/golden_data.h"

namespace dsflash::model {
namespace {

using testing::Golden;

struct Agreement {
  double median = 0, p99 = 0, max = 0;
  int argmax_same = 0, rows = 0;
};

Agreement compare(const std::vector<float>& got, const std::vector<float>& want, int64_t V) {
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
    EXPECT_LT(a.median, 0.01) << len;
    EXPECT_LT(a.p99, 0.1) << len;
    EXPECT_GE(a.argmax_same, a.rows * 9 / 10) << len;
  }
}

}  // namespace
}  // namespace dsflash::model
