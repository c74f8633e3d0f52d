// The attention sub-layer on the CUDA backend, as attention.cc: query and window-KV paths,
// the compressor and the indexer of source layers, sparse attention over [window rows ;
// compressed cache] and the grouped low-rank output.
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "inference_svc/model/device_model.h"
#include "kernels/attn/attn_cuda.h"
#include "kernels/norm/norm_cuda.h"
#include "kernels/qdq/qdq_cuda.h"
#include "kernels/rope/rope_cuda.h"

namespace dsflash::model {

using kernels::Copy;
using kernels::ExecCtx;

namespace {
// Appends n new latents (or index keys) of a ratio-r cache; in a capture the destination row is
// read when the graph runs and the host counts the rows after each replay.
// On ctx's stream; a call run as issued has made room for the rows first (DevRows::room_for) where
// ctx is a branch's.
Status append_rows(DeviceModel::Call& call, const ExecCtx& ctx, DevRows& rows, int r, const float* src, int64_t n) {
  if (call.step == nullptr) return rows.append(ctx, src, n);
  if (n == 0) return absl::OkStatus();
  call.appends->push_back({&rows, n});
  return kernels::attn::ring_write_cuda(ctx, src, call.new_row(r, rows.rows), n, rows.buf.size() / rows.width,
                                        rows.width, rows.buf.get());
}

// DSF_INDEXER_EVERY_KEY=0 (measurement, tests): score and select even where the top-k takes
// every key.
bool every_key_shortcut() {
  static const bool on = [] {
    const char* e = std::getenv("DSF_INDEXER_EVERY_KEY");
    return e == nullptr || std::string_view(e) != "0";
  }();
  return on;
}
}  // namespace

// Ratio 1: a bf16 projection per token. Ratio 2: fp32 projections, pairs pooled as the
// sequence completes them (a partial pair waits in the sequence state). Normalised latents.
Status DeviceModel::compress(int l, Call& call, const ExecCtx& ctx, const float* x, float* latent,
                             int64_t* n_new) const {
  const Layer& w = layers_[l];
  const int r = cfg_.layers[l].compress_ratio;
  const int64_t Dh = cfg_.head_dim, S = call.S, pos0 = call.pos0;
  if (r == 1) {
    RETURN_IF_ERROR(dev_linear(ctx, w.comp_kv, x, S, latent));
    *n_new = S;
  } else {
    DeviceLayerState& st = call.seq.layers[l];
    ASSIGN_OR_RETURN(auto k, DevBuf<float>::make(ctx, S * Dh));
    ASSIGN_OR_RETURN(auto s, DevBuf<float>::make(ctx, S * Dh));
    RETURN_IF_ERROR(dev_linear(ctx, w.comp_kv, x, S, k.get(), kernels::OutRound::kF32));
    RETURN_IF_ERROR(dev_linear(ctx, w.comp_gate, x, S, s.get(), kernels::OutRound::kF32));
    auto to_state = [&](int64_t t, int64_t slot) -> Status {
      RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToDevice, st.kv_state.get() + slot * Dh, k.get() + t * Dh,
                                    Dh * sizeof(float)));
      return kernels::copy(ctx, Copy::kDeviceToDevice, st.score_state.get() + slot * Dh, s.get() + t * Dh,
                           Dh * sizeof(float));
    };
    int64_t t = 0, n = 0;
    if (pos0 % 2 == 1) {  // the first token completes the pair waiting in the state (a graph's parity)
      RETURN_IF_ERROR(to_state(0, 1));
      RETURN_IF_ERROR(kernels::attn::pool_cuda(ctx, st.kv_state.get(), st.score_state.get(), 1, 2, Dh, latent));
      t = n = 1;
    }
    const int64_t pairs = (S - t) / 2;  // the rest start at an even position: pairs are adjacent rows
    RETURN_IF_ERROR(kernels::attn::pool_cuda(ctx, k.get() + t * Dh, s.get() + t * Dh, pairs, 2, Dh,
                                             latent + n * Dh));
    n += pairs;
    if ((S - t) % 2 == 1) RETURN_IF_ERROR(to_state(S - 1, 0));
    *n_new = n;
  }
  if (*n_new > 0) {
    RETURN_IF_ERROR(kernels::rms_norm_cuda(ctx, latent, w.comp_norm, *n_new, Dh, cfg_.norm_eps, latent));
  }
  return absl::OkStatus();
}

