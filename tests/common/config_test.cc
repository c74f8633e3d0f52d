// Model configuration: the golden file's configuration and roles, the released schedule,
// Engram constants, and refusal of wrong architectures, Family B, missing constants and bad
// tensor inventories (all problems reported at once).
#include <functional>
#include <set>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace dsflash::config {
namespace {

using testing::TempDir;

std::unique_ptr<gguf::Model> golden() {
  auto m = gguf::Model::open(testing::golden_dir() + "/tiny_a.gguf");
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

// Copies the golden model with edited metadata and tensors, then opens the copy.
struct Edit {
  std::function<void(gguf::Metadata&)> kv = [](gguf::Metadata&) {};
  std::set<std::string> drop;
  std::map<std::string, std::vector<uint64_t>> reshape;  // same byte count, other shape
  std::map<std::string, std::string> rename;
};
std::unique_ptr<gguf::Model> edited(const TempDir& dir, const Edit& e) {
  auto src = golden();
  gguf::Metadata kv = src->metadata();
  e.kv(kv);
  gguf::Writer w;
  for (auto& [k, v] : kv) w.set(k, v);
  const gguf::Model* m = src.get();
  for (const auto& t : src->tensors()) {
    if (e.drop.count(t.name)) continue;
    auto ne = e.reshape.count(t.name) ? e.reshape.at(t.name) : t.ne;
    const std::string name = e.rename.count(t.name) ? e.rename.at(t.name) : t.name;
    EXPECT_TRUE(w.add_tensor(name, ne, t.type, [m, t](uint8_t* dst, uint64_t n) { return m->read(t, 0, dst, n); }).ok());
  }
  EXPECT_TRUE(w.write(dir.file("edited.gguf")).ok());
  auto out = gguf::Model::open(dir.file("edited.gguf"));
  EXPECT_TRUE(out.ok()) << out.status();
  return std::move(*out);
}

void set_key(gguf::Metadata& kv, const std::string& key, gguf::Value v) {
  for (auto& [k, old] : kv) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv.emplace_back(key, std::move(v));
}
void erase_key(gguf::Metadata& kv, const std::string& key) {
  std::erase_if(kv, [&](const auto& p) { return p.first == key; });
}

TEST(Config, GoldenFile) {
  auto m = golden();
  auto c = from_gguf(*m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 6u);
  EXPECT_EQ(c->n_embd, 256u);
  EXPECT_EQ(c->n_vocab, 512u);
  EXPECT_EQ(c->norm_eps, 1e-20f);
  EXPECT_EQ(c->hc_mix(), 24u);
  EXPECT_EQ(c->schedule_origin, "keys");
  const std::vector<LayerRole> roles = {LayerRole::kSwaOnly, LayerRole::kKvIndexSource, LayerRole::kConsumerRatio2,
                                        LayerRole::kCandidateSource, LayerRole::kConsumerRatio1,
                                        LayerRole::kCandidateIndexSource};
  for (size_t l = 0; l < 6; ++l) EXPECT_EQ(c->layers[l].role, roles[l]) << "layer " << l;
  EXPECT_EQ(c->layers[2].kv_source, 1);
  EXPECT_EQ(c->layers[5].kv_source, 3);
  EXPECT_EQ(c->layers[5].index_source, 5);
  EXPECT_TRUE(c->layers[5].uses_candidates);
  EXPECT_TRUE(c->layers[0].has_engram && c->layers[1].has_engram);
  EXPECT_EQ(c->engram.rows, (std::vector<uint64_t>{660, 864}));
  EXPECT_EQ(c->engram.multipliers[0], 22948963341361471ull);
  EXPECT_EQ(c->engram.compressed_vocab, 256u);
  EXPECT_EQ(c->engram.pad_id, 1u);
  EXPECT_TRUE(validate_tensors(*c, *m).ok());
}

TEST(Config, ScheduleDerivedFromTensorsWhenKeysAreAbsent) {
  TempDir dir;
  Edit e;
  e.kv = [](gguf::Metadata& kv) {
    for (const char* k : {"deepseek41.attention.kv_source_layers", "deepseek41.attention.index_source_layers",
                          "deepseek41.attention.candidate_source_layer"}) {
      erase_key(kv, k);
    }
  };
  auto m = edited(dir, e);
  auto c = from_gguf(*m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->schedule_origin, "tensors");
  EXPECT_EQ(c->kv_source_layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(c->index_source_layers, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(c->candidate_source, 3);
  EXPECT_EQ(c->layers[5].role, LayerRole::kCandidateIndexSource);
}

TEST(Config, ReleasedScheduleRoles) {
  const ReleasedSchedule r = released_schedule();
  ASSERT_EQ(r.compress_ratios.size(), 43u);
  ModelConfig c;
  c.n_layer = 40;
  c.compress_ratios = r.compress_ratios;
  c.kv_source_layers = r.kv_source_layers;
  c.index_source_layers = r.index_source_layers;
  c.candidate_source = r.candidate_source;
  c.engram.layer_ids = r.engram_layer_ids;
  auto layers = derive_layers(c);
  ASSERT_TRUE(layers.ok()) << layers.status();
  auto role = [&](int l) { return (*layers)[l].role; };
  EXPECT_EQ(role(0), LayerRole::kSwaOnly);
  EXPECT_EQ(role(1), LayerRole::kSwaOnly);
  EXPECT_EQ(role(2), LayerRole::kKvIndexSource);
  for (int l : {3, 7, 9, 13, 15, 19}) EXPECT_EQ(role(l), LayerRole::kConsumerRatio2) << l;
  EXPECT_EQ(role(14), LayerRole::kKvIndexSource);
  EXPECT_EQ(role(20), LayerRole::kCandidateSource);
  for (int l : {24, 28, 32, 36}) EXPECT_EQ(role(l), LayerRole::kCandidateIndexSource) << l;
  for (int l : {21, 23, 25, 31, 39}) EXPECT_EQ(role(l), LayerRole::kConsumerRatio1) << l;
  EXPECT_EQ((*layers)[27].index_source, 24);
  EXPECT_EQ((*layers)[39].index_source, 36);
  EXPECT_EQ((*layers)[39].kv_source, 20);
  EXPECT_EQ((*layers)[13].kv_source, 8);
  EXPECT_FALSE((*layers)[20].uses_candidates);
  EXPECT_TRUE((*layers)[14].has_engram);
  // A consumer whose KV source has another ratio is refused.
  c.kv_source_layers = {2, 8, 14};
  auto bad = derive_layers(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("reads KV source 14 of ratio 2"), std::string::npos) << bad.status();
}

TEST(Config, ReleasedEngramPrimes) {
  const auto p = primes_above(15999999, 48);
  EXPECT_EQ(p[0], 16000057u);
  EXPECT_EQ(p[23], 16000463u);
  EXPECT_EQ(p[47], 16000889u);
  uint64_t l1 = 0, l14 = 0;
  for (int i = 0; i < 24; ++i) l1 += p[i];
  for (int i = 24; i < 48; ++i) l14 += p[i];
  EXPECT_EQ(l1, 384006168u);
  EXPECT_EQ(l14, 384016682u);
}

TEST(Config, RefusesOtherArchitectures) {
  TempDir dir;
  Edit e;
  e.kv = [](gguf::Metadata& kv) { set_key(kv, "general.architecture", gguf::Value::str("llama")); };
  auto c = from_gguf(*edited(dir, e));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is a 'llama' model"), std::string::npos) << c.status();
}

TEST(Config, RefusesDeepseek4FilesCarryingV41Tensors) {
  TempDir dir;
  Edit e;
  e.kv = [](gguf::Metadata& kv) { set_key(kv, "general.architecture", gguf::Value::str("deepseek4")); };
  auto c = from_gguf(*edited(dir, e));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("reconvert"), std::string::npos) << c.status();
}

TEST(Config, RefusesFamilyB) {
  TempDir dir;
  Edit e;
  e.kv = [](gguf::Metadata& kv) { set_key(kv, "deepseek41.engram.encoding", gguf::Value::str("e4m3_e8m0_32_row264")); };
  auto c = from_gguf(*edited(dir, e));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("Family B"), std::string::npos) << c.status();
}

TEST(Config, MissingEngramConstantsNameTheRepair) {
  TempDir dir;
  Edit e;
  e.kv = [](gguf::Metadata& kv) {
    for (const char* k : {"deepseek41.engram.multipliers", "deepseek41.engram.primes", "deepseek41.engram.offsets",
                          "deepseek41.engram.token_map", "deepseek41.engram.pad_id"}) {
      erase_key(kv, k);
    }
  };
  auto c = from_gguf(*edited(dir, e));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("fix_gguf_engram_kv.py"), std::string::npos) << c.status();
}

TEST(Config, BadEngramConstantsAreAllReported) {
  TempDir dir;
  Edit e;
  e.kv = [](gguf::Metadata& kv) {
    auto* mult = &kv[0].second;
    for (auto& [k, v] : kv) if (k == "deepseek41.engram.multipliers") mult = &v;
    auto vals = *mult->u64s();
    vals[1] += 1;                  // even
    vals[2] = 1ull << 62;          // overflows for compressed ids up to 255
    *mult = gguf::Value::array(gguf::ValueType::kU64, vals);
    set_key(kv, "deepseek41.engram.num_embeddings", gguf::Value::array<uint64_t>(gguf::ValueType::kU64, {660, 865}));
  };
  auto c = from_gguf(*edited(dir, e));
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("primes sum to 864 but engram.num_embeddings says 865"), std::string::npos) << msg;
}

