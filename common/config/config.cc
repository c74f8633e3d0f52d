// ModelConfig from GGUF metadata: architecture/family checks, Family-A keys with released
// defaults, the layer-role derivation and the Engram constants.
#include "common/config/config.h"

#include <algorithm>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dsflash::config {
namespace {

constexpr const char* kArch = "deepseek41";

constexpr int kReleasedCandidateSource = 20;
constexpr uint32_t kReleasedCandidateBlocks = 2048;
constexpr uint32_t kReleasedCandidateBlockSize = 8;

// Reads `deepseek41.<key>` values, collecting every problem instead of stopping at the first.
class Keys {
 public:
  explicit Keys(const gguf::Model& m) : m_(m) {}
  const gguf::Value* get(const std::string& key, bool required = true) {
    const gguf::Value* v = m_.find(absl::StrCat(kArch, ".", key));
    if (v == nullptr && required) problems.push_back(absl::StrCat("missing key ", kArch, ".", key));
    return v;
  }
  uint32_t u32(const std::string& key, std::optional<uint32_t> fallback = std::nullopt) {
    const gguf::Value* v = get(key, !fallback.has_value());
    if (v == nullptr) return fallback.value_or(0);
    const auto u = v->as_u64();
    if (!u || *u > UINT32_MAX) {
      problems.push_back(absl::StrCat(kArch, ".", key, " = ", v->to_string(), " is not a 32-bit unsigned integer"));
      return 0;
    }
    return static_cast<uint32_t>(*u);
  }
  float f32(const std::string& key, std::optional<float> fallback = std::nullopt) {
    const gguf::Value* v = get(key, !fallback.has_value());
    if (v == nullptr) return fallback.value_or(0.0f);
    const auto f = v->as_f64();
    if (!f) {
      problems.push_back(absl::StrCat(kArch, ".", key, " = ", v->to_string(), " is not a number"));
      return 0.0f;
    }
    return static_cast<float>(*f);
  }
  // Integer array as T: signed reads via Value::ints, unsigned (u64 range) via Value::u64s.
  template <typename T>
  std::vector<T> ints(const std::string& key, bool required = true) {
    const gguf::Value* v = get(key, required);
    if (v == nullptr) return {};
    auto convert = [&](auto r) -> std::vector<T> {
      if (!r.ok()) {
        problems.push_back(absl::StrCat(kArch, ".", key, ": ", r.status().message()));
        return {};
      }
      return std::vector<T>(r->begin(), r->end());
    };
    if constexpr (std::is_same_v<T, uint64_t>) return convert(v->u64s());
    else return convert(v->ints());
  }
  std::vector<uint64_t> u64s(const std::string& key, bool required = true) { return ints<uint64_t>(key, required); }
  std::vector<std::string> problems;

 private:
  const gguf::Model& m_;
};

bool is_prime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

Status refuse_wrong_architecture(const gguf::Model& m) {
  const gguf::Value* arch = m.find("general.architecture");
  const std::string name = arch && arch->as_string() ? *arch->as_string() : "";
  if (name == kArch) return absl::OkStatus();
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "' has no general.architecture string: not a model GGUF"));
  }
  if (name == "deepseek4") {
    const bool v41_tensors = std::any_of(m.tensors().begin(), m.tensors().end(), [](const gguf::TensorInfo& t) {
      return t.name.find("engram") != std::string::npos;
    });
    if (v41_tensors) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", m.path(), "' says general.architecture = deepseek4 but carries DeepSeek-V4.1 tensors (engram_*): it was "
          "converted before the deepseek41 architecture existed (2026-09-10); reconvert it with a current converter"));
    }
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "' is a DeepSeek-V4 model (deepseek4); dsflash serves "
                                                   "DeepSeek-V4.1 (deepseek41) only"));
  }
  return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "' is a '", name,
                                                 "' model; dsflash serves DeepSeek-V4.1 (general.architecture = deepseek41)"));
}