// A KV source's new latents, on ctx's stream (the attention's branch): an index source's index
// keys from them first, then each latent with RoPE at its group's first position and FP4 QDQ
// joins the compressed cache.
Status DeviceModel::cache_latents(int l, Call& call, const ExecCtx& ctx, float* latent, int64_t n_new) const {
  if (n_new == 0) return absl::OkStatus();
  const Layer& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const int r = L.compress_ratio;
  const int dims = static_cast<int>(cfg_.rope_dims);
  const int64_t Dh = cfg_.head_dim, Di = cfg_.index_head_dim;
  if (L.is_index_source) {
    ASSIGN_OR_RETURN(auto k, DevBuf<float>::make(ctx, n_new * Di));  // freed on ctx, after its append
    RETURN_IF_ERROR(dev_linear(ctx, w.idx_wk, latent, n_new, k.get()));
    RETURN_IF_ERROR(kernels::rms_norm_cuda(ctx, k.get(), w.idx_k_norm, n_new, Di, cfg_.norm_eps, k.get()));
    RETURN_IF_ERROR(kernels::rope::apply_cuda(ctx, rope_yarn_, dims, k.get(), n_new, Di, call.group_start(r), 1, false, r));
    RETURN_IF_ERROR(kernels::qdq::fp4_e8m0_32_cuda(ctx, k.get(), n_new * Di));
    RETURN_IF_ERROR(append_rows(call, ctx, call.seq.layers[l].index_k, r, k.get(), n_new));
  }
  RETURN_IF_ERROR(kernels::rope::apply_cuda(ctx, rope_yarn_, dims, latent, n_new, Dh, call.group_start(r), 1, false, r));
  RETURN_IF_ERROR(kernels::qdq::fp4_e4m3_16_cuda(ctx, latent, n_new * Dh));
  return append_rows(call, ctx, call.seq.layers[l].comp_kv, r, latent, n_new);
}

// Index sources: this layer's query scores against its KV source's index keys (cache_latents
// made a KV source's new ones on the branch `keys_from`, joined before the scores, where not
// null), candidate masks, top-k published to call.topk (select made it and call.cand), on ctx's
// stream.
Status DeviceModel::indexer(int l, Call& call, const ExecCtx& ctx, const kernels::Branch* keys_from, const float* x,
                            const float* qr) const {
  const Layer& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const int r = L.compress_ratio;
  const int64_t S = call.S, Hi = cfg_.n_index_head, Di = cfg_.index_head_dim, dims = cfg_.rope_dims;
  const DevRows& keys = call.seq.layers[L.kv_source].index_k;
  const int64_t n_keys = call.n_keys(r), k_sel = call.topk_width;
  // A top-k of every key takes no top-k (lists_every_key: a candidate source still scores).
  const bool every_key = k_sel == n_keys && every_key_shortcut();
  ASSIGN_OR_RETURN(auto q, DevBuf<float>::make(ctx, S * Hi * Di));  // scratch: made and freed on ctx
  RETURN_IF_ERROR(dev_linear(ctx, w.idx_wq_b, qr, S, q.get()));
  RETURN_IF_ERROR(kernels::rope::apply_cuda(ctx, rope_yarn_, static_cast<int>(dims), q.get(), S * Hi, Di, call.pos(), Hi));
  RETURN_IF_ERROR(kernels::qdq::fp4_e8m0_32_cuda(ctx, q.get(), S * Hi * Di));
  ASSIGN_OR_RETURN(auto wts, DevBuf<float>::make(ctx, S * Hi));
  RETURN_IF_ERROR(dev_linear(ctx, w.idx_proj, x, S, wts.get()));
  const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Di)) / std::sqrt(static_cast<double>(Hi)));
  ASSIGN_OR_RETURN(auto score, DevBuf<float>::make(ctx, S * n_keys));
  if (keys_from != nullptr) RETURN_IF_ERROR(kernels::join(ctx, *keys_from));
  RETURN_IF_ERROR(kernels::attn::index_scores_cuda(ctx, q.get(), S, static_cast<int>(Hi), Di, keys.buf.get(), n_keys,
                                                   wts.get(), wscale, call.pos(), r, score.get()));
  if (L.is_candidate_source) {
    RETURN_IF_ERROR(kernels::attn::candidate_mask_cuda(ctx, score.get(), S, n_keys, call.pos(), r,
                                                       cfg_.candidate_topk_blocks, cfg_.candidate_block_size,
                                                       call.cand.get()));
  } else if (L.uses_candidates) {
    RETURN_IF_ERROR(kernels::attn::mask_candidates_cuda(ctx, score.get(), call.cand.get(), S, n_keys, call.cand_width));
  }
  DevBuf<int32_t> top;
  if (!every_key) {
    ASSIGN_OR_RETURN(top, DevBuf<int32_t>::make(ctx, S * k_sel));
    RETURN_IF_ERROR(kernels::attn::topk_visible_cuda(ctx, score.get(), S, n_keys, k_sel, call.pos(), r, top.get()));
  }
  return kernels::attn::publish_topk_cuda(ctx, top.get(), S, k_sel, call.pos(), r, call.n_win, call.topk.get(), k_sel);
}