TEST(Config, MultiplierChecks) {
  EngramConfig e;
  e.layer_ids = {0};
  e.n_heads = 1;
  e.max_ngram = 2;
  e.multipliers = {4, 1ull << 62};
  e.primes = {101};
  e.offsets = {0};
  e.compressed_vocab = 256;
  const Status s = check_engram(e);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multipliers[0] = 4 is even"), std::string::npos) << s;
  EXPECT_NE(s.message().find("multipliers[1] = 4611686018427387904 overflows"), std::string::npos) << s;
  e.multipliers = {3, 5};
  e.primes = {100};
  EXPECT_NE(check_engram(e).message().find("is not prime"), std::string::npos);
}

TEST(Config, TensorInventoryReportsEveryProblem) {
  TempDir dir;
  Edit e;
  e.drop = {"blk.2.attn_q_b.weight", "blk.1.indexer.attn_k.weight"};
  e.reshape = {{"blk.0.attn_sinks.weight", {2, 2}}};
  auto m = edited(dir, e);
  auto c = from_gguf(*m);
  ASSERT_TRUE(c.ok()) << c.status();
  const Status s = validate_tensors(*c, *m);
  ASSERT_FALSE(s.ok());
  const std::string msg(s.message());
  EXPECT_NE(msg.find("3 tensor problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor blk.2.attn_q_b.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor blk.1.indexer.attn_k.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blk.0.attn_sinks.weight has shape [2, 2], expected [4]"), std::string::npos) << msg;
}

TEST(Config, MissingKeysAreAllNamed) {
  TempDir dir;
  Edit e;
  e.kv = [](gguf::Metadata& kv) {
    erase_key(kv, "deepseek41.attention.head_count");
    erase_key(kv, "deepseek41.expert_count");
  };
  auto c = from_gguf(*edited(dir, e));
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("missing key deepseek41.attention.head_count"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing key deepseek41.expert_count"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dsflash::config