Status refuse_family_b(const gguf::Model& m) {
  const bool b = m.find("deepseek41.engram.encoding") != nullptr ||
                 std::any_of(m.tensors().begin(), m.tensors().end(),
                             [](const gguf::TensorInfo& t) { return t.name.find("engram_kv.") != std::string::npos; });
  if (!b) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "'", m.path(), "' is a Family B (ds4 / antirez) V4.1 GGUF (engram_kv tensors, deepseek41.engram.encoding); "
      "dsflash reads Family A (llama.cpp-style) files such as vcruz305/DeepSeek-V4.1-Flash-GGUF"));
}

// Schedule keys, else tensor presence, else the released defaults.
void read_schedule(Keys& k, const gguf::Model& m, ModelConfig& c) {
  c.kv_source_layers = k.ints<int>("attention.kv_source_layers", false);
  c.index_source_layers = k.ints<int>("attention.index_source_layers", false);
  const gguf::Value* cand = k.get("attention.candidate_source_layer", false);
  if (!c.kv_source_layers.empty() && !c.index_source_layers.empty()) {
    c.schedule_origin = "keys";
  } else {
    std::vector<int> kv, idx;
    for (uint32_t l = 0; l < c.n_layer; ++l) {
      if (m.find_tensor(absl::StrCat("blk.", l, ".attn_compressor_kv.weight"))) kv.push_back(static_cast<int>(l));
      if (m.find_tensor(absl::StrCat("blk.", l, ".indexer.attn_q_b.weight"))) idx.push_back(static_cast<int>(l));
    }
    if (!kv.empty() && !idx.empty()) {
      c.kv_source_layers = kv;
      c.index_source_layers = idx;
      c.schedule_origin = "tensors";
    } else {
      const ReleasedSchedule r = released_schedule();
      c.kv_source_layers = r.kv_source_layers;
      c.index_source_layers = r.index_source_layers;
      c.schedule_origin = "released defaults";
    }
  }
  if (cand != nullptr) {
    c.candidate_source = static_cast<int>(cand->as_i64().value_or(-1));
  } else if (c.schedule_origin == "released defaults") {
    c.candidate_source = kReleasedCandidateSource;
  } else {
    // The candidate source is the first ratio-1 KV source (layer 20 in the release).
    c.candidate_source = -1;
    for (int l : c.kv_source_layers) {
      if (l >= 0 && static_cast<size_t>(l) < c.compress_ratios.size() && c.compress_ratios[l] == 1) {
        c.candidate_source = l;
        break;
      }
    }
  }
  c.candidate_topk_blocks = k.u32("attention.candidate_topk_blocks", kReleasedCandidateBlocks);
  c.candidate_block_size = k.u32("attention.candidate_block_size", kReleasedCandidateBlockSize);
}

