// Sub-layer agreement with the official reference (golden README §4.2-4.3):
//  - bit-exact checks: Engram hash ids, RoPE + FP4 QDQ of the golden compressor latents, and
//    the Sinkhorn split of the golden mixes;
//  - teacher forcing: the 17-token prefill runs with every recorded intermediate replaced by
//    its golden value once compared, so each sub-layer's output is checked against the golden
//    output given golden inputs (a few bf16 ulps; routing decisions exact).
#include <cmath>
#include <map>

#include "common/config/config.h"
#include "common/quant/numeric.h"
#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "inference_svc/model/model.h"
#include "kernels/engram/engram.h"
#include "kernels/hc/hc.h"
#include "kernels/qdq/qdq.h"
#include "kernels/rope/rope.h"
#include "tests/golden_data.h"

namespace dsflash::model {
namespace {

using testing::Golden;

class GoldenLayers : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = gguf::Model::open(testing::golden_dir() + "/tiny_a.gguf");
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = std::move(*f);
    auto c = config::from_gguf(*file_);
    ASSERT_TRUE(c.ok()) << c.status();
    cfg_ = *c;
  }
  std::unique_ptr<gguf::Model> file_;
  config::ModelConfig cfg_;
};

TEST_F(GoldenLayers, EngramHashIdsAreBitExact) {
  const Golden& g = Golden::get();
  const auto tokens = g.ints("prompt.len17.tokens");
  const auto& want = g.at("inter.engram.hash_ids_all");  // [S][2][cols]
  const int64_t cols = cfg_.engram.cols();
  std::vector<int64_t> history, ids(static_cast<size_t>(cols));
  for (size_t t = 0; t < tokens.size(); ++t) {
    history.push_back(cfg_.engram.token_map[tokens[t]]);
    for (size_t e = 0; e < 2; ++e) {
      kernels::engram::hash_ids(cfg_.engram, e, history.data(), static_cast<int64_t>(history.size()), ids.data());
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(ids[c], static_cast<int64_t>(want.values[(t * 2 + e) * cols + c])) << "t " << t << " e " << e;
      }
    }
  }
}

TEST_F(GoldenLayers, CompressedKvQdqIsBitExact) {
  const Golden& g = Golden::get();
  const auto rope = kernels::rope::make_table(static_cast<int>(cfg_.rope_dims), cfg_.compress_rope_theta,
                                              static_cast<int>(cfg_.yarn_orig_ctx), cfg_.yarn_factor, cfg_.yarn_beta_fast,
                                              cfg_.yarn_beta_slow);
  for (int l : {1, 3}) {
    const int r = cfg_.layers[l].compress_ratio;
    auto latent = g.at("inter.L" + std::to_string(l) + ".compressor.latent").values;
    const auto& want = g.at("inter.L" + std::to_string(l) + ".attn.compressed_kv").values;
    const int64_t Dh = cfg_.head_dim, n = static_cast<int64_t>(latent.size()) / Dh;
    for (int64_t j = 0; j < n; ++j) {
      kernels::rope::apply(rope, &latent[j * Dh], Dh, j * r);
      kernels::qdq::fp4_e4m3_16(&latent[j * Dh], Dh);
    }
    int64_t bad = 0;
    for (size_t i = 0; i < latent.size(); ++i) bad += latent[i] != want[i];
    EXPECT_EQ(bad, 0) << "layer " << l;
  }
}

TEST_F(GoldenLayers, SinkhornSplitOfGoldenMixes) {
  const Golden& g = Golden::get();
  const int C = static_cast<int>(cfg_.hc_mult);
  for (int l = 0; l < static_cast<int>(cfg_.n_layer); ++l) {
    for (const char* sub : {"attn", "ffn"}) {
      const std::string p = "inter.L" + std::to_string(l) + "." + sub + ".";
      const auto& mixes = g.at(p + "mixes").values;
      auto base = file_->find_tensor("blk." + std::to_string(l) + ".hc_" + sub + "_base.weight");
      auto scale = file_->find_tensor("blk." + std::to_string(l) + ".hc_" + sub + "_scale.weight");
      const float* b = reinterpret_cast<const float*>(*file_->data(*base));
      const float* s = reinterpret_cast<const float*>(*file_->data(*scale));
      const int M = static_cast<int>(cfg_.hc_mix());
      for (int64_t t = 0; t < 17; ++t) {
        const auto sp = kernels::hc::split(&mixes[t * M], s, b, C, static_cast<int>(cfg_.hc_sinkhorn_iters), cfg_.hc_eps);
        for (int i = 0; i < C; ++i) {
          // fp32 exp/sigmoid may differ in the last ulp between libm and torch.
          EXPECT_NEAR(sp.pre[i], g.at(p + "pre").values[t * C + i], 2e-7) << p << t;
          EXPECT_NEAR(sp.post[i], g.at(p + "post").values[t * C + i], 4e-7) << p << t;
          for (int j = 0; j < C; ++j) EXPECT_NEAR(sp.comb[i][j], g.at(p + "comb").values[(t * C + i) * C + j], 1e-6) << p << t;
        }
      }
    }
  }
}

