// Loading resident weights (views for matrices, decoded fp32 for vectors).
#include "inference_svc/model/weights.h"

#include "absl/strings/str_cat.h"
#include "inference_svc/model/model.h"

namespace dsflash::model {
namespace {

StatusOr<kernels::Weight> view(const gguf::Model& m, const std::string& name) {
  const gguf::TensorInfo* t = m.find_tensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor ", name));
  return kernels::weight_view(m, *t);
}

Status load_hc(const gguf::Model& m, const std::string& p, HcWeights* w) {
  ASSIGN_OR_RETURN(w->fn, load_f32(m, p + "_fn.weight"));
  ASSIGN_OR_RETURN(w->base, load_f32(m, p + "_base.weight"));
  ASSIGN_OR_RETURN(w->scale, load_f32(m, p + "_scale.weight"));
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::vector<float>> load_f32(const gguf::Model& m, const std::string& name) {
  const gguf::TensorInfo* t = m.find_tensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor ", name));
  std::vector<uint8_t> bytes(t->n_bytes);
  RETURN_IF_ERROR(m.read(*t, 0, bytes.data(), bytes.size()));
  std::vector<float> out(t->n_elems);
  RETURN_IF_ERROR(quant::decode_row(t->type, bytes.data(), out.data(), static_cast<int64_t>(t->n_elems)));
  return out;
}

Status warm_resident(const gguf::Model& m, const std::function<bool(uint64_t, uint64_t)>& progress) {
  auto resident = [](const gguf::TensorInfo& t) {
    return t.name.find("_exps.") == std::string::npos && t.name.find("engram_embd") == std::string::npos;
  };
  uint64_t total = 0, done = 0;
  for (const auto& t : m.tensors()) total += resident(t) ? t.n_bytes : 0;
  constexpr uint64_t kChunk = 16 << 20;
  std::vector<uint8_t> buf(kChunk);
  for (const auto& t : m.tensors()) {
    if (!resident(t)) continue;
    for (uint64_t off = 0; off < t.n_bytes; off += kChunk) {
      const uint64_t n = std::min(kChunk, t.n_bytes - off);
      RETURN_IF_ERROR(m.read(t, off, buf.data(), n));
      done += n;
      if (progress && !progress(done, total)) return absl::CancelledError("loading interrupted");
    }
  }
  if (progress) progress(done, total);
  return absl::OkStatus();
}

StatusOr<LayerWeights> load_layer(const gguf::Model& m, const config::ModelConfig& c, int l) {
  const config::LayerConfig& L = c.layers[l];
  const std::string p = absl::StrCat("blk.", l, ".");
  LayerWeights w;
  RETURN_IF_ERROR(load_hc(m, p + "hc_attn", &w.hc_attn));
  RETURN_IF_ERROR(load_hc(m, p + "hc_ffn", &w.hc_ffn));
  ASSIGN_OR_RETURN(w.attn_norm, load_f32(m, p + "attn_norm.weight"));
  ASSIGN_OR_RETURN(w.ffn_norm, load_f32(m, p + "ffn_norm.weight"));
  ASSIGN_OR_RETURN(w.attn_sinks, load_f32(m, p + "attn_sinks.weight"));
  ASSIGN_OR_RETURN(w.q_norm, load_f32(m, p + "attn_q_a_norm.weight"));
  ASSIGN_OR_RETURN(w.kv_norm, load_f32(m, p + "attn_kv_a_norm.weight"));
  ASSIGN_OR_RETURN(w.wq_a, view(m, p + "attn_q_a.weight"));
  ASSIGN_OR_RETURN(w.wq_b, view(m, p + "attn_q_b.weight"));
  ASSIGN_OR_RETURN(w.wkv, view(m, p + "attn_kv.weight"));
  ASSIGN_OR_RETURN(w.wo_a, view(m, p + "attn_output_a.weight"));
  ASSIGN_OR_RETURN(w.wo_b, view(m, p + "attn_output_b.weight"));
  if (L.is_kv_source) {
    ASSIGN_OR_RETURN(w.comp_kv, view(m, p + "attn_compressor_kv.weight"));
    if (L.compress_ratio == 2) {
      ASSIGN_OR_RETURN(w.comp_gate, view(m, p + "attn_compressor_gate.weight"));
    }
    ASSIGN_OR_RETURN(w.comp_norm, load_f32(m, p + "attn_compressor_norm.weight"));
    ASSIGN_OR_RETURN(w.idx_wk, view(m, p + "indexer.attn_k.weight"));
    ASSIGN_OR_RETURN(w.idx_k_norm, load_f32(m, p + "indexer.k_norm.weight"));
  }
  if (L.is_index_source) {
    ASSIGN_OR_RETURN(w.idx_wq_b, view(m, p + "indexer.attn_q_b.weight"));
    ASSIGN_OR_RETURN(w.idx_proj, view(m, p + "indexer.proj.weight"));
  }
  ASSIGN_OR_RETURN(w.gate_inp, view(m, p + "ffn_gate_inp.weight"));
  ASSIGN_OR_RETURN(w.exp_probs_b, load_f32(m, p + "exp_probs_b.bias"));
  ASSIGN_OR_RETURN(w.sh_gate, view(m, p + "ffn_gate_shexp.weight"));
  ASSIGN_OR_RETURN(w.sh_up, view(m, p + "ffn_up_shexp.weight"));
  ASSIGN_OR_RETURN(w.sh_down, view(m, p + "ffn_down_shexp.weight"));
  if (L.has_engram) {
    ASSIGN_OR_RETURN(w.engram_embd, view(m, p + "engram_embd.weight"));
    ASSIGN_OR_RETURN(w.engram_wkv, view(m, p + "engram_wkv.weight"));
    ASSIGN_OR_RETURN(auto q, load_f32(m, p + "engram_q.weight"));
    ASSIGN_OR_RETURN(auto k, load_f32(m, p + "engram_k.weight"));
    w.engram_qk.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) w.engram_qk[i] = q[i] * k[i];
  }
  return w;
}

StatusOr<std::unique_ptr<GgufExpertSource>> GgufExpertSource::create(const gguf::Model& m, const config::ModelConfig& c) {
  auto src = std::unique_ptr<GgufExpertSource>(new GgufExpertSource());
  src->n_expert_ = c.n_expert;
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    ExpertWeights w;
    ASSIGN_OR_RETURN(w.gate, view(m, p + "ffn_gate_exps.weight"));
    ASSIGN_OR_RETURN(w.up, view(m, p + "ffn_up_exps.weight"));
    ASSIGN_OR_RETURN(w.down, view(m, p + "ffn_down_exps.weight"));
    src->merged_.push_back(w);
  }
  return src;
}

StatusOr<ExpertWeights> GgufExpertSource::acquire(int layer, int expert) {
  if (layer < 0 || static_cast<size_t>(layer) >= merged_.size() || expert < 0 || expert >= n_expert_) {
    return absl::OutOfRangeError(absl::StrCat("no expert ", expert, " in layer ", layer));
  }
  const ExpertWeights& m = merged_[layer];
  const int64_t f = m.gate.rows / n_expert_, d = m.down.rows / n_expert_;
  return ExpertWeights{m.gate.slice_rows(expert * f, f), m.up.slice_rows(expert * f, f), m.down.slice_rows(expert * d, d)};
}

}  // namespace dsflash::model