void read_engram(Keys& k, const gguf::Model& m, ModelConfig& c) {
  EngramConfig& e = c.engram;
  e.layer_ids = k.ints<int>("engram.layer_ids");
  e.n_heads = k.u32("engram.head_count");
  e.head_dim = k.u32("engram.key_length");
  e.max_ngram = k.u32("engram.max_ngram_size");
  const bool has_constants = m.find("deepseek41.engram.multipliers") && m.find("deepseek41.engram.primes") &&
                             m.find("deepseek41.engram.token_map") && m.find("deepseek41.engram.pad_id");
  if (!has_constants) {
    const bool old_prefix = m.find("deepseek4.engram.head_count") != nullptr;
    k.problems.push_back(absl::StrCat(
        "the Engram hash constants (deepseek41.engram.multipliers, primes, offsets, token_map, pad_id) are missing",
        old_prefix ? " and the Engram shape keys sit under a literal deepseek4.engram.* prefix" : "",
        ": the file was made by a converter before 2026-09-11; repair shard 1 with "
        "vcruz305/DeepSeek-V4.1-Flash-GGUF-DGX-Spark-recipe scripts/fix_gguf_engram_kv.py or download the fixed files"));
    return;
  }
  e.multipliers = k.u64s("engram.multipliers");
  e.primes = k.u64s("engram.primes");
  e.offsets = k.u64s("engram.offsets", false);
  e.token_map = k.ints<int32_t>("engram.token_map");
  e.pad_id = k.u32("engram.pad_id");
  const gguf::Value* cv = k.get("engram.compressed_vocab_size", false);
  if (cv != nullptr) {
    e.compressed_vocab = cv->as_u64().value_or(0);
  } else if (!e.token_map.empty()) {
    e.compressed_vocab = static_cast<uint64_t>(*std::max_element(e.token_map.begin(), e.token_map.end())) + 1;
  }
  const size_t n_cols = static_cast<size_t>(e.max_ngram > 0 ? e.max_ngram - 1 : 0) * e.n_heads;
  if (e.offsets.empty() && e.primes.size() == n_cols * e.layer_ids.size()) {
    for (size_t l = 0; l < e.layer_ids.size(); ++l) {
      uint64_t acc = 0;
      for (size_t i = 0; i < n_cols; ++i) {
        e.offsets.push_back(acc);
        acc += e.primes[l * n_cols + i];
      }
    }
  }
  const std::vector<uint64_t> declared = k.u64s("engram.num_embeddings", false);
  if (e.primes.size() == n_cols * e.layer_ids.size()) {
    for (size_t l = 0; l < e.layer_ids.size(); ++l) {
      uint64_t sum = 0;
      for (size_t i = 0; i < n_cols; ++i) sum += e.primes[l * n_cols + i];
      e.rows.push_back(sum);
      if (l < declared.size() && declared[l] != sum) {
        k.problems.push_back(absl::StrCat("Engram layer ", e.layer_ids[l], ": primes sum to ", sum,
                                          " but engram.num_embeddings says ", declared[l]));
      }
    }
  }
}

}  // namespace

const char* family_name(Family f) { return f == Family::kA ? "A (llama.cpp-style)" : "B (ds4)"; }

const char* role_name(LayerRole r) {
  switch (r) {
    case LayerRole::kSwaOnly: return "SWA_ONLY";
    case LayerRole::kKvIndexSource: return "KV_INDEX_SOURCE";
    case LayerRole::kKvSource: return "KV_SOURCE";
    case LayerRole::kCandidateSource: return "CANDIDATE_SOURCE";
    case LayerRole::kCandidateIndexSource: return "CANDIDATE_INDEX_SOURCE";
    case LayerRole::kIndexSource: return "INDEX_SOURCE";
    case LayerRole::kConsumerRatio2: return "CONSUMER_RATIO2";
    case LayerRole::kConsumerRatio1: return "CONSUMER_RATIO1";
  }
  return "?";
}

ReleasedSchedule released_schedule() {
  ReleasedSchedule r;
  r.compress_ratios = {0, 0};
  r.compress_ratios.insert(r.compress_ratios.end(), 18, 2);
  r.compress_ratios.insert(r.compress_ratios.end(), 20, 1);
  r.compress_ratios.insert(r.compress_ratios.end(), 3, 0);  // the three DSpark draft layers
  r.kv_source_layers = {2, 8, 14, 20};
  r.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  r.candidate_source = kReleasedCandidateSource;
  r.candidate_topk_blocks = kReleasedCandidateBlocks;
  r.candidate_block_size = kReleasedCandidateBlockSize;
  r.engram_layer_ids = {1, 14};
  return r;
}

std::vector<uint64_t> primes_above(uint64_t start, size_t count) {
  std::vector<uint64_t> out;
  for (uint64_t n = start + 1; out.size() < count; ++n) {
    if (is_prime(n)) out.push_back(n);
  }
  return out;
}

