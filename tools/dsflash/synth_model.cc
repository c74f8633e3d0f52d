// Synthetic V4.1 model writer (see synth_model.h). Weights are drawn from a counter-based
// generator keyed by (seed, tensor name, row block), so files are identical whatever the
// thread count, and each tensor is generated and quantised in parallel when it is written.
#include "tools/dsflash/synth_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/tokenizer/tokenizer.h"

namespace dsflash::tools {
namespace {

using gguf::Value;
using gguf::ValueType;
using quant::GgmlType;

// ---- preset dimensions ----------------------------------------------------------------------

struct Dims {
  uint32_t D, L, H, Dh, rope, q_lora, o_groups, o_rank, window, idx_heads, idx_dim, idx_topk;
  uint32_t E, E_used, F, hc, sinkhorn, ctx, yarn_orig;
  float yarn_factor;
  std::vector<int> ratios, kv, idx;
  int cand;
  uint32_t cand_blocks, cand_size;
  std::vector<int> engram_layers;
  uint32_t e_heads, e_dim, max_ngram, e_vocab_start;
  size_t n_merges, min_vocab;
  bool schedule_keys;  // Family-A files do not carry the schedule; tiny writes it like the golden file
  GgmlType t_attn, t_shexp, t_embd, t_out, t_gate_up, t_down, t_engram, t_dense_f;
};

Dims tiny_dims() {
  Dims d{};
  d.D = 256; d.L = 6; d.H = 4; d.Dh = 64; d.rope = 16; d.q_lora = 64; d.o_groups = 2; d.o_rank = 64;
  d.window = 16; d.idx_heads = 4; d.idx_dim = 64; d.idx_topk = 8;
  d.E = 8; d.E_used = 2; d.F = 256; d.hc = 4; d.sinkhorn = 20; d.ctx = 1024; d.yarn_orig = 32; d.yarn_factor = 4;
  d.ratios = {0, 2, 2, 1, 1, 1, 0};
  d.kv = {1, 3};
  d.idx = {1, 3, 5};
  d.cand = 3; d.cand_blocks = 3; d.cand_size = 4;
  d.engram_layers = {0, 1}; d.e_heads = 2; d.e_dim = 256; d.max_ngram = 4; d.e_vocab_start = 100;
  d.n_merges = 600; d.min_vocab = 0;
  d.schedule_keys = true;
  d.t_attn = GgmlType::kQ8_0; d.t_shexp = GgmlType::kQ8_0; d.t_embd = GgmlType::kQ8_0; d.t_out = GgmlType::kQ6_K;
  d.t_gate_up = GgmlType::kQ2_K; d.t_down = GgmlType::kQ3_K; d.t_engram = GgmlType::kQ2_K; d.t_dense_f = GgmlType::kBF16;
  return d;
}

// Between tiny and perf, for CPU benchmarks: 8 layers of width 2048 with every block type,
// 32 experts top-6, Q2_K-rung expert types (~0.8 GB).
Dims mid_dims() {
  Dims d = tiny_dims();
  d.D = 2048; d.L = 8; d.H = 16; d.Dh = 256; d.rope = 32; d.q_lora = 512; d.o_groups = 4; d.o_rank = 512;
  d.window = 64; d.idx_heads = 8; d.idx_dim = 64; d.idx_topk = 64;
  d.E = 32; d.E_used = 6; d.F = 1024; d.ctx = 4096; d.yarn_orig = 1024; d.yarn_factor = 4;
  d.ratios = {0, 2, 2, 2, 1, 1, 1, 1, 0};
  d.kv = {1, 4};
  d.idx = {1, 4, 6};
  d.cand = 4; d.cand_blocks = 32; d.cand_size = 4;  // (32 - 1) * 4 + 1 >= 64 reachable positions
  d.engram_layers = {0, 1}; d.e_heads = 4; d.e_dim = 256; d.e_vocab_start = 10000;
  d.n_merges = 1500;
  return d;
}

// Released dimensions (spec §1.1); Q2_K rung: experts Q2_K gate/up and Q3_K down, Engram
// rows Q2_K, attention and shared expert Q4_K, embeddings Q4_K, head Q6_K.
Dims perf_dims() {
  Dims d{};
  d.D = 5120; d.L = 40; d.H = 64; d.Dh = 512; d.rope = 64; d.q_lora = 1280; d.o_groups = 8; d.o_rank = 1024;
  d.window = 128; d.idx_heads = 32; d.idx_dim = 128; d.idx_topk = 512;
  d.E = 16; d.E_used = 6; d.F = 2304; d.hc = 4; d.sinkhorn = 20; d.ctx = 65536; d.yarn_orig = 65536; d.yarn_factor = 16;
  const config::ReleasedSchedule r = config::released_schedule();
  d.ratios = r.compress_ratios;
  d.kv = r.kv_source_layers;
  d.idx = r.index_source_layers;
  d.cand = r.candidate_source; d.cand_blocks = r.candidate_topk_blocks; d.cand_size = r.candidate_block_size;
  // Engram tables keep the released row width and hashing; the prime search starts lower so
  // a table is ~0.4 GB instead of 30 GB.
  d.engram_layers = r.engram_layer_ids; d.e_heads = 8; d.e_dim = 256; d.max_ngram = 4; d.e_vocab_start = 200000;
  d.n_merges = 1500; d.min_vocab = 129280;
  d.schedule_keys = false;
  d.t_attn = GgmlType::kQ4_K; d.t_shexp = GgmlType::kQ4_K; d.t_embd = GgmlType::kQ4_K; d.t_out = GgmlType::kQ6_K;
  d.t_gate_up = GgmlType::kQ2_K; d.t_down = GgmlType::kQ3_K; d.t_engram = GgmlType::kQ2_K; d.t_dense_f = GgmlType::kBF16;
  return d;
}

// The type if rows fit its blocks, else Q8_0, else BF16.
GgmlType fit(GgmlType t, uint64_t ne0) {
  if (ne0 % quant::traits(t).block_elems == 0) return t;
  return ne0 % 32 == 0 ? GgmlType::kQ8_0 : GgmlType::kBF16;
}

// ---- weight generation ----------------------------------------------------------------------

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Values: mean + std * (approximately normal: Irwin-Hall of 4 uniforms, unit variance).
struct Init {
  float mean;
  float std;
};

// Runs f(0) .. f(n - 1) on n threads (f(0) on this one).
void on_threads(uint32_t n, const std::function<void(uint32_t)>& f) {
  std::vector<std::thread> pool;
  for (uint32_t t = 1; t < n; ++t) pool.emplace_back([&f, t] { f(t); });
  f(0);
  for (auto& th : pool) th.join();
}

// pool_rows > 0: only the first pool_rows rows are drawn and encoded; every later row is a copy
// of one of them picked by a hash of its index (fast to write, the same magnitudes).
gguf::Writer::Fill make_fill(uint64_t seed, const std::string& name, std::vector<uint64_t> ne, GgmlType type, Init init,
                             uint32_t threads, uint64_t pool_rows = 0) {
  return [=](uint8_t* dst, uint64_t) -> Status {
    const uint64_t ne0 = ne[0];
    uint64_t all_rows = 1;
    for (size_t i = 1; i < ne.size(); ++i) all_rows *= ne[i];
    const uint64_t rows = pool_rows > 0 ? std::min(pool_rows, all_rows) : all_rows;  // rows drawn
    const uint64_t row_bytes = *quant::row_bytes(type, ne0);
    constexpr uint64_t kRowsPerBlock = 16;
    const uint64_t n_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    const uint64_t base = name_hash(name) ^ (seed * 0x2545f4914f6cdd1dull);
    auto work = [&](uint64_t first_block, uint64_t step) -> Status {
      std::vector<float> row(ne0);
      for (uint64_t b = first_block; b < n_blocks; b += step) {
        uint64_t s = base + b * 0x9e3779b97f4a7c15ull;
        for (uint64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) {
          for (float& v : row) {
            const uint64_t x = splitmix(s);
            const float sum = static_cast<float>((x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48)) / 65536.0f;
            v = init.mean + init.std * (sum - 2.0f) * 1.7320508f;
          }
          RETURN_IF_ERROR(quant::encode_row(type, row.data(), dst + r * row_bytes, static_cast<int64_t>(ne0)));
        }
      }
      return absl::OkStatus();
    };
    const uint32_t n = std::max<uint32_t>(1, std::min<uint64_t>(threads, n_blocks));
    std::vector<Status> st(n);
    on_threads(n, [&](uint32_t t) { st[t] = work(t, n); });
    for (const Status& s : st) RETURN_IF_ERROR(s);
    if (rows == all_rows) return absl::OkStatus();
    on_threads(n, [&](uint32_t t) {  // the rows not drawn: copies of drawn ones
      for (uint64_t r = rows + t; r < all_rows; r += n) {
        uint64_t s = base ^ (r * 0xd1b54a32d192ed03ull);
        std::memcpy(dst + r * row_bytes, dst + (splitmix(s) % rows) * row_bytes, row_bytes);
      }
    });
    return absl::OkStatus();
  };
}

class Builder {
 public:
  Builder(gguf::Writer& w, const SynthOptions& o, uint32_t threads) : w_(w), o_(o), threads_(threads) {}
  // A weight matrix with fan-in ne[0]: std 1/sqrt(fan_in) keeps activations O(1).
  void matrix(const std::string& name, std::vector<uint64_t> ne, GgmlType t, float gain = 1.0f, uint64_t pool_rows = 0) {
    const uint64_t fan_in = ne[0];  // read before ne is moved (argument order is unspecified)
    const float std = gain / std::sqrt(static_cast<float>(fan_in));
    add(name, std::move(ne), fit(t, fan_in), Init{0.0f, std}, pool_rows);
  }
  void vec(const std::string& name, std::vector<uint64_t> ne, Init init, GgmlType t = GgmlType::kF32) {
    add(name, std::move(ne), t, init);
  }
  // A one-row F32 tensor with the given values.
  void values(const std::string& name, std::vector<float> v) {
    if (!status_.ok()) return;
    const uint64_t n = v.size();
    status_ = w_.add_tensor(name, {n}, GgmlType::kF32, [v](uint8_t* dst, uint64_t) -> Status {
      return quant::encode_row(GgmlType::kF32, v.data(), dst, static_cast<int64_t>(v.size()));
    });
  }
  const SynthOptions& options() const { return o_; }
  Status status() const { return status_; }

