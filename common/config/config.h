// The DeepSeek-V4.1 model configuration, built from GGUF metadata (Family A keys,
// spec/model-v41.md §4.1, with released defaults for what Family A does not carry), the
// derived layer-role table (§1.2), the Engram hash constants with their checks (§3.2), and
// the validation of a file's tensor inventory against the configuration. Immutable once built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/status.h"

namespace dsflash::config {

// The two public GGUF conventions for V4.1 (spec §4).
enum class Family { kA, kB };
const char* family_name(Family f);

// Attention roles of a layer (spec §1.2; names follow the S7 derivation).
enum class LayerRole {
  kSwaOnly,               // ratio 0: sliding window only
  kKvIndexSource,         // owns compressor + index keys + its own top-k
  kKvSource,              // owns compressor + index keys, reuses an earlier top-k (not in the release)
  kCandidateSource,       // KV + index source that also publishes candidate blocks
  kCandidateIndexSource,  // own indexer, candidate-masked
  kIndexSource,           // own indexer without candidates (not in the release)
  kConsumerRatio2,
  kConsumerRatio1,
};
const char* role_name(LayerRole r);

struct LayerConfig {
  int index = 0;
  int compress_ratio = 0;     // 0, 1 or 2
  LayerRole role = LayerRole::kSwaOnly;
  bool is_kv_source = false;  // owns a compressor and index keys
  bool is_index_source = false;
  bool is_candidate_source = false;
  bool uses_candidates = false;
  int kv_source = -1;         // layer whose compressed cache this layer reads (-1: none)
  int index_source = -1;      // layer whose top-k this layer uses (-1: none)
  bool has_engram = false;    // Engram update applied before this block
  float swiglu_limit_exp = 0;
  float swiglu_limit_shexp = 0;
};

struct EngramConfig {
  std::vector<int> layer_ids;            // e.g. [1, 14]
  uint32_t n_heads = 0;                  // heads per n-gram size
  uint32_t head_dim = 0;                 // row width
  uint32_t max_ngram = 0;                // 4: 2-, 3- and 4-grams
  std::vector<uint64_t> multipliers;     // [layer][lookback 0..max_ngram-1]
  std::vector<uint64_t> primes;          // [layer][n-1][head]
  std::vector<uint64_t> offsets;         // [layer][col], exclusive prefix sums per layer
  std::vector<uint64_t> rows;            // table rows per layer (sum of its primes)
  std::vector<int32_t> token_map;        // raw id -> compressed id
  uint32_t pad_id = 0;                   // mapped pad
  uint64_t compressed_vocab = 0;
  uint32_t cols() const { return (max_ngram - 1) * n_heads; }  // row ids per layer per token
};

struct ModelConfig {
  Family family = Family::kA;
  std::string name;
  uint32_t n_vocab = 0, n_ctx = 0, n_embd = 0, n_layer = 0;
  uint32_t n_head = 0, head_dim = 0, rope_dims = 0;
  uint32_t q_lora_rank = 0, o_groups = 0, o_lora_rank = 0, window = 0;
  uint32_t n_index_head = 0, index_head_dim = 0, index_topk = 0;
  uint32_t n_expert = 0, n_expert_used = 0, n_expert_shared = 0, expert_ffn = 0, shared_ffn = 0;
  uint32_t hc_mult = 0, hc_sinkhorn_iters = 0;
  float hc_eps = 0, norm_eps = 0;
  float rope_theta = 0, compress_rope_theta = 0;
  float yarn_factor = 0, yarn_beta_fast = 0, yarn_beta_slow = 0;
  uint32_t yarn_orig_ctx = 0;
  float route_scale = 0;
  bool norm_topk = true;
  std::string score_func;                // "sqrtsoftplus"
  std::vector<int> compress_ratios;      // n_layer (+ draft layers) entries
  std::vector<int> kv_source_layers, index_source_layers;
  int candidate_source = -1;
  uint32_t candidate_topk_blocks = 0, candidate_block_size = 0;
  std::vector<LayerConfig> layers;
  EngramConfig engram;
  // Where the source/candidate schedule came from: "keys", "tensors" or "released defaults".
  std::string schedule_origin;

  uint32_t hc_mix() const { return (2 + hc_mult) * hc_mult; }  // 24 for 4 streams
};

// Builds and checks the configuration of a V4.1 model. Refuses other architectures,
// deepseek4 files carrying V4.1 tensors, Family B files, and files without the Engram
// constants (naming the repair). Reports every problem found in one error.
StatusOr<ModelConfig> from_gguf(const gguf::Model& model);

// Checks that every tensor the configuration needs is present with its shape and a usable
// type. Reports all problems in one error.
Status validate_tensors(const ModelConfig& cfg, const gguf::Model& model);

// Multi-line human-readable summary (used by `dsflash inspect`).
std::string describe(const ModelConfig& cfg);

// Derives the layer table from ratios, sources and candidates (exposed for tests and for
// the synthetic-model writer). Errors name the layer whose schedule is inconsistent.
StatusOr<std::vector<LayerConfig>> derive_layers(const ModelConfig& cfg);

// The released model's attention schedule (spec §1.1), which Family-A files do not carry.
struct ReleasedSchedule {
  std::vector<int> compress_ratios;  // 43 entries: 40 backbone layers + 3 draft layers
  std::vector<int> kv_source_layers, index_source_layers, engram_layer_ids;
  int candidate_source = 0;
  uint32_t candidate_topk_blocks = 0, candidate_block_size = 0;
};
ReleasedSchedule released_schedule();

// Engram layout helpers (spec §3.2): the `count` consecutive primes above `start`, and
// per-layer offsets (exclusive prefix sums). Checks multipliers and primes.
std::vector<uint64_t> primes_above(uint64_t start, size_t count);
Status check_engram(const EngramConfig& e);

}  // namespace dsflash::config
