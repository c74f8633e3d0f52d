// The MoE sub-layer (spec §2.9) and the Engram update (spec §3).
#include <map>

#include "absl/strings/str_cat.h"
#include "common/quant/numeric.h"
#include "inference_svc/model/engram_rows.h"
#include "inference_svc/model/model.h"
#include "inference_svc/model/weights.h"
#include "kernels/engram/engram.h"
#include "kernels/moe/moe.h"

namespace dsflash::model {
namespace {

// SwiGLU expert on n tokens x [n][D]: down(bf16(weight * silu(gate x) * up x)) -> y [n][D].
void expert_ffn(const kernels::Weight& gate, const kernels::Weight& up, const kernels::Weight& down,
                const std::vector<float>& x, int64_t n, const std::vector<float>& weight, float limit,
                std::vector<float>& y) {
  const int64_t F = gate.rows;
  std::vector<float> a(static_cast<size_t>(n * F)), b(static_cast<size_t>(n * F));
  kernels::linear(gate, x.data(), n, a.data());
  kernels::linear(up, x.data(), n, b.data());
  for (int64_t t = 0; t < n; ++t) kernels::moe::swiglu(&a[t * F], &b[t * F], F, limit, weight[t]);
  y.assign(static_cast<size_t>(n * down.rows), 0.0f);
  kernels::linear(down, a.data(), n, y.data());
}

}  // namespace

Status Model::moe(int l, const std::vector<float>& x, int64_t S, std::vector<float>& out, const Hook& hook) const {
  const LayerWeights& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const int64_t D = cfg_.n_embd, E = cfg_.n_expert, K = cfg_.n_expert_used;
  std::vector<float> logits(static_cast<size_t>(S * E));
  kernels::linear(w.gate_inp, x.data(), S, logits.data(), kernels::OutRound::kF32);
  // Tokens per expert, in expert-index order (the reference's accumulation order).
  std::map<int32_t, std::vector<std::pair<int64_t, float>>> by_expert;
  std::vector<float> route_w(static_cast<size_t>(S * K));
  std::vector<float> route_e(static_cast<size_t>(S * K));
  for (int64_t t = 0; t < S; ++t) {
    const auto r = kernels::moe::route(&logits[t * E], w.exp_probs_b.data(), E, K, cfg_.norm_topk, cfg_.route_scale);
    for (int64_t k = 0; k < K; ++k) {
      by_expert[r.experts[k]].emplace_back(t, r.weights[k]);
      route_e[t * K + k] = static_cast<float>(r.experts[k]);
      route_w[t * K + k] = r.weights[k];
    }
  }
  if (hook) {
    hook(absl::StrCat("L", l, ".moe.indices"), route_e.data(), S, K);
    hook(absl::StrCat("L", l, ".moe.weights"), route_w.data(), S, K);
  }
  std::vector<int> needed;
  for (const auto& [e, toks] : by_expert) needed.push_back(e);
  experts_->prefetch(l, needed);
  std::vector<float> acc(static_cast<size_t>(S * D), 0.0f), xe, ye, we;
  for (const auto& [e, toks] : by_expert) {
    ASSIGN_OR_RETURN(const ExpertWeights ew, experts_->acquire(l, e));
    const int64_t n = static_cast<int64_t>(toks.size());
    xe.resize(static_cast<size_t>(n * D));
    we.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(&x[toks[i].first * D], D, &xe[i * D]);
      we[i] = toks[i].second;
    }
    expert_ffn(ew.gate, ew.up, ew.down, xe, n, we, L.swiglu_limit_exp, ye);
    experts_->release(l, e);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t d = 0; d < D; ++d) acc[toks[i].first * D + d] += ye[i * D + d];
    }
  }
  expert_ffn(w.sh_gate, w.sh_up, w.sh_down, x, S, std::vector<float>(static_cast<size_t>(S), 1.0f),
             L.swiglu_limit_shexp, ye);
  out.resize(static_cast<size_t>(S * D));
  for (int64_t i = 0; i < S * D; ++i) out[i] = quant::round_bf16(acc[i] + ye[i]);
  return absl::OkStatus();
}

Status Model::engram(int l, Sequence& seq, int64_t pos0, int64_t S, std::vector<float>& h, const Hook& hook) const {
  const LayerWeights& w = layers_[l];
  const config::EngramConfig& ec = cfg_.engram;
  size_t e = 0;
  while (ec.layer_ids[e] != l) ++e;
  const int64_t cols = ec.cols(), hd = ec.head_dim, C = cfg_.hc_mult, D = cfg_.n_embd;
  std::vector<int64_t> ids(static_cast<size_t>(S * cols));
  for (int64_t t = 0; t < S; ++t) {
    kernels::engram::hash_ids(ec, e, seq.engram_ids.data(), pos0 + t + 1, &ids[t * cols]);
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= w.engram_embd.rows) {
      return absl::InternalError(absl::StrCat("Engram layer ", l, ": row id ", id, " outside the table"));
    }
  }
  prefetch_rows(w.engram_embd, ids.data(), S * cols);  // all page-ins at once (engram_rows.h)
  std::vector<float> rows(static_cast<size_t>(S * cols * hd));
  std::vector<float> ids_f(static_cast<size_t>(S * cols));
  for (int64_t i = 0; i < S * cols; ++i) {
    float* dst = &rows[i * hd];
    kernels::decode_weight_row(w.engram_embd, ids[i], dst);
    for (int64_t j = 0; j < hd; ++j) dst[j] = quant::round_bf16(dst[j]);
    ids_f[i] = static_cast<float>(ids[i]);
  }
  if (hook) hook(absl::StrCat("L", l, ".engram.hash_ids"), ids_f.data(), S, cols);
  std::vector<float> kv(static_cast<size_t>(S * w.engram_wkv.rows));
  kernels::linear(w.engram_wkv, rows.data(), S, kv.data());
  std::vector<float> gate(static_cast<size_t>(S * C));
  for (int64_t t = 0; t < S; ++t) {
    kernels::engram::gate_update(&h[t * C * D], &kv[t * w.engram_wkv.rows], w.engram_qk.data(), static_cast<int>(C), D,
                                 cfg_.norm_eps, &gate[t * C]);
  }
  if (hook) hook(absl::StrCat("L", l, ".engram.gate"), gate.data(), S, C);
  return absl::OkStatus();
}

}  // namespace dsflash::model