 private:
  void add(const std::string& name, std::vector<uint64_t> ne, GgmlType t, Init init, uint64_t pool_rows = 0) {
    if (!status_.ok()) return;
    status_ = w_.add_tensor(name, ne, t, make_fill(o_.seed, name, ne, t, init, threads_, pool_rows));
  }
  gguf::Writer& w_;
  const SynthOptions& o_;
  uint32_t threads_;
  Status status_;
};

// ---- metadata -------------------------------------------------------------------------------

std::string key(const char* k) { return absl::StrCat("deepseek41.", k); }

template <typename T>
Value arr(ValueType t, const std::vector<T>& v) { return Value::array(t, v); }

void write_hparams(gguf::Writer& w, const Dims& d, const SynthOptions& o, uint32_t n_vocab) {
  w.set("general.architecture", Value::str("deepseek41"));
  w.set("general.name", Value::str(absl::StrCat("dsflash synthetic DeepSeek-V4.1 (", o.preset, ", seed ", o.seed, ")")));
  w.set("general.description", Value::str("Synthetic weights from `dsflash mkmodel`; not a trained model."));
  w.set("general.file_type", Value::u32(10));  // LLAMA_FTYPE_MOSTLY_Q2_K
  w.set("general.quantization_version", Value::u32(2));
  w.set(key("vocab_size"), Value::u32(n_vocab));
  w.set(key("context_length"), Value::u32(d.ctx));
  w.set(key("embedding_length"), Value::u32(d.D));
  w.set(key("block_count"), Value::u32(d.L));
  w.set(key("feed_forward_length"), Value::u32(d.F));
  w.set(key("leading_dense_block_count"), Value::u32(0));
  w.set(key("attention.head_count"), Value::u32(d.H));
  w.set(key("attention.head_count_kv"), Value::u32(1));
  w.set(key("attention.key_length"), Value::u32(d.Dh));
  w.set(key("attention.value_length"), Value::u32(d.Dh));
  w.set(key("attention.layer_norm_rms_epsilon"), Value::f32(1e-20f));
  w.set(key("attention.q_lora_rank"), Value::u32(d.q_lora));
  w.set(key("attention.sliding_window"), Value::u32(d.window));
  w.set(key("attention.output_group_count"), Value::u32(d.o_groups));
  w.set(key("attention.output_lora_rank"), Value::u32(d.o_rank));
  w.set(key("attention.indexer.head_count"), Value::u32(d.idx_heads));
  w.set(key("attention.indexer.key_length"), Value::u32(d.idx_dim));
  w.set(key("attention.indexer.top_k"), Value::u32(d.idx_topk));
  w.set(key("attention.compress_ratios"), arr(ValueType::kI32, std::vector<int32_t>(d.ratios.begin(), d.ratios.end())));
  w.set(key("attention.compress_rope_freq_base"), Value::f32(160000.0f));
  if (d.schedule_keys) {
    w.set(key("attention.kv_source_layers"), arr(ValueType::kI32, std::vector<int32_t>(d.kv.begin(), d.kv.end())));
    w.set(key("attention.index_source_layers"), arr(ValueType::kI32, std::vector<int32_t>(d.idx.begin(), d.idx.end())));
    w.set(key("attention.candidate_source_layer"), Value::u32(static_cast<uint32_t>(d.cand)));
    w.set(key("attention.candidate_topk_blocks"), Value::u32(d.cand_blocks));
    w.set(key("attention.candidate_block_size"), Value::u32(d.cand_size));
  }
  w.set(key("rope.dimension_count"), Value::u32(d.rope));
  w.set(key("rope.freq_base"), Value::f32(10000.0f));
  w.set(key("rope.scaling.type"), Value::str("yarn"));
  w.set(key("rope.scaling.factor"), Value::f32(d.yarn_factor));
  w.set(key("rope.scaling.original_context_length"), Value::u32(d.yarn_orig));
  w.set(key("rope.scaling.yarn_beta_fast"), Value::f32(32.0f));
  w.set(key("rope.scaling.yarn_beta_slow"), Value::f32(1.0f));
  w.set(key("expert_count"), Value::u32(d.E));
  w.set(key("expert_used_count"), Value::u32(d.E_used));
  w.set(key("expert_shared_count"), Value::u32(1));
  w.set(key("expert_feed_forward_length"), Value::u32(d.F));
  w.set(key("expert_weights_scale"), Value::f32(1.5f));
  w.set(key("expert_weights_norm"), Value::boolean(true));
  w.set(key("expert_gating_func"), Value::u32(4));
  w.set(key("swiglu_clamp_exp"), arr(ValueType::kF32, std::vector<float>(d.L, 10.0f)));
  w.set(key("swiglu_clamp_shexp"), arr(ValueType::kF32, std::vector<float>(d.L, 10.0f)));
  w.set(key("hyper_connection.count"), Value::u32(d.hc));
  w.set(key("hyper_connection.sinkhorn_iterations"), Value::u32(d.sinkhorn));
  w.set(key("hyper_connection.epsilon"), Value::f32(1e-6f));
  w.set(key("hash_layer_count"), Value::u32(0));
}

// Engram constants (spec §3.2): consecutive primes from the search start, per-layer
// exclusive prefix sums, odd multipliers with (compressed_vocab - 1) * m < 2^63.
Status write_engram(gguf::Writer& w, const Dims& d, const SynthOptions& o, const tok::Tokenizer& t,
                    std::vector<uint64_t>* rows) {
  ASSIGN_OR_RETURN(const std::vector<int32_t> map, tok::build_compressed_token_map(t));
  const uint64_t cv = static_cast<uint64_t>(*std::max_element(map.begin(), map.end())) + 1;
  const size_t cols = static_cast<size_t>(d.max_ngram - 1) * d.e_heads;
  const std::vector<uint64_t> primes = config::primes_above(d.e_vocab_start - 1, cols * d.engram_layers.size());
  std::vector<uint64_t> offsets, mult;
  for (size_t l = 0; l < d.engram_layers.size(); ++l) {
    uint64_t acc = 0;
    for (size_t i = 0; i < cols; ++i) {
      offsets.push_back(acc);
      acc += primes[l * cols + i];
    }
    rows->push_back(acc);
    uint64_t s = o.seed ^ (10007ull * static_cast<uint64_t>(d.engram_layers[l]));
    const uint64_t bound = std::max<uint64_t>(1, (static_cast<uint64_t>(INT64_MAX) / cv) / 2);
    for (uint32_t k = 0; k < d.max_ngram; ++k) mult.push_back(2 * (splitmix(s) % bound) + 1);
  }
  w.set(key("engram.layer_ids"), arr(ValueType::kI32, std::vector<int32_t>(d.engram_layers.begin(), d.engram_layers.end())));
  w.set(key("engram.head_count"), Value::u32(d.e_heads));
  w.set(key("engram.key_length"), Value::u32(d.e_dim));
  w.set(key("engram.max_ngram_size"), Value::u32(d.max_ngram));
  w.set(key("engram.multipliers"), arr(ValueType::kU64, mult));
  w.set(key("engram.primes"), arr(ValueType::kU64, primes));
  w.set(key("engram.offsets"), arr(ValueType::kU64, offsets));
  w.set(key("engram.token_map"), arr(ValueType::kI32, map));
  w.set(key("engram.pad_id"), Value::u32(static_cast<uint32_t>(map[static_cast<size_t>(t.pad())])));
  w.set(key("engram.pad_token_id"), Value::u32(static_cast<uint32_t>(t.pad())));
  w.set(key("engram.vocab_size"), Value::u32(d.e_vocab_start));
  w.set(key("engram.compressed_vocab_size"), Value::u32(static_cast<uint32_t>(cv)));
  w.set(key("engram.num_embeddings"), arr(ValueType::kU64, *rows));
  return absl::OkStatus();
}

void write_tokenizer(gguf::Writer& w, const tok::Vocab& v) {
  w.set("tokenizer.ggml.model", Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", Value::str("deepseek-v3"));
  w.set("tokenizer.ggml.tokens", Value::string_array(v.tokens));
  w.set("tokenizer.ggml.token_type", arr(ValueType::kI32, v.types));
  w.set("tokenizer.ggml.merges", Value::string_array(v.merges));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(v.bos)));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(v.eos)));
  w.set("tokenizer.ggml.padding_token_id", Value::u32(static_cast<uint32_t>(v.pad)));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  w.set("tokenizer.ggml.add_eos_token", Value::boolean(false));
}

