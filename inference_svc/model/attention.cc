// The attention sub-layer of V4.1 (spec §2.4-2.7): query and window-KV paths, the compressor
// and the indexer of source layers, sparse attention over window + compressed rows, and the
// grouped low-rank output.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/quant/numeric.h"
#include "inference_svc/model/call.h"
#include "inference_svc/model/weights.h"
#include "kernels/attn/attn.h"
#include "kernels/norm/norm.h"
#include "kernels/qdq/qdq.h"

namespace dsflash::model {
namespace {

using kernels::linear;
using kernels::OutRound;

std::vector<float> project(const kernels::Weight& w, const std::vector<float>& x, int64_t S,
                           OutRound r = OutRound::kBf16) {
  std::vector<float> y(static_cast<size_t>(S * w.rows));
  linear(w, x.data(), S, y.data(), r);
  return y;
}

void norm_rows(std::vector<float>& v, const std::vector<float>& w, float eps) {
  const int64_t n = static_cast<int64_t>(w.size());
  kernels::rms_norm(v.data(), w.data(), static_cast<int64_t>(v.size()) / n, n, eps, v.data());
}

void emit(const Hook& hook, const std::string& name, std::vector<float>& v, int64_t rows) {
  if (hook) hook(name, v.data(), rows, rows ? static_cast<int64_t>(v.size()) / rows : 0);
}

// Index lists go to the hook as floats (read-only: a hook cannot change a decision).
void emit_idx(const Hook& hook, const std::string& name, const std::vector<int32_t>& v, int64_t rows) {
  if (!hook) return;
  std::vector<float> f(v.begin(), v.end());
  emit(hook, name, f, rows);
}

}  // namespace

// Ratio-1 sources: a bf16 projection per token. Ratio 2: fp32 projections, a partial group
// kept in the sequence state, one latent per completed pair. Returns latents [n][head_dim]
// before RoPE (n may be 0).
std::vector<float> Model::compress(int l, Sequence& seq, const Call& call, const std::vector<float>& x) const {
  const LayerWeights& w = layers_[l];
  const int r = cfg_.layers[l].compress_ratio;
  const int64_t Dh = cfg_.head_dim, S = call.S;
  std::vector<float> latent;
  if (r == 1) {
    latent = project(w.comp_kv, x, S);
  } else {
    LayerState& st = seq.layers[l];
    const std::vector<float> k = project(w.comp_kv, x, S, OutRound::kF32);
    const std::vector<float> s = project(w.comp_gate, x, S, OutRound::kF32);
    std::vector<float> row(Dh);
    auto pool = [&](const float* kp, const float* sp) {
      kernels::attn::pool_group(kp, sp, 2, Dh, row.data());
      latent.insert(latent.end(), row.begin(), row.end());
    };
    // Token p fills slot p mod 2; a pair is pooled when p completes it (p + 1 even). In a
    // prefill this pools (2g, 2g + 1) exactly as grouping the rows directly would.
    for (int64_t t = 0; t < S; ++t) {
      const int64_t pos = call.pos0 + t, slot = pos % 2;
      std::copy_n(&k[t * Dh], Dh, st.kv_state.begin() + slot * Dh);
      std::copy_n(&s[t * Dh], Dh, st.score_state.begin() + slot * Dh);
      if ((pos + 1) % 2 == 0) pool(st.kv_state.data(), st.score_state.data());
    }
  }
  if (!latent.empty()) norm_rows(latent, w.comp_norm, cfg_.norm_eps);
  return latent;
}

// Index sources: scores of this layer's queries against its KV source's index keys, causal
// and candidate masks, top-k. KV sources first turn their new latents into index keys.
std::vector<int32_t> Model::indexer(int l, Sequence& seq, Call& call, const std::vector<float>& x,
                                    const std::vector<float>& qr, const std::vector<float>& latent,
                                    const Hook& hook) const {
  const LayerWeights& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const int r = L.compress_ratio;
  const int64_t S = call.S, Hi = cfg_.n_index_head, Di = cfg_.index_head_dim, Dh = cfg_.head_dim;
  const std::string p = absl::StrCat("L", l, ".indexer.");
  if (L.is_kv_source && !latent.empty()) {
    const int64_t n = static_cast<int64_t>(latent.size()) / Dh;
    std::vector<float> k = project(w.idx_wk, latent, n);
    norm_rows(k, w.idx_k_norm, cfg_.norm_eps);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = (call.pos0 / r + j) * r;  // a group stands at its first token
      kernels::rope::apply(rope_yarn_, &k[j * Di], Di, pos);
      kernels::qdq::fp4_e8m0_32(&k[j * Di], Di);
    }
    seq.layers[l].index_k.insert(seq.layers[l].index_k.end(), k.begin(), k.end());
  }
  // Every KV source republishes its key cache on every call: read the own source's keys.
  const std::vector<float>& keys = seq.layers[L.kv_source].index_k;
  const int64_t n_keys = (call.pos0 + S) / r;
  std::vector<float> q = project(w.idx_wq_b, qr, S);
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t h = 0; h < Hi; ++h) {
      float* qh = &q[(t * Hi + h) * Di];
      kernels::rope::apply(rope_yarn_, qh, Di, call.pos0 + t);
      kernels::qdq::fp4_e8m0_32(qh, Di);
    }
  }
  std::vector<float> wts = project(w.idx_proj, x, S);
  const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Di)) / std::sqrt(static_cast<double>(Hi)));
  for (float& v : wts) v = quant::round_bf16(v * wscale);
  emit(hook, p + "q", q, S);
  emit(hook, p + "weights", wts, S);
  std::vector<float> score(static_cast<size_t>(S * n_keys));
  const int64_t k_sel = std::min<int64_t>(cfg_.index_topk, n_keys);
  std::vector<int32_t> out(static_cast<size_t>(S * k_sel));
  if (L.is_candidate_source) {
    call.candidates.assign(static_cast<size_t>(S * n_keys), 0);
    call.cand_width = n_keys;
  }
  for (int64_t t = 0; t < S; ++t) {
    float* sc = &score[t * n_keys];
    kernels::attn::index_scores(&q[t * Hi * Di], static_cast<int>(Hi), Di, keys.data(), n_keys, &wts[t * Hi], sc);
    const int64_t visible = (call.pos0 + t + 1) / r;  // groups completed up to this query
    for (int64_t j = visible; j < n_keys; ++j) sc[j] = -INFINITY;
    if (L.is_candidate_source) {
      const auto mask = kernels::attn::candidate_mask(sc, n_keys, visible, cfg_.candidate_topk_blocks,
                                                      cfg_.candidate_block_size);
      std::copy(mask.begin(), mask.end(), call.candidates.begin() + t * n_keys);
    } else if (L.uses_candidates) {
      for (int64_t j = 0; j < n_keys; ++j) {
        if (!call.candidates[t * call.cand_width + j]) sc[j] = -INFINITY;
      }
    }
    const auto top = kernels::attn::topk_ascending(sc, n_keys, k_sel);
    for (int64_t i = 0; i < k_sel; ++i) out[t * k_sel + i] = top[i] < visible ? top[i] + static_cast<int32_t>(call.n_win) : -1;
  }
  emit(hook, p + "score", score, S);
  emit_idx(hook, p + "topk", out, S);
  return out;
}