// Tolerance of a compared intermediate: discrete values exact, bf16 values two ulps of the
// array's largest magnitude, fp32 values 1e-5 relative.
double tolerance(const std::string& name, double max_ref) {
  if (name.find("indices") != std::string::npos || name.find("hash_ids") != std::string::npos ||
      name.find("topk") != std::string::npos) {
    return 0.0;
  }
  if (name.find("gate") != std::string::npos || name.find("weights") != std::string::npos) {
    return name.find("indexer") != std::string::npos ? max_ref * std::ldexp(1.0, -7) : 1e-5 * std::max(1.0, max_ref);
  }
  return max_ref * std::ldexp(1.0, -7);
}

// What sparse attention multiplies on the golden model (17-token prefill, then a decode step):
// every query (after RoPE), window KV row (after FP8 QDQ) and compressed KV row (after FP4 QDQ)
// is a bf16 value, so a tensor-core attention's products are exact (docs/cuda-backend.md, Next
// item 5).
TEST_F(GoldenLayers, AttentionOperandsAreBf16Values) {
  auto m = Model::load(*file_);
  ASSERT_TRUE(m.ok()) << m.status();
  const Golden& g = Golden::get();
  int tensors = 0;
  Hook hook = [&](const std::string& name, float* data, int64_t rows, int64_t cols) {
    const bool q = name.size() > 7 && name.compare(name.size() - 7, 7, ".attn.q") == 0;
    if (!q && name.find(".attn.window_kv") == std::string::npos) return;
    for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(quant::round_bf16(data[i]), data[i]) << name << " [" << i << "]";
    ++tensors;
  };
  auto seq = (*m)->new_sequence();
  std::vector<float> logits;
  const std::vector<int32_t> prompt = g.ints("prompt.len17.tokens");
  ASSERT_TRUE((*m)->forward(*seq, prompt, true, &logits, hook).ok());
  ASSERT_TRUE((*m)->forward(*seq, {prompt[0]}, true, &logits, hook).ok());
  EXPECT_EQ(tensors, 4 * static_cast<int>(cfg_.n_layer));
  int64_t compressed = 0;
  for (const LayerState& st : seq->layers) {
    for (const float v : st.comp_kv) ASSERT_EQ(quant::round_bf16(v), v) << "a compressed KV row";
    compressed += static_cast<int64_t>(st.comp_kv.size());
  }
  EXPECT_GT(compressed, 0);
}

TEST_F(GoldenLayers, TeacherForcedSubLayers) {
  auto m = Model::load(*file_);
  ASSERT_TRUE(m.ok()) << m.status();
  const Golden& g = Golden::get();
  int compared = 0;
  Hook hook = [&](const std::string& name, float* data, int64_t rows, int64_t cols) {
    const std::string key = "inter." + name;
    if (!g.has(key)) return;
    const auto& ref = g.at(key);
    ASSERT_EQ(ref.numel(), rows * cols) << name;
    double max_abs = 0, max_ref = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (std::isinf(ref.values[i]) && ref.values[i] == data[i]) continue;
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(data[i] - ref.values[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref.values[i])));
    }
    EXPECT_LE(max_abs, tolerance(name, max_ref)) << name << " (max |ref| " << max_ref << ")";
    ++compared;
    std::copy(ref.values.begin(), ref.values.end(), data);  // teacher forcing
  };
  auto seq = (*m)->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE((*m)->forward(*seq, g.ints("prompt.len17.tokens"), true, &logits, hook).ok());
  EXPECT_GE(compared, 100);
  // With golden inputs all the way, the head reproduces the golden logits closely.
  const auto& want = g.at("prefill.len17.logits").values;
  double max_d = 0;
  for (size_t i = 0; i < want.size(); ++i) max_d = std::max(max_d, static_cast<double>(std::fabs(logits[i] - want[i])));
  EXPECT_LT(max_d, 1e-4);
}

}  // namespace
}  // namespace dsflash::model