Status check_engram(const EngramConfig& e) {
  std::vector<std::string> p;
  const size_t n_layers = e.layer_ids.size();
  if (e.max_ngram < 2) p.push_back(absl::StrCat("engram.max_ngram_size ", e.max_ngram, " < 2"));
  const size_t n_cols = e.cols();
  if (e.multipliers.size() != n_layers * e.max_ngram) {
    p.push_back(absl::StrCat("engram.multipliers has ", e.multipliers.size(), " entries; expected ", n_layers, " layers x ",
                             e.max_ngram, " look-backs"));
  }
  if (e.compressed_vocab == 0) p.push_back("the Engram compressed vocabulary is empty");
  for (size_t i = 0; i < e.multipliers.size(); ++i) {
    const uint64_t m = e.multipliers[i];
    if (m % 2 == 0) p.push_back(absl::StrCat("engram.multipliers[", i, "] = ", m, " is even"));
    const unsigned __int128 prod = static_cast<unsigned __int128>(e.compressed_vocab > 0 ? e.compressed_vocab - 1 : 0) * m;
    if (prod >= (static_cast<unsigned __int128>(1) << 63)) {
      p.push_back(absl::StrCat("engram.multipliers[", i, "] = ", m, " overflows int64 for compressed ids up to ",
                               e.compressed_vocab - 1));
    }
  }
  if (e.primes.size() != n_layers * n_cols) {
    p.push_back(absl::StrCat("engram.primes has ", e.primes.size(), " entries; expected ", n_layers * n_cols));
  } else {
    std::set<uint64_t> seen;
    for (size_t i = 0; i < e.primes.size(); ++i) {
      if (!is_prime(e.primes[i])) p.push_back(absl::StrCat("engram.primes[", i, "] = ", e.primes[i], " is not prime"));
      if (!seen.insert(e.primes[i]).second) p.push_back(absl::StrCat("engram.primes[", i, "] = ", e.primes[i], " repeats"));
    }
    if (e.offsets.size() != e.primes.size()) {
      p.push_back(absl::StrCat("engram.offsets has ", e.offsets.size(), " entries; expected ", e.primes.size()));
    } else {
      for (size_t l = 0; l < n_layers; ++l) {
        uint64_t acc = 0;
        for (size_t i = 0; i < n_cols; ++i) {
          const size_t at = l * n_cols + i;
          if (e.offsets[at] != acc) {
            p.push_back(absl::StrCat("engram.offsets[", at, "] = ", e.offsets[at], "; the prefix sum of the primes is ", acc));
            break;
          }
          acc += e.primes[at];
        }
      }
    }
  }
  for (size_t i = 0; i < e.token_map.size(); ++i) {
    if (e.token_map[i] < 0 || static_cast<uint64_t>(e.token_map[i]) >= e.compressed_vocab) {
      p.push_back(absl::StrCat("engram.token_map[", i, "] = ", e.token_map[i], " is outside [0, ", e.compressed_vocab, ")"));
      break;
    }
  }
  if (e.pad_id >= e.compressed_vocab) {
    p.push_back(absl::StrCat("engram.pad_id ", e.pad_id, " is outside the compressed vocabulary (", e.compressed_vocab, ")"));
  }
  if (p.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(p, "; "));
}