// KV rows given to sparse attention and each query's index list into them.
struct Model::KvSet {
  std::vector<float> rows;    // [n][head_dim]
  std::vector<int32_t> idx;   // [S][width]
  int64_t width = 0;
};

namespace {

// Window rows (spec §2.4 steps 3-5): kv_norm(wkv x), RoPE, FP8 QDQ; the ring keeps the last
// `window` rows (slot p mod W). Three call shapes:
//  - prefill at 0: attend this call's rows; query t lists max(0, t-W+1)..t, -1 padded;
//  - decode: attend the ring, oldest slot first, slots not yet written as -1;
//  - a later prefill chunk: attend [ring before this call ; this call's rows], each query
//    listing its last W positions in increasing order, -1 padded (the prefill order).
void window_kv(const config::ModelConfig& c, const LayerWeights& w, const kernels::rope::Table& rope, LayerState& st,
               int64_t pos0, int64_t S, const std::vector<float>& x, std::vector<float>& rows, std::vector<int32_t>& idx,
               int64_t& width, const Hook& hook, const std::string& name) {
  const int64_t Dh = c.head_dim, W = c.window;
  std::vector<float> kv = project(w.wkv, x, S);
  norm_rows(kv, w.kv_norm, c.norm_eps);
  for (int64_t t = 0; t < S; ++t) {
    kernels::rope::apply(rope, &kv[t * Dh], Dh, pos0 + t);
    kernels::qdq::fp8_e8m0_32(&kv[t * Dh], Dh);
  }
  emit(hook, name, kv, S);
  const bool decode = pos0 > 0 && S == 1;
  if (pos0 > 0 && !decode) rows = st.window;  // the ring as it was before this call
  for (int64_t t = std::max<int64_t>(0, S - W); t < S; ++t) {
    std::copy_n(&kv[t * Dh], Dh, st.window.begin() + ((pos0 + t) % W) * Dh);
  }
  if (decode) {
    rows = st.window;
  } else {
    rows.insert(rows.end(), kv.begin(), kv.end());
  }
  const int64_t ring_rows = pos0 > 0 && !decode ? W : 0;
  width = pos0 == 0 ? std::min(S, W) : W;
  idx.assign(static_cast<size_t>(S * width), -1);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t p = pos0 + t;
    int32_t* out = &idx[t * width];
    if (decode) {
      for (int64_t j = 0; j < W; ++j) {
        const int64_t slot = (pos0 % W + 1 + j) % W;
        out[j] = static_cast<int32_t>(slot > pos0 ? -1 : slot);
      }
      continue;
    }
    int64_t n = 0;
    for (int64_t q = std::max<int64_t>(0, p - W + 1); q <= p; ++q) {
      out[n++] = static_cast<int32_t>(q >= pos0 ? ring_rows + (q - pos0) : q % W);
    }
  }
}