// Top-k of every key (index_topk at least the keys: contexts up to index_topk x ratio tokens)
// is every key in index order, whatever the scores: an index source that publishes no candidate
// mask then needs neither its queries nor their scores, and kv_path publishes the list
// beside the query.
bool DeviceModel::lists_every_key(int l, const Call& call) const {
  const config::LayerConfig& L = cfg_.layers[l];
  if (!L.is_index_source || L.is_candidate_source || L.compress_ratio <= 0) return false;
  const int64_t n_keys = call.n_keys(L.compress_ratio);
  return n_keys > 0 && cfg_.index_topk >= n_keys && every_key_shortcut();
}

// An index source's selection (indexer) from its query's latent qr on the branch `sel`, beside
// the query's wq_b: its list and a candidate source's mask are made on the call's stream first
// (their sizes are the host's); a KV source's branch `kv` (its new index keys) is joined
// before the scores. Layers whose list is every key publish it on `kv` instead (kv_path).
Status DeviceModel::select(int l, Call& call, BranchScope& sel, const kernels::Branch* kv, const float* x,
                           const float* qr) const {
  const config::LayerConfig& L = cfg_.layers[l];
  if (!L.is_index_source || L.compress_ratio <= 0 || lists_every_key(l, call)) return absl::OkStatus();
  Phase phase(*this, call.ctx, "attention.indexer");
  const int64_t S = call.S, n_keys = call.n_keys(L.compress_ratio);
  if (n_keys == 0) {
    call.topk = DevBuf<int32_t>();
    call.topk_width = 0;
    return absl::OkStatus();
  }
  const int64_t k_sel = std::min<int64_t>(cfg_.index_topk, n_keys);
  ASSIGN_OR_RETURN(call.topk, DevBuf<int32_t>::make(call.ctx, S * k_sel));
  call.topk_width = k_sel;
  if (L.is_candidate_source) {
    ASSIGN_OR_RETURN(call.cand, DevBuf<uint8_t>::make(call.ctx, S * n_keys));
    call.cand_width = n_keys;
  }
  RETURN_IF_ERROR(sel.fork());
  return indexer(l, call, sel.ctx(), L.is_kv_source ? kv : nullptr, x, qr);
}