StatusOr<std::vector<LayerConfig>> derive_layers(const ModelConfig& c) {
  std::vector<std::string> p;
  if (c.compress_ratios.size() < c.n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("attention.compress_ratios has ", c.compress_ratios.size(),
                                                   " entries for ", c.n_layer, " layers"));
  }
  const std::set<int> kv(c.kv_source_layers.begin(), c.kv_source_layers.end());
  const std::set<int> idx(c.index_source_layers.begin(), c.index_source_layers.end());
  const std::set<int> engram(c.engram.layer_ids.begin(), c.engram.layer_ids.end());
  for (int l : kv) {
    if (l < 0 || static_cast<uint32_t>(l) >= c.n_layer || c.compress_ratios[l] == 0) {
      p.push_back(absl::StrCat("KV source layer ", l, " is out of range or has compress ratio 0"));
    }
  }
  for (int l : idx) {
    if (l < 0 || static_cast<uint32_t>(l) >= c.n_layer || c.compress_ratios[l] == 0) {
      p.push_back(absl::StrCat("index source layer ", l, " is out of range or has compress ratio 0"));
    }
  }
  if (c.candidate_source >= 0 && !kv.count(c.candidate_source)) {
    p.push_back(absl::StrCat("candidate source layer ", c.candidate_source, " is not a KV source"));
  }
  std::vector<LayerConfig> layers(c.n_layer);
  int last_kv = -1, last_idx = -1;
  for (uint32_t i = 0; i < c.n_layer; ++i) {
    LayerConfig& L = layers[i];
    const int l = static_cast<int>(i);
    L.index = l;
    L.compress_ratio = c.compress_ratios[i];
    L.has_engram = engram.count(l) > 0;
    if (L.compress_ratio < 0 || L.compress_ratio > 2) {
      p.push_back(absl::StrCat("layer ", l, ": compress ratio ", L.compress_ratio, " (V4.1 uses 0, 1 and 2)"));
      continue;
    }
    L.is_kv_source = kv.count(l) > 0;
    L.is_index_source = idx.count(l) > 0;
    if (L.is_kv_source) last_kv = l;
    if (L.is_index_source) last_idx = l;
    if (L.compress_ratio == 0) {
      if (L.is_kv_source || L.is_index_source) p.push_back(absl::StrCat("layer ", l, ": a source with ratio 0"));
      L.role = LayerRole::kSwaOnly;
      continue;
    }
    L.kv_source = last_kv;
    L.index_source = last_idx;
    if (last_kv < 0) {
      p.push_back(absl::StrCat("layer ", l, " (ratio ", L.compress_ratio, ") has no KV source at or before it"));
    } else if (c.compress_ratios[last_kv] != L.compress_ratio) {
      p.push_back(absl::StrCat("layer ", l, " (ratio ", L.compress_ratio, ") reads KV source ", last_kv, " of ratio ",
                               c.compress_ratios[last_kv]));
    }
    if (last_idx < 0) p.push_back(absl::StrCat("layer ", l, " has no index source at or before it"));
    L.is_candidate_source = l == c.candidate_source;
    L.uses_candidates = L.is_index_source && c.candidate_source >= 0 && c.candidate_source < l;
    if (L.is_kv_source) {
      L.role = L.is_candidate_source ? LayerRole::kCandidateSource
               : L.is_index_source   ? LayerRole::kKvIndexSource
                                     : LayerRole::kKvSource;
    } else if (L.is_index_source) {
      L.role = L.uses_candidates ? LayerRole::kCandidateIndexSource : LayerRole::kIndexSource;
    } else {
      L.role = L.compress_ratio == 2 ? LayerRole::kConsumerRatio2 : LayerRole::kConsumerRatio1;
    }
  }
  if (!p.empty()) return absl::InvalidArgumentError(absl::StrCat("inconsistent layer schedule: ", absl::StrJoin(p, "; ")));
  return layers;
}