// Grouped low-rank output (steps 14-16): u[g] = wo_a[g] . o[g] (fp32 accumulation, one bf16
// rounding), out = wo_b(u) with u flattened group-major.
std::vector<float> grouped_output(const config::ModelConfig& c, const LayerWeights& w, const std::vector<float>& o,
                                  int64_t S) {
  const int64_t H = c.n_head, Dh = c.head_dim, G = c.o_groups, R = c.o_lora_rank, gd = H * Dh / G;
  std::vector<float> u(static_cast<size_t>(S * G * R)), og(static_cast<size_t>(S * gd)), ug(static_cast<size_t>(S * R));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < S; ++t) std::copy_n(&o[t * H * Dh + g * gd], gd, &og[t * gd]);
    kernels::linear(w.wo_a.slice_rows(g * R, R), og.data(), S, ug.data());
    for (int64_t t = 0; t < S; ++t) std::copy_n(&ug[t * R], R, &u[t * G * R + g * R]);
  }
  return project(w.wo_b, u, S);
}

}  // namespace

// Compressed part (steps 6-11): sources compress, index sources select, then this layer's
// KV source's rows [0, compress_len) and the published top-k join the window set.
void Model::compressed_kv(int l, Sequence& seq, Call& call, const std::vector<float>& x, const std::vector<float>& qr,
                          KvSet& kv, const Hook& hook) const {
  const config::LayerConfig& L = cfg_.layers[l];
  const int r = L.compress_ratio;
  const int64_t Dh = cfg_.head_dim, S = call.S, compress_len = (call.pos0 + S) / r;
  std::vector<float> latent;
  if (L.is_kv_source) {
    latent = compress(l, seq, call, x);
    emit(hook, absl::StrCat("L", l, ".compressor.latent"), latent, static_cast<int64_t>(latent.size()) / Dh);
  }
  if (L.is_index_source) {
    // The indexer needs the latent before RoPE, so it runs before the cache is written.
    call.topk = compress_len == 0 ? std::vector<int32_t>() : indexer(l, seq, call, x, qr, latent, hook);
    call.topk_width = compress_len == 0 ? 0 : std::min<int64_t>(cfg_.index_topk, compress_len);
  }
  if (!latent.empty()) {
    // Group j stands at its first token's position j * r; FP4 with E4M3 scales per 16.
    const int64_t n = static_cast<int64_t>(latent.size()) / Dh;
    for (int64_t j = 0; j < n; ++j) {
      kernels::rope::apply(rope_yarn_, &latent[j * Dh], Dh, (call.pos0 / r + j) * r);
      kernels::qdq::fp4_e4m3_16(&latent[j * Dh], Dh);
    }
    std::vector<float>& cache = seq.layers[l].comp_kv;
    cache.insert(cache.end(), latent.begin(), latent.end());
  }
  const std::vector<float>& src = seq.layers[L.kv_source].comp_kv;
  kv.rows.insert(kv.rows.end(), src.begin(), src.begin() + compress_len * Dh);
  const int64_t width = kv.width + call.topk_width;
  std::vector<int32_t> idx(static_cast<size_t>(S * width));
  for (int64_t t = 0; t < S; ++t) {
    std::copy_n(&kv.idx[t * kv.width], kv.width, &idx[t * width]);
    std::copy_n(call.topk.begin() + t * call.topk_width, call.topk_width, &idx[t * width + kv.width]);
  }
  kv.idx = std::move(idx);
  kv.width = width;
}