// ---- tensors --------------------------------------------------------------------------------

// -skew * ln(1 + rank) for the experts in a random order (seeded): Zipf-like selection odds.
std::vector<float> skewed_bias(uint32_t E, float skew, uint64_t seed) {
  std::vector<uint32_t> order(E);
  for (uint32_t e = 0; e < E; ++e) order[e] = e;
  uint64_t s = seed;
  for (uint32_t i = E; i > 1; --i) std::swap(order[i - 1], order[splitmix(s) % i]);
  std::vector<float> bias(E);
  for (uint32_t rank = 0; rank < E; ++rank) bias[order[rank]] = -skew * std::log(1.0f + static_cast<float>(rank));
  return bias;
}

void add_layer(Builder& b, const Dims& d, const config::LayerConfig& L) {
  const uint64_t D = d.D, C = d.hc, M = (2 + C) * C;
  auto n = [&](const char* s) { return absl::StrCat("blk.", L.index, ".", s); };
  for (const char* sub : {"attn", "ffn"}) {
    b.vec(n(absl::StrCat("hc_", sub, "_fn.weight").c_str()), {C * D, M}, {0.0f, 0.5f / std::sqrt(static_cast<float>(C * D))});
    b.vec(n(absl::StrCat("hc_", sub, "_base.weight").c_str()), {M}, {0.0f, 0.3f});
    b.vec(n(absl::StrCat("hc_", sub, "_scale.weight").c_str()), {3}, {0.5f, 0.1f});
    b.vec(n(absl::StrCat(sub, "_norm.weight").c_str()), {D}, {1.0f, 0.05f}, GgmlType::kBF16);
  }
  b.vec(n("attn_sinks.weight"), {d.H}, {0.0f, 1.0f});
  b.matrix(n("attn_q_a.weight"), {D, d.q_lora}, d.t_attn);
  b.vec(n("attn_q_a_norm.weight"), {d.q_lora}, {1.0f, 0.05f}, GgmlType::kBF16);
  b.matrix(n("attn_q_b.weight"), {d.q_lora, uint64_t{d.H} * d.Dh}, d.t_attn);
  b.matrix(n("attn_kv.weight"), {D, d.Dh}, d.t_attn);
  b.vec(n("attn_kv_a_norm.weight"), {d.Dh}, {1.0f, 0.05f}, GgmlType::kBF16);
  b.matrix(n("attn_output_a.weight"), {uint64_t{d.H} * d.Dh / d.o_groups, uint64_t{d.o_groups} * d.o_rank}, d.t_attn);
  b.matrix(n("attn_output_b.weight"), {uint64_t{d.o_groups} * d.o_rank, D}, d.t_attn);
  if (L.is_kv_source) {
    b.matrix(n("attn_compressor_kv.weight"), {D, d.Dh}, L.compress_ratio == 2 ? GgmlType::kF32 : d.t_dense_f);
    if (L.compress_ratio == 2) b.matrix(n("attn_compressor_gate.weight"), {D, d.Dh}, GgmlType::kF32);
    b.vec(n("attn_compressor_norm.weight"), {d.Dh}, {1.0f, 0.05f}, GgmlType::kBF16);
    b.matrix(n("indexer.attn_k.weight"), {d.Dh, d.idx_dim}, d.t_dense_f);
    b.vec(n("indexer.k_norm.weight"), {d.idx_dim}, {1.0f, 0.05f}, GgmlType::kBF16);
  }
  if (L.is_index_source) {
    b.matrix(n("indexer.attn_q_b.weight"), {d.q_lora, uint64_t{d.idx_heads} * d.idx_dim}, d.t_attn);
    b.matrix(n("indexer.proj.weight"), {D, d.idx_heads}, d.t_dense_f);
  }
  b.matrix(n("ffn_gate_inp.weight"), {D, d.E}, d.t_dense_f);
  if (b.options().routing_skew > 0) {
    b.values(n("exp_probs_b.bias"), skewed_bias(d.E, b.options().routing_skew, b.options().seed * 1000003 + L.index));
  } else {
    b.vec(n("exp_probs_b.bias"), {d.E}, {0.0f, 0.01f});
  }
  // Pooled experts: rows drawn for two experts, the rest copies (SynthOptions::pooled_experts).
  const uint64_t pool_f = b.options().pooled_experts ? 2 * d.F : 0, pool_d = b.options().pooled_experts ? 2 * D : 0;
  b.matrix(n("ffn_gate_exps.weight"), {D, d.F, d.E}, d.t_gate_up, 1.0f, pool_f);
  b.matrix(n("ffn_up_exps.weight"), {D, d.F, d.E}, d.t_gate_up, 1.0f, pool_f);
  b.matrix(n("ffn_down_exps.weight"), {d.F, D, d.E}, d.t_down, 1.0f, pool_d);
  b.matrix(n("ffn_gate_shexp.weight"), {D, d.F}, d.t_shexp);
  b.matrix(n("ffn_up_shexp.weight"), {D, d.F}, d.t_shexp);
  b.matrix(n("ffn_down_shexp.weight"), {d.F, D}, d.t_shexp);
}

