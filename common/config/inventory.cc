// Tensor inventory of a V4.1 Family-A file checked against its configuration, and the
// human-readable configuration summary.
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config.h"

namespace dsflash::config {
namespace {

using quant::GgmlType;

enum class Kind {
  kMatrix,  // any type with a decoder
  kVector,  // norms, biases, sinks, hc parameters: float types
};

struct Expected {
  std::string name;
  std::vector<uint64_t> ne;
  Kind kind;
};

bool float_type(GgmlType t) { return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16; }

std::vector<Expected> expected_tensors(const ModelConfig& c) {
  const uint64_t D = c.n_embd, V = c.n_vocab, H = c.n_head, Dh = c.head_dim, Q = c.q_lora_rank;
  const uint64_t G = c.o_groups, O = c.o_lora_rank, I = c.n_index_head, Id = c.index_head_dim;
  const uint64_t E = c.n_expert, F = c.expert_ffn, Fs = c.shared_ffn, C = c.hc_mult, M = c.hc_mix();
  std::vector<Expected> out = {
      {"token_embd.weight", {D, V}, Kind::kMatrix},
      {"output_norm.weight", {D}, Kind::kVector},
      {"output.weight", {D, V}, Kind::kMatrix},
  };
  for (const LayerConfig& L : c.layers) {
    auto add = [&](const std::string& n, std::vector<uint64_t> ne, Kind k) {
      out.push_back({absl::StrCat("blk.", L.index, ".", n), std::move(ne), k});
    };
    for (const char* sub : {"attn", "ffn"}) {
      add(absl::StrCat("hc_", sub, "_fn.weight"), {C * D, M}, Kind::kVector);
      add(absl::StrCat("hc_", sub, "_base.weight"), {M}, Kind::kVector);
      add(absl::StrCat("hc_", sub, "_scale.weight"), {3}, Kind::kVector);
      add(absl::StrCat(sub, "_norm.weight"), {D}, Kind::kVector);
    }
    add("attn_sinks.weight", {H}, Kind::kVector);
    add("attn_q_a.weight", {D, Q}, Kind::kMatrix);
    add("attn_q_a_norm.weight", {Q}, Kind::kVector);
    add("attn_q_b.weight", {Q, H * Dh}, Kind::kMatrix);
    add("attn_kv.weight", {D, Dh}, Kind::kMatrix);
    add("attn_kv_a_norm.weight", {Dh}, Kind::kVector);
    add("attn_output_a.weight", {H * Dh / G, G * O}, Kind::kMatrix);
    add("attn_output_b.weight", {G * O, D}, Kind::kMatrix);
    if (L.is_kv_source) {
      add("attn_compressor_kv.weight", {D, Dh}, Kind::kMatrix);
      if (L.compress_ratio == 2) add("attn_compressor_gate.weight", {D, Dh}, Kind::kMatrix);
      add("attn_compressor_norm.weight", {Dh}, Kind::kVector);
      add("indexer.attn_k.weight", {Dh, Id}, Kind::kMatrix);
      add("indexer.k_norm.weight", {Id}, Kind::kVector);
    }
    if (L.is_index_source) {
      add("indexer.attn_q_b.weight", {Q, I * Id}, Kind::kMatrix);
      add("indexer.proj.weight", {D, I}, Kind::kMatrix);
    }
    add("ffn_gate_inp.weight", {D, E}, Kind::kMatrix);
    add("exp_probs_b.bias", {E}, Kind::kVector);
    add("ffn_gate_exps.weight", {D, F, E}, Kind::kMatrix);
    add("ffn_up_exps.weight", {D, F, E}, Kind::kMatrix);
    add("ffn_down_exps.weight", {F, D, E}, Kind::kMatrix);
    add("ffn_gate_shexp.weight", {D, Fs}, Kind::kMatrix);
    add("ffn_up_shexp.weight", {D, Fs}, Kind::kMatrix);
    add("ffn_down_shexp.weight", {Fs, D}, Kind::kMatrix);
  }
  const EngramConfig& e = c.engram;
  for (size_t i = 0; i < e.layer_ids.size(); ++i) {
    const std::string p = absl::StrCat("blk.", e.layer_ids[i], ".");
    const uint64_t rows = i < e.rows.size() ? e.rows[i] : 0;
    out.push_back({p + "engram_embd.weight", {e.head_dim, rows}, Kind::kMatrix});
    out.push_back({p + "engram_wkv.weight", {uint64_t{e.cols()} * e.head_dim, (C + 1) * D}, Kind::kMatrix});
    out.push_back({p + "engram_q.weight", {D, C}, Kind::kVector});
    out.push_back({p + "engram_k.weight", {D, C}, Kind::kVector});
  }
  return out;
}

std::string shape(const std::vector<uint64_t>& ne) { return absl::StrCat("[", absl::StrJoin(ne, ", "), "]"); }

}  // namespace

Status validate_tensors(const ModelConfig& c, const gguf::Model& m) {
  std::vector<std::string> p;
  for (const Expected& e : expected_tensors(c)) {
    const gguf::TensorInfo* t = m.find_tensor(e.name);
    if (t == nullptr) {
      p.push_back(absl::StrCat("missing tensor ", e.name, " ", shape(e.ne)));
      continue;
    }
    if (t->ne != e.ne) p.push_back(absl::StrCat(e.name, " has shape ", t->shape_string(), ", expected ", shape(e.ne)));
    const quant::TypeTraits& tr = quant::traits(t->type);
    if (!tr.can_decode) {
      p.push_back(absl::StrCat(e.name, " has type ", tr.name, ", which dsflash cannot decode"));
    } else if (e.kind == Kind::kVector && !float_type(t->type)) {
      p.push_back(absl::StrCat(e.name, " has type ", tr.name, "; norms, biases and hc parameters must be f32, f16 or bf16"));
    }
  }
  if (p.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "': ", p.size(), " tensor problem",
                                                 p.size() > 1 ? "s" : "", ": ", absl::StrJoin(p, "; ")));
}