void Model::attention(int l, Sequence& seq, Call& call, std::vector<float>& x, std::vector<float>& out,
                      const Hook& hook) const {
  const LayerWeights& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const kernels::rope::Table& rope = L.compress_ratio > 0 ? rope_yarn_ : rope_plain_;
  const int64_t S = call.S, H = cfg_.n_head, Dh = cfg_.head_dim;
  const std::string p = absl::StrCat("L", l, ".attn.");
  // Query: qr = q_norm(wq_a x) (kept for the indexer); q = wq_b qr, RoPE on every head's tail.
  std::vector<float> qr = project(w.wq_a, x, S);
  norm_rows(qr, w.q_norm, cfg_.norm_eps);
  emit(hook, p + "qr", qr, S);
  std::vector<float> q = project(w.wq_b, qr, S);
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t h = 0; h < H; ++h) kernels::rope::apply(rope, &q[(t * H + h) * Dh], Dh, call.pos0 + t);
  }
  emit(hook, p + "q", q, S);
  KvSet kv;
  window_kv(cfg_, w, rope, seq.layers[l], call.pos0, S, x, kv.rows, kv.idx, kv.width, hook, p + "window_kv");
  if (L.compress_ratio > 0) compressed_kv(l, seq, call, x, qr, kv, hook);
  emit_idx(hook, p + "topk_idxs", kv.idx, S);
  // Sparse attention with the sink, then the inverse RoPE at the query position.
  std::vector<float> o(static_cast<size_t>(S * H * Dh));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  for (int64_t t = 0; t < S; ++t) {
    kernels::attn::sparse_attn(&q[t * H * Dh], static_cast<int>(H), Dh, kv.rows.data(), &kv.idx[t * kv.width], kv.width,
                               w.attn_sinks.data(), scale, &o[t * H * Dh]);
  }
  emit(hook, p + "o_raw", o, S);
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t h = 0; h < H; ++h) kernels::rope::apply(rope, &o[(t * H + h) * Dh], Dh, call.pos0 + t, true);
  }
  out = grouped_output(cfg_, w, o, S);
}

}  // namespace dsflash::model
