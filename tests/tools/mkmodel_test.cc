// Synthetic models: the tiny preset passes configuration and inventory validation, is
// deterministic in its seed, splits into shards, carries a working tokenizer and an Engram
// token map built from it; the perf preset's plan has the released shape; --routing-skew
// gives each layer Zipf-like routing biases, and the routing of a forward pass follows them.
#include <cmath>
#include <cstring>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "inference_svc/model/model.h"
#include "tests/test_util.h"
#include "tools/dsflash/synth_model.h"

namespace dsflash::tools {
namespace {

using testing::TempDir;

TEST(Mkmodel, TinyIsAValidV41Model) {
  TempDir dir;
  auto paths = write_synthetic_model(SynthOptions{}, dir.file("tiny.gguf"), 1);
  ASSERT_TRUE(paths.ok()) << paths.status();
  auto m = gguf::Model::open(dir.file("tiny.gguf"));
  ASSERT_TRUE(m.ok()) << m.status();
  auto c = config::from_gguf(**m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(config::validate_tensors(*c, **m).ok());
  EXPECT_EQ(c->n_layer, 6u);
  EXPECT_EQ(c->n_expert, 8u);
  EXPECT_EQ((*m)->find_tensor("blk.0.ffn_gate_exps.weight")->type, quant::GgmlType::kQ2_K);
  EXPECT_EQ((*m)->find_tensor("blk.0.ffn_down_exps.weight")->type, quant::GgmlType::kQ3_K);
  EXPECT_EQ((*m)->find_tensor("blk.1.engram_embd.weight")->type, quant::GgmlType::kQ2_K);
  EXPECT_LT((*m)->total_bytes(), 32u << 20);  // "a few MB"

  // Text goes in and comes out.
  auto t = tok::Tokenizer::from_gguf(**m);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string s = "The expert store streams experts: 42 of them, 🙂 今天.";
  auto ids = (*t)->encode(s);
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ids->size(), s.size());
  EXPECT_EQ(*(*t)->decode(*ids), s);
  auto map = tok::build_compressed_token_map(**t);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(std::vector<int64_t>(map->begin(), map->end()), *(*m)->find("deepseek41.engram.token_map")->ints());

  // Weights have realistic magnitudes: embeddings O(1), norms near 1.
  const gguf::TensorInfo* norm = (*m)->find_tensor("blk.0.attn_norm.weight");
  std::vector<float> w(norm->n_elems);
  ASSERT_TRUE(quant::decode_row(norm->type, *(*m)->data(*norm), w.data(), static_cast<int64_t>(w.size())).ok());
  double mean = 0;
  for (float v : w) mean += v;
  EXPECT_NEAR(mean / static_cast<double>(w.size()), 1.0, 0.05);
}

// The share of a layer's routed picks taken by its most picked quarter of experts, over a
// 64-token prefill of the model at `path` (CPU backend), averaged over layers.
double top_quarter_share(const std::string& path) {
  auto m = gguf::Model::open(path);
  EXPECT_TRUE(m.ok());
  auto model = model::Model::load(**m);
  EXPECT_TRUE(model.ok()) << model.status();
  const uint32_t E = (*model)->config().n_expert;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 64; ++i) tokens.push_back(3 + (i * 7919) % 200);
  double share = 0;
  int layers = 0;
  auto seq = (*model)->new_sequence();
  std::vector<float> logits;
  const Status s = (*model)->forward(*seq, tokens, false, &logits, [&](const std::string& name, float* d, int64_t rows,
                                                                      int64_t cols) {
    if (name.find(".moe.indices") == std::string::npos) return;
    std::vector<double> count(E, 0);
    for (int64_t i = 0; i < rows * cols; ++i) count[static_cast<size_t>(d[i])] += 1;
    std::sort(count.rbegin(), count.rend());
    double top = 0;
    for (uint32_t i = 0; i < E / 4; ++i) top += count[i];
    share += top / static_cast<double>(rows * cols);
    ++layers;
  });
  EXPECT_TRUE(s.ok()) << s;
  return share / std::max(layers, 1);
}

TEST(Mkmodel, RoutingSkewBiasesEachLayerTowardsSomeExperts) {
  TempDir dir;
  SynthOptions o;
  o.routing_skew = 0.3f;
  ASSERT_TRUE(write_synthetic_model(o, dir.file("skew.gguf"), 1).ok());
  ASSERT_TRUE(write_synthetic_model(SynthOptions{}, dir.file("even.gguf"), 1).ok());
  auto m = gguf::Model::open(dir.file("skew.gguf"));
  ASSERT_TRUE(m.ok());
  std::vector<std::vector<float>> biases;
  for (const char* name : {"blk.0.exp_probs_b.bias", "blk.1.exp_probs_b.bias"}) {
    const gguf::TensorInfo* t = (*m)->find_tensor(name);
    ASSERT_NE(t, nullptr);
    std::vector<float> b(t->n_elems);
    ASSERT_TRUE(quant::decode_row(t->type, *(*m)->data(*t), b.data(), static_cast<int64_t>(b.size())).ok());
    biases.push_back(b);
    std::sort(b.rbegin(), b.rend());  // the values: -0.3 ln(1 + rank)
    for (size_t r = 0; r < b.size(); ++r) EXPECT_FLOAT_EQ(b[r], -0.3f * std::log(1.0f + static_cast<float>(r)));
  }
  EXPECT_NE(biases[0], biases[1]);  // each layer prefers its own experts
  const double skewed = top_quarter_share(dir.file("skew.gguf")), even = top_quarter_share(dir.file("even.gguf"));
  std::printf("top quarter of experts takes %.3f of picks with skew 0.3, %.3f without\n", skewed, even);
  EXPECT_GT(skewed, even + 0.1);
}

// Pooled experts: the other tensors are the unpooled model's byte for byte, every routed-expert
// row beyond the first two experts is a copy of one of theirs, and the model still runs.
TEST(Mkmodel, PooledExpertsCopyRowsOfTwoExperts) {
  TempDir dir;
  SynthOptions o;
  o.pooled_experts = true;
  ASSERT_TRUE(write_synthetic_model(o, dir.file("pooled.gguf"), 1).ok());
  ASSERT_TRUE(write_synthetic_model(SynthOptions{}, dir.file("plain.gguf"), 1).ok());
  auto p = gguf::Model::open(dir.file("pooled.gguf")), q = gguf::Model::open(dir.file("plain.gguf"));
  ASSERT_TRUE(p.ok() && q.ok());
  int expert_tensors = 0;
  for (const gguf::TensorInfo& t : (*p)->tensors()) {
    const gguf::TensorInfo* u = (*q)->find_tensor(t.name);
    ASSERT_NE(u, nullptr);
    const auto a = (*p)->data(t), b = (*q)->data(*u);
    ASSERT_TRUE(a.ok() && b.ok());
    if (t.name.find("_exps.") == std::string::npos) {
      EXPECT_EQ(std::memcmp(*a, *b, t.n_bytes), 0) << t.name;
      continue;
    }
    ++expert_tensors;
    const uint64_t rows = t.rows(), pool = 2 * t.ne[1], row_bytes = t.n_bytes / rows;
    ASSERT_GT(rows, pool);
    EXPECT_EQ(std::memcmp(*a, *b, pool * row_bytes), 0) << t.name;  // drawn as before
    for (uint64_t r = pool; r < rows; ++r) {
      bool found = false;
      for (uint64_t k = 0; k < pool && !found; ++k) found = std::memcmp(*a + r * row_bytes, *a + k * row_bytes, row_bytes) == 0;
      ASSERT_TRUE(found) << t.name << " row " << r;
    }
  }
  EXPECT_GT(expert_tensors, 0);
  auto m = model::Model::load(**p);
  ASSERT_TRUE(m.ok()) << m.status();
  auto seq = (*m)->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE((*m)->forward(*seq, {3, 4, 5, 6}, false, &logits).ok());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(Mkmodel, DeterministicInTheSeed) {
  TempDir dir;
  SynthOptions a;
  a.seed = 7;
  a.threads = 1;
  SynthOptions b = a;
  b.threads = 3;
  SynthOptions c = a;
  c.seed = 8;
  ASSERT_TRUE(write_synthetic_model(a, dir.file("a.gguf"), 1).ok());
  ASSERT_TRUE(write_synthetic_model(b, dir.file("b.gguf"), 1).ok());
  ASSERT_TRUE(write_synthetic_model(c, dir.file("c.gguf"), 1).ok());
  const auto fa = testing::read_all(dir.file("a.gguf"));
  EXPECT_EQ(fa, testing::read_all(dir.file("b.gguf")));  // thread count does not matter
  EXPECT_NE(fa, testing::read_all(dir.file("c.gguf")));
}

TEST(Mkmodel, ShardsOpenAndValidate) {
  TempDir dir;
  SynthOptions o;
  o.n_expert = 4;
  auto paths = write_synthetic_model(o, dir.file("m.gguf"), 3);
  ASSERT_TRUE(paths.ok()) << paths.status();
  ASSERT_EQ(paths->size(), 3u);
  EXPECT_EQ((*paths)[0], dir.file("m-00001-of-00003.gguf"));
  auto m = gguf::Model::open((*paths)[2]);
  ASSERT_TRUE(m.ok()) << m.status();
  auto c = config::from_gguf(**m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_expert, 4u);
  EXPECT_TRUE(config::validate_tensors(*c, **m).ok());
}

TEST(Mkmodel, PerfPlanHasReleasedShape) {
  SynthOptions o;
  o.preset = "perf";
  auto plan = plan_synthetic_model(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 3 global + 24 per layer + 4 per KV source (+1 compressor gate for the 3 ratio-2 ones)
  // + 2 per index source + 4 per Engram layer.
  EXPECT_EQ(plan->n_tensors, 3u + 40 * 24 + 4 * 4 + 3 + 8 * 2 + 2 * 4);
  EXPECT_GT(plan->total_bytes, 10ull << 30);
  EXPECT_LT(plan->total_bytes, 60ull << 30);
  o.preset = "huge";
  EXPECT_FALSE(plan_synthetic_model(o).ok());
  o.preset = "perf";
  o.n_expert = 3;  // fewer than top-6
  EXPECT_FALSE(plan_synthetic_model(o).ok());
}

}  // namespace
}  // namespace dsflash::tools