namespace {

// The Family-A hyperparameter keys (spec §4.1), with released defaults where optional.
void read_hparams(Keys& k, const gguf::Model& m, ModelConfig& c) {
  c.n_vocab = k.u32("vocab_size", 0);
  if (c.n_vocab == 0) {
    if (const gguf::Value* t = m.find("tokenizer.ggml.tokens")) c.n_vocab = static_cast<uint32_t>(t->size());
    if (c.n_vocab == 0) k.problems.push_back("no vocab_size key and no tokenizer.ggml.tokens");
  }
  c.n_ctx = k.u32("context_length");
  c.n_embd = k.u32("embedding_length");
  c.n_layer = k.u32("block_count");
  c.n_head = k.u32("attention.head_count");
  c.head_dim = k.u32("attention.key_length");
  if (k.u32("attention.value_length", c.head_dim) != c.head_dim) k.problems.push_back("value_length differs from key_length (V4.1 has K = V)");
  c.rope_dims = k.u32("rope.dimension_count");
  c.q_lora_rank = k.u32("attention.q_lora_rank");
  c.o_groups = k.u32("attention.output_group_count");
  c.o_lora_rank = k.u32("attention.output_lora_rank");
  c.window = k.u32("attention.sliding_window");
  c.n_index_head = k.u32("attention.indexer.head_count");
  c.index_head_dim = k.u32("attention.indexer.key_length");
  c.index_topk = k.u32("attention.indexer.top_k");
  c.n_expert = k.u32("expert_count");
  c.n_expert_used = k.u32("expert_used_count");
  c.n_expert_shared = k.u32("expert_shared_count", 1);
  c.expert_ffn = k.u32("expert_feed_forward_length");
  c.shared_ffn = c.expert_ffn * c.n_expert_shared;
  c.hc_mult = k.u32("hyper_connection.count");
  c.hc_sinkhorn_iters = k.u32("hyper_connection.sinkhorn_iterations");
  c.hc_eps = k.f32("hyper_connection.epsilon");
  c.norm_eps = k.f32("attention.layer_norm_rms_epsilon");
  c.rope_theta = k.f32("rope.freq_base");
  c.compress_rope_theta = k.f32("attention.compress_rope_freq_base");
  c.yarn_factor = k.f32("rope.scaling.factor");
  c.yarn_orig_ctx = k.u32("rope.scaling.original_context_length");
  c.yarn_beta_fast = k.f32("rope.scaling.yarn_beta_fast", 32.0f);
  c.yarn_beta_slow = k.f32("rope.scaling.yarn_beta_slow", 1.0f);
  c.route_scale = k.f32("expert_weights_scale");
  if (const gguf::Value* v = k.get("expert_weights_norm", false)) c.norm_topk = v->as_bool().value_or(true);
  c.score_func = "sqrtsoftplus";
  if (const gguf::Value* v = k.get("expert_scoring_func", false); v && v->as_string()) c.score_func = *v->as_string();
  if (c.score_func != "sqrtsoftplus") k.problems.push_back(absl::StrCat("expert scoring function '", c.score_func, "' is not sqrtsoftplus"));
  if (k.u32("hash_layer_count", 0) != 0) k.problems.push_back("hash_layer_count > 0: hash-routed MoE layers are DeepSeek-V4, not V4.1");
  c.compress_ratios = k.ints<int>("attention.compress_ratios");
}

// Upper bounds far above any V4.1 variant (the released model has 43 layers, 256 experts,
// width 7168-class): a hostile file cannot make the loader loop or allocate without bound.
std::vector<std::string> check_limits(const ModelConfig& c) {
  std::vector<std::string> p;
  auto limit = [&](uint64_t v, uint64_t max, const char* key) {
    if (v > max) p.push_back(absl::StrCat(key, " = ", v, " exceeds the limit ", max));
  };
  limit(c.n_layer, 1024, "block_count");
  limit(c.n_expert, 1 << 16, "expert_count");
  limit(c.n_expert_used, 1 << 10, "expert_used_count");
  limit(c.n_embd, 1 << 17, "embedding_length");
  limit(c.n_head, 1 << 12, "attention.head_count");
  limit(c.head_dim, 1 << 12, "attention.key_length");
  limit(c.n_ctx, 1 << 24, "context_length");
  limit(c.n_vocab, 1 << 22, "vocab_size");
  limit(c.expert_ffn, 1 << 18, "expert_feed_forward_length");
  limit(c.n_expert_shared, 64, "expert_shared_count");
  limit(c.q_lora_rank, 1 << 16, "attention.q_lora_rank");
  limit(c.o_groups, 1 << 12, "attention.output_group_count");
  limit(c.o_lora_rank, 1 << 16, "attention.output_lora_rank");
  limit(c.window, 1 << 20, "attention.sliding_window");
  limit(c.n_index_head, 1 << 12, "attention.indexer.head_count");
  limit(c.index_head_dim, 1 << 12, "attention.indexer.key_length");
  limit(c.index_topk, 1 << 20, "attention.indexer.top_k");
  limit(c.hc_mult, 64, "hyper_connection.count");
  limit(c.hc_sinkhorn_iters, 1 << 12, "hyper_connection.sinkhorn_iterations");
  limit(c.yarn_orig_ctx, 1 << 24, "rope.scaling.original_context_length");
  return p;
}

// Plausibility of the hyperparameters and the Engram constants; every problem is listed.
std::vector<std::string> check_hparams(const ModelConfig& c) {
  std::vector<std::string> p;
  auto require = [&](bool ok, const std::string& what) { if (!ok) p.push_back(what); };
  require(c.n_layer > 0 && c.n_embd > 0 && c.n_head > 0 && c.head_dim > 0, "zero model dimension");
  require(c.rope_dims > 0 && c.rope_dims <= c.head_dim && c.rope_dims % 2 == 0, "rope.dimension_count must be even and <= key_length");
  require(c.o_groups > 0 && c.n_head % std::max(1u, c.o_groups) == 0, "head_count is not a multiple of output_group_count");
  require(c.n_expert > 0 && c.n_expert_used > 0 && c.n_expert_used <= c.n_expert, "expert_used_count must be in 1..expert_count");
  require(c.hc_mult > 0 && c.hc_sinkhorn_iters > 0, "hyper_connection.count and sinkhorn_iterations must be > 0");
  require(c.norm_eps > 0 && c.norm_eps < 1e-3f, absl::StrCat("layer_norm_rms_epsilon ", c.norm_eps, " is not V4.1's 1e-20-class epsilon"));
  require(c.index_topk > 0 && c.window > 0, "indexer.top_k and sliding_window must be > 0");
  require(c.engram.token_map.size() >= c.n_vocab,
          absl::StrCat("engram.token_map has ", c.engram.token_map.size(), " entries for a vocabulary of ", c.n_vocab));
  for (int l : c.engram.layer_ids) require(l >= 0 && static_cast<uint32_t>(l) < c.n_layer, absl::StrCat("Engram layer ", l, " out of range"));
  if (const Status s = check_engram(c.engram); !s.ok()) p.push_back(std::string(s.message()));
  return p;
}

}  // namespace