// Grouped low-rank output: u[g] = wo_a[g] . o[g], out = wo_b(u), groups through strided copies.
Status DeviceModel::grouped_output(int l, Call& call, const float* o, float* y) const {
  const Layer& w = layers_[l];
  const ExecCtx& ctx = call.ctx;
  const int64_t S = call.S, H = cfg_.n_head, Dh = cfg_.head_dim, G = cfg_.o_groups, R = cfg_.o_lora_rank;
  const int64_t gd = H * Dh / G;
  ASSIGN_OR_RETURN(auto u, DevBuf<float>::make(ctx, S * G * R));
  if (S == 1 && G <= kernels::kMaxLinearBatch) {  // one token: the groups are contiguous, one launch
    std::vector<kernels::LinearJob> jobs;
    for (int64_t g = 0; g < G; ++g) jobs.push_back({w.wo_a.slice_rows(g * R, R), o + g * gd, u.get() + g * R});
    RETURN_IF_ERROR(kernels::linear_batch_cuda(ctx, jobs.data(), static_cast<int>(G)));
    return dev_linear(ctx, w.wo_b, u.get(), S, y);
  }
  ASSIGN_OR_RETURN(auto og, DevBuf<float>::make(ctx, S * gd));
  ASSIGN_OR_RETURN(auto ug, DevBuf<float>::make(ctx, S * R));
  const size_t f = sizeof(float);
  for (int64_t g = 0; g < G; ++g) {
    RETURN_IF_ERROR(kernels::copy_2d(ctx, og.get(), gd * f, o + g * gd, H * Dh * f, gd * f, S));
    RETURN_IF_ERROR(dev_linear(ctx, w.wo_a.slice_rows(g * R, R), og.get(), S, ug.get()));
    RETURN_IF_ERROR(kernels::copy_2d(ctx, u.get() + g * R, G * R * f, ug.get(), R * f, R * f, S));
  }
  return dev_linear(ctx, w.wo_b, u.get(), S, y);
}

// The attention's KV path on the branch `side` (forked here), beside the query: the window rows,
// kv_norm(wkv x) into kv, RoPE, FP8 QDQ (at a decode step the ring row too; then the rows
// attention reads, window_kv), a KV source's new compressed latents (into `latent`, which the
// caller frees after the join) keyed and cached, and a list of every key. What the chain reads
// later is allocated on the call's stream before the fork, and the caches make room there.
Status DeviceModel::kv_path(int l, Call& call, BranchScope& side, const float* x, float* kv,
                            DevBuf<float>& latent) const {
  const Layer& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const ExecCtx& ctx = call.ctx;
  const int64_t S = call.S, Dh = cfg_.head_dim, W = cfg_.window;
  DeviceLayerState& st = call.seq.layers[l];
  const bool kv_source = L.compress_ratio > 0 && L.is_kv_source;
  if (kv_source) {
    const int64_t most = S / L.compress_ratio + 1;
    ASSIGN_OR_RETURN(latent, DevBuf<float>::make(ctx, most * Dh));
    if (call.step == nullptr) {  // a capture reserved its capacity; else the caches grow here
      RETURN_IF_ERROR(st.comp_kv.room_for(ctx, most));
      if (L.is_index_source) RETURN_IF_ERROR(st.index_k.room_for(ctx, most));
    }
  }
  const bool every_key = lists_every_key(l, call);
  const int64_t n_keys = every_key ? call.n_keys(L.compress_ratio) : 0;
  if (every_key) {
    ASSIGN_OR_RETURN(call.topk, DevBuf<int32_t>::make(ctx, S * n_keys));
    call.topk_width = n_keys;
  }
  RETURN_IF_ERROR(side.fork());
  const ExecCtx& b = side.ctx();
  if (every_key) {
    RETURN_IF_ERROR(kernels::attn::publish_topk_cuda(b, nullptr, S, n_keys, call.pos(), L.compress_ratio, call.n_win,
                                                     call.topk.get(), n_keys));
  }
  RETURN_IF_ERROR(dev_linear(b, w.wkv, x, S, kv));
  const float* rope = L.compress_ratio > 0 ? rope_yarn_ : rope_plain_;
  const bool decode = call.pos0 > 0 && S == 1;
  RETURN_IF_ERROR(kernels::attn::kv_rows_cuda(b, kv, S, Dh, w.kv_norm, cfg_.norm_eps, rope,
                                              static_cast<int>(cfg_.rope_dims), call.pos(),
                                              decode ? st.ring.get() : nullptr, W));
  if (!kv_source) return absl::OkStatus();
  int64_t n_new = 0;
  RETURN_IF_ERROR(compress(l, call, b, x, latent.get(), &n_new));
  return cache_latents(l, call, b, latent.get(), n_new);
}