void add_engram(Builder& b, const Dims& d, int layer, uint64_t rows) {
  const std::string p = absl::StrCat("blk.", layer, ".");
  const uint64_t cols = uint64_t{d.max_ngram - 1} * d.e_heads;
  b.vec(p + "engram_embd.weight", {d.e_dim, rows}, {0.0f, 1.0f}, fit(d.t_engram, d.e_dim));
  b.matrix(p + "engram_wkv.weight", {cols * d.e_dim, uint64_t{d.hc + 1} * d.D}, d.t_attn);
  b.vec(p + "engram_q.weight", {d.D, d.hc}, {1.0f, 0.1f}, GgmlType::kBF16);
  b.vec(p + "engram_k.weight", {d.D, d.hc}, {1.0f, 0.1f}, GgmlType::kBF16);
}

}  // namespace

StatusOr<SynthPlan> plan_synthetic_model(const SynthOptions& o) {
  Dims d;
  if (o.preset == "tiny") d = tiny_dims();
  else if (o.preset == "mid") d = mid_dims();
  else if (o.preset == "perf") d = perf_dims();
  else return absl::InvalidArgumentError(absl::StrCat("unknown preset '", o.preset, "' (tiny, mid or perf)"));
  if (o.n_expert > 0) {
    if (o.n_expert < d.E_used) return absl::InvalidArgumentError(absl::StrCat("--experts must be >= top-k (", d.E_used, ")"));
    d.E = o.n_expert;
  }
  const uint32_t threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  SynthPlan plan;
  plan.writer = std::make_unique<gguf::Writer>();
  gguf::Writer& w = *plan.writer;
  tok::Vocab vocab = tok::build_synthetic_vocab(bpe_corpus(), d.n_merges, d.min_vocab);
  ASSIGN_OR_RETURN(auto tokenizer, tok::Tokenizer::create(vocab));
  const uint32_t n_vocab = static_cast<uint32_t>(vocab.tokens.size());
  write_hparams(w, d, o, n_vocab);
  std::vector<uint64_t> rows;
  RETURN_IF_ERROR(write_engram(w, d, o, *tokenizer, &rows));
  write_tokenizer(w, vocab);

  config::ModelConfig schedule;
  schedule.n_layer = d.L;
  schedule.compress_ratios = d.ratios;
  schedule.kv_source_layers = d.kv;
  schedule.index_source_layers = d.idx;
  schedule.candidate_source = d.cand;
  schedule.engram.layer_ids = d.engram_layers;
  ASSIGN_OR_RETURN(const auto layers, config::derive_layers(schedule));

  Builder b(w, o, threads);
  b.matrix("token_embd.weight", {d.D, n_vocab}, d.t_embd, std::sqrt(static_cast<float>(d.D)));
  for (const auto& L : layers) {
    for (size_t i = 0; i < d.engram_layers.size(); ++i) {
      if (d.engram_layers[i] == L.index) add_engram(b, d, L.index, rows[i]);
    }
    add_layer(b, d, L);
  }
  b.vec("output_norm.weight", {d.D}, {1.0f, 0.05f}, GgmlType::kBF16);
  b.matrix("output.weight", {d.D, n_vocab}, d.t_out);
  RETURN_IF_ERROR(b.status());
  plan.n_tensors = w.n_tensors();
  plan.total_bytes = w.total_tensor_bytes();
  return plan;
}

StatusOr<std::vector<std::string>> write_synthetic_model(const SynthOptions& o, const std::string& path, uint32_t n_shards,
                                                         std::function<void(uint64_t, uint64_t)> progress) {
  ASSIGN_OR_RETURN(SynthPlan plan, plan_synthetic_model(o));
  if (progress) plan.writer->set_progress(progress);
  if (n_shards <= 1) {
    RETURN_IF_ERROR(plan.writer->write(path));
    return std::vector<std::string>{path};
  }
  std::string prefix = path;
  if (prefix.size() > 5 && prefix.substr(prefix.size() - 5) == ".gguf") prefix.resize(prefix.size() - 5);
  return plan.writer->write_split(prefix, n_shards);
}

}  // namespace dsflash::tools