StatusOr<ModelConfig> from_gguf(const gguf::Model& m) {
  RETURN_IF_ERROR(refuse_wrong_architecture(m));
  RETURN_IF_ERROR(refuse_family_b(m));
  ModelConfig c;
  c.family = Family::kA;
  if (const gguf::Value* n = m.find("general.name"); n && n->as_string()) c.name = *n->as_string();
  Keys k(m);
  read_hparams(k, m, c);
  if (auto over = check_limits(c); !over.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "' is not a usable DeepSeek-V4.1 file: ", absl::StrJoin(over, "; ")));
  }
  read_schedule(k, m, c);
  read_engram(k, m, c);
  if (!k.problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "' is not a usable DeepSeek-V4.1 file: ", absl::StrJoin(k.problems, "; ")));
  }
  std::vector<std::string> p = check_hparams(c);
  std::vector<float> lim_exp, lim_shexp;
  if (const gguf::Value* v = m.find("deepseek41.swiglu_clamp_exp")) lim_exp = v->floats().value_or(std::vector<float>{});
  if (const gguf::Value* v = m.find("deepseek41.swiglu_clamp_shexp")) lim_shexp = v->floats().value_or(std::vector<float>{});
  if (p.empty()) {
    auto layers = derive_layers(c);
    if (!layers.ok()) {
      p.push_back(std::string(layers.status().message()));
    } else {
      c.layers = std::move(*layers);
      for (auto& L : c.layers) {
        L.swiglu_limit_exp = static_cast<size_t>(L.index) < lim_exp.size() ? lim_exp[L.index] : 10.0f;
        L.swiglu_limit_shexp = static_cast<size_t>(L.index) < lim_shexp.size() ? lim_shexp[L.index] : 10.0f;
      }
    }
  }
  if (!p.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "' has an invalid DeepSeek-V4.1 configuration: ", absl::StrJoin(p, "; ")));
  }
  return c;
}

}  // namespace dsflash::config