Status DeviceModel::attention(int l, Call& call, const float* x, float* y) const {
  const Layer& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const ExecCtx& ctx = call.ctx;
  const float* rope = L.compress_ratio > 0 ? rope_yarn_ : rope_plain_;
  const int dims = static_cast<int>(cfg_.rope_dims);
  const int64_t S = call.S, H = cfg_.n_head, Dh = cfg_.head_dim, W = cfg_.window, pos0 = call.pos0;
  const kernels::DevScalar pos = call.pos();
  const size_t f = sizeof(float);
  std::optional<Phase> proj(std::in_place, *this, ctx, "attention.q_kv_projections");
  ASSIGN_OR_RETURN(auto kv, DevBuf<float>::make(ctx, S * Dh));
  DeviceLayerState& st = call.seq.layers[l];
  const bool decode = pos0 > 0 && S == 1;
  DevBuf<float> latent;  // the branch's: declared first, freed after side's join (also on an early return)
  BranchScope side(ctx, call.branch(1));
  RETURN_IF_ERROR(kv_path(l, call, side, x, kv.get(), latent));
  // Query; an index source's selection beside wq_b.
  ASSIGN_OR_RETURN(auto qr, DevBuf<float>::make(ctx, S * cfg_.q_lora_rank));
  RETURN_IF_ERROR(dev_linear(ctx, w.wq_a, x, S, qr.get()));
  RETURN_IF_ERROR(kernels::rms_norm_cuda(ctx, qr.get(), w.q_norm, S, cfg_.q_lora_rank, cfg_.norm_eps, qr.get()));
  BranchScope sel(ctx, call.branch(2));
  RETURN_IF_ERROR(select(l, call, sel, side.on() ? call.branch(1) : nullptr, x, qr.get()));
  ASSIGN_OR_RETURN(auto q, DevBuf<float>::make(ctx, S * H * Dh));
  RETURN_IF_ERROR(dev_linear(ctx, w.wq_b, qr.get(), S, q.get()));  // its RoPE is fused into sparse attention
  RETURN_IF_ERROR(side.join());
  RETURN_IF_ERROR(sel.join());
  DevBuf<float> joined;  // a later prefill chunk: [ring before this call ; this call's rows]
  const float* kv_a = pos0 == 0 ? kv.get() : st.ring.get();
  if (pos0 > 0 && !decode) {
    ASSIGN_OR_RETURN(joined, DevBuf<float>::make(ctx, (W + S) * Dh));
    RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToDevice, joined.get(), st.ring.get(), W * Dh * f));
    RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToDevice, joined.get() + W * Dh, kv.get(), S * Dh * f));
    kv_a = joined.get();
  }
  if (!decode) RETURN_IF_ERROR(kernels::attn::ring_write_cuda(ctx, kv.get(), pos, S, W, Dh, st.ring.get()));
  proj.reset();
  const float* kv_b = L.compress_ratio > 0 ? call.seq.layers[L.kv_source].comp_kv.buf.get() : nullptr;
  Phase sparse(*this, ctx, "attention.sparse_and_output");
  // Sparse attention with the sink over [window ; published top-k] (the window entries made
  // in the kernel, q's RoPE and the output's inverse RoPE there too), the grouped output.
  const int64_t ww = pos0 == 0 ? std::min(S, W) : W;
  const int64_t tw = L.compress_ratio > 0 ? call.topk_width : 0;
  ASSIGN_OR_RETURN(auto o, DevBuf<float>::make(ctx, S * H * Dh));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  const kernels::attn::AttnRope q_rope{rope, dims, pos};
  const kernels::attn::AttnWindow window{pos, W};
  RETURN_IF_ERROR(kernels::attn::sparse_attn_cuda(ctx, q.get(), S, static_cast<int>(H), Dh, kv_a, call.n_win, kv_b,
                                                  tw > 0 ? call.topk.get() : nullptr, ww + tw, w.sinks, scale, o.get(),
                                                  &q_rope, &window));
  return grouped_output(l, call, o.get(), y);
}

}  // namespace dsflash::model
