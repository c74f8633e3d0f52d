// `dsflash logits`: the .npy holds [S + N, vocab] float32 rows, prefill rows match the golden
// prefill, decode rows are single-token decode steps of the greedy continuation.
#include <algorithm>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "inference_svc/model/model.h"
#include "tests/golden_data.h"
#include "tools/dsflash/commands.h"
#include "tools/dsflash/npy.h"

namespace dsflash::tools {
namespace {

TEST(Logits, WritesPrefillAndDecodeRows) {
  testing::TempDir dir;
  const auto& g = testing::Golden::get();
  const auto tokens = g.ints("prompt.len17.tokens");
  std::string list;
  for (int32_t t : tokens) list += (list.empty() ? "" : ",") + std::to_string(t);
  const std::string model_path = testing::golden_dir() + "/tiny_a.gguf";
  ASSERT_EQ(logits_main({"--model", model_path, "--tokens", list, "--decode", "3", "--out", dir.file("l.npy")}), 0);
  auto npy = read_npy_f32(dir.file("l.npy"));
  ASSERT_TRUE(npy.ok()) << npy.status();
  ASSERT_EQ(npy->rows, 20);
  ASSERT_EQ(npy->cols, 512);
  // Prefill rows: the golden logits (end-to-end tolerance, see golden_e2e_test).
  const auto& want = g.at("prefill.len17.logits").values;
  double sum = 0;
  for (size_t i = 0; i < want.size(); ++i) sum += std::fabs(npy->data[i] - want[i]);
  EXPECT_LT(sum / static_cast<double>(want.size()), 0.02);
  // Decode rows: exactly what the model gives for the greedy continuation.
  auto file = gguf::Model::open(model_path);
  ASSERT_TRUE(file.ok());
  auto m = model::Model::load(**file);
  ASSERT_TRUE(m.ok());
  auto seq = (*m)->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE((*m)->forward(*seq, tokens, false, &logits).ok());
  for (int step = 0; step < 3; ++step) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_TRUE((*m)->forward(*seq, {next}, false, &logits).ok());
    EXPECT_TRUE(std::equal(logits.begin(), logits.end(), npy->data.begin() + (17 + step) * 512)) << step;
  }
}

TEST(Logits, BadInputIsAnError) {
  testing::TempDir dir;
  const std::string model_path = testing::golden_dir() + "/tiny_a.gguf";
  EXPECT_EQ(logits_main({"--model", model_path, "--tokens", "1,x", "--out", dir.file("l.npy")}), 1);
  EXPECT_EQ(logits_main({"--model", model_path, "--tokens", "1,99999", "--out", dir.file("l.npy")}), 1);
  EXPECT_EQ(logits_main({"--model", dir.file("missing.gguf"), "--tokens", "1", "--out", dir.file("l.npy")}), 1);
  EXPECT_EQ(logits_main({"--tokens", "1"}), 2);
}

}  // namespace
}  // namespace dsflash::tools