std::string describe(const ModelConfig& c) {
  std::string s;
  absl::StrAppend(&s, "model            ", c.name.empty() ? "(unnamed)" : c.name, "\n");
  absl::StrAppend(&s, "family           ", family_name(c.family), ", layer schedule from ", c.schedule_origin, "\n");
  absl::StrAppend(&s, "vocab / context  ", c.n_vocab, " / ", c.n_ctx, "\n");
  absl::StrAppend(&s, "dim / layers     ", c.n_embd, " / ", c.n_layer, "\n");
  absl::StrAppend(&s, "attention        ", c.n_head, " heads x ", c.head_dim, " (rope ", c.rope_dims, "), q_lora ", c.q_lora_rank,
                  ", o_groups ", c.o_groups, " x ", c.o_lora_rank, ", window ", c.window, "\n");
  absl::StrAppend(&s, "indexer          ", c.n_index_head, " heads x ", c.index_head_dim, ", top-k ", c.index_topk,
                  "; candidates from layer ", c.candidate_source, ": ", c.candidate_topk_blocks, " blocks x ",
                  c.candidate_block_size, "\n");
  absl::StrAppend(&s, "moe              ", c.n_expert, " experts, top-", c.n_expert_used, " + ", c.n_expert_shared,
                  " shared, ffn ", c.expert_ffn, ", ", c.score_func, ", route scale ", c.route_scale, "\n");
  absl::StrAppend(&s, "hyper-conn.      ", c.hc_mult, " streams, ", c.hc_sinkhorn_iters, " Sinkhorn iters, eps ", c.hc_eps, "\n");
  absl::StrAppend(&s, "norm eps         ", c.norm_eps, "\n");
  absl::StrAppend(&s, "rope             theta ", c.rope_theta, " (ratio 0), ", c.compress_rope_theta, " + YaRN x", c.yarn_factor,
                  " (orig ", c.yarn_orig_ctx, ", beta ", c.yarn_beta_fast, "/", c.yarn_beta_slow, ")\n");
  const EngramConfig& e = c.engram;
  absl::StrAppend(&s, "engram           layers [", absl::StrJoin(e.layer_ids, ", "), "], ", e.n_heads, " heads x ",
                  e.head_dim, ", n-grams 2..", e.max_ngram, ", rows [", absl::StrJoin(e.rows, ", "), "], compressed vocab ",
                  e.compressed_vocab, ", pad ", e.pad_id, "\n");
  absl::StrAppend(&s, "layers\n");
  for (const LayerConfig& L : c.layers) {
    absl::StrAppend(&s, absl::StrFormat("  %2d  ratio %d  %-22s", L.index, L.compress_ratio, role_name(L.role)));
    if (L.compress_ratio > 0) absl::StrAppend(&s, absl::StrFormat("  kv<-%-2d topk<-%-2d", L.kv_source, L.index_source));
    if (L.uses_candidates) absl::StrAppend(&s, "  candidate-masked");
    if (L.has_engram) absl::StrAppend(&s, "  +engram");
    absl::StrAppend(&s, "\n");
  }
  return s;
}

}  // namespace dsflash::config
