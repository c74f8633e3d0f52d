// The model on the CUDA backend: weights to the device, the forward pass (embedding, blocks
// with delayed-pre hyper-connections, head) and the Engram update, as in model.cc and ffn.cc
// (the MoE sub-layer: device_moe.cc).
#include "inference_svc/model/device_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "inference_svc/model/engram_rows.h"
#include "inference_svc/model/weights.h"
#include "kernels/dequant/dequant.h"
#include "kernels/engram/engram.h"
#include "kernels/engram/engram_cuda.h"
#include "kernels/hc/hc_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/norm/norm_cuda.h"

namespace dsflash::model {

using kernels::Copy;
using kernels::ExecCtx;

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

DeviceModel::Phase::Phase(const DeviceModel& m, const ExecCtx& ctx, const char* name)
    : m_(m), ctx_(ctx), name_(name), on_(m.profile_) {
  if (!on_) return;
  (void)kernels::stream_sync(ctx_);
  t0_ns_ = now_ns();
}

DeviceModel::Phase::~Phase() {
  if (!on_) return;
  (void)kernels::stream_sync(ctx_);
  const double ms = static_cast<double>(now_ns() - t0_ns_) / 1e6;
  std::lock_guard<std::mutex> lock(m_.profile_mu_);
  m_.profile_ms_[name_] += ms;
}

void DeviceModel::set_profiling(bool on) {
  std::lock_guard<std::mutex> lock(profile_mu_);
  if (on) profile_ms_.clear();
  profile_ = on;
}

std::map<std::string, double> DeviceModel::profile() const {
  std::lock_guard<std::mutex> lock(profile_mu_);
  return profile_ms_;
}

Status DevRows::append(const ExecCtx& ctx, const float* src, int64_t n) {
  if (n <= 0) return absl::OkStatus();
  RETURN_IF_ERROR(room_for(ctx, n));
  RETURN_IF_ERROR(
      kernels::copy(ctx, Copy::kDeviceToDevice, buf.get() + rows * width, src, n * width * sizeof(float)));
  rows += n;
  return absl::OkStatus();
}

Status DevRows::room_for(const ExecCtx& ctx, int64_t n) {
  if ((rows + n) * width <= buf.size()) return absl::OkStatus();
  return reserve(ctx, std::max<int64_t>(2 * (rows + n), 64));
}

Status DevRows::reserve(const ExecCtx& ctx, int64_t capacity) {
  if (capacity * width <= buf.size()) return absl::OkStatus();
  ASSIGN_OR_RETURN(DevBuf<float> bigger, DevBuf<float>::make(ctx, capacity * width));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToDevice, bigger.get(), buf.get(), rows * width * sizeof(float)));
  buf = std::move(bigger);
  ++reallocs;
  return absl::OkStatus();
}

DeviceSequence::~DeviceSequence() {
  for (kernels::Branch& b : branches) kernels::branch_destroy(b);
  for (kernels::Branch& b : engram_branches) kernels::branch_destroy(b);
  if (ctx.cuda_stream != nullptr) {
    (void)kernels::stream_sync(ctx);
    graphs.release();
    sampler.reset();
    layers.clear();  // frees on the stream before it goes
    (void)kernels::stream_sync(ctx);
    kernels::stream_destroy(ctx.cuda_stream);
  }
  kernels::host_free_pinned(engram_stage);
}

DeviceModel::~DeviceModel() {
  for (void* p : owned_) kernels::device_free(load_ctx_, p);
  if (load_ctx_.cuda_stream != nullptr) {
    (void)kernels::stream_sync(load_ctx_);
    kernels::stream_destroy(load_ctx_.cuda_stream);
  }
}

StatusOr<float*> DeviceModel::upload(const std::vector<float>& v) {
  if (v.empty()) return nullptr;
  ASSIGN_OR_RETURN(void* p, kernels::device_alloc(load_ctx_, v.size() * sizeof(float)));
  owned_.push_back(p);
  RETURN_IF_ERROR(kernels::copy(load_ctx_, Copy::kHostToDevice, p, v.data(), v.size() * sizeof(float)));
  return static_cast<float*>(p);
}

StatusOr<kernels::Weight> DeviceModel::upload(const kernels::Weight& w) {
  if (!w.valid()) return w;
  const size_t bytes = static_cast<size_t>(w.rows) * w.row_bytes;
  ASSIGN_OR_RETURN(void* p, kernels::device_alloc(load_ctx_, bytes));
  owned_.push_back(p);
  RETURN_IF_ERROR(kernels::copy(load_ctx_, Copy::kHostToDevice, p, w.data, bytes));
  kernels::Weight d = w;
  d.data = static_cast<const uint8_t*>(p);
  return d;
}

StatusOr<kernels::Weight> DeviceModel::upload_experts(const kernels::Weight& w) {
  const int64_t rows_per_expert = w.rows / std::max<int64_t>(1, cfg_.n_expert);
  if (expert_act_q8_ || !kernels::tiles_apply(w) || rows_per_expert % 16 != 0) return upload(w);
  return upload_tiled(w);
}

StatusOr<kernels::Weight> DeviceModel::upload_tiled(const kernels::Weight& w) {
  const size_t bytes = static_cast<size_t>(w.rows) * w.row_bytes;
  ASSIGN_OR_RETURN(void* p, kernels::device_alloc(load_ctx_, bytes));
  owned_.push_back(p);
  // Whole tiles (16 rows) at a time through a scratch buffer of up to 64 MB: a tile's bytes
  // land where its rows' bytes were, so each chunk is reordered into its own place.
  const int64_t tile_bytes = 16 * static_cast<int64_t>(w.row_bytes);
  const int64_t chunk_rows = 16 * std::clamp<int64_t>((int64_t{64} << 20) / tile_bytes, 1, w.rows / 16);
  ASSIGN_OR_RETURN(void* scratch, kernels::device_alloc(load_ctx_, static_cast<size_t>(chunk_rows) * w.row_bytes));
  Status s;
  for (int64_t r = 0; r < w.rows && s.ok(); r += chunk_rows) {
    kernels::Weight part = w.slice_rows(r, std::min(chunk_rows, w.rows - r));
    s = kernels::copy(load_ctx_, Copy::kHostToDevice, scratch, part.data, static_cast<size_t>(part.rows) * w.row_bytes);
    part.data = static_cast<const uint8_t*>(scratch);
    if (s.ok()) s = kernels::to_tiles_cuda(load_ctx_, part, static_cast<uint8_t*>(p) + r * w.row_bytes);
  }
  kernels::device_free(load_ctx_, scratch);  // stream-ordered: after the last reorder
  RETURN_IF_ERROR(s);
  kernels::Weight d = w;
  d.data = static_cast<const uint8_t*>(p);
  d.layout = kernels::WeightLayout::kTiles16;
  return d;
}

Status DeviceModel::upload_layer(const gguf::Model& file, int l) {
  ASSIGN_OR_RETURN(const LayerWeights w, load_layer(file, cfg_, l));
  Layer& d = layers_[l];
  for (auto [src, dst] : {std::pair{&w.hc_attn, &d.hc_attn}, std::pair{&w.hc_ffn, &d.hc_ffn}}) {
    ASSIGN_OR_RETURN(dst->fn, upload(src->fn));
    ASSIGN_OR_RETURN(dst->base, upload(src->base));
    ASSIGN_OR_RETURN(dst->scale, upload(src->scale));
  }
  const std::pair<const std::vector<float>*, float**> vecs[] = {
      {&w.attn_norm, &d.attn_norm}, {&w.ffn_norm, &d.ffn_norm},     {&w.attn_sinks, &d.sinks},
      {&w.q_norm, &d.q_norm},       {&w.kv_norm, &d.kv_norm},       {&w.comp_norm, &d.comp_norm},
      {&w.idx_k_norm, &d.idx_k_norm}, {&w.exp_probs_b, &d.exp_probs_b}, {&w.engram_qk, &d.engram_qk}};
  for (const auto& [src, dst] : vecs) {
    ASSIGN_OR_RETURN(*dst, upload(*src));
  }
  const std::pair<const kernels::Weight*, kernels::Weight*> mats[] = {
      {&w.wq_a, &d.wq_a},         {&w.wq_b, &d.wq_b},         {&w.wkv, &d.wkv},
      {&w.wo_a, &d.wo_a},         {&w.wo_b, &d.wo_b},         {&w.comp_kv, &d.comp_kv},
      {&w.comp_gate, &d.comp_gate}, {&w.idx_wk, &d.idx_wk},   {&w.idx_wq_b, &d.idx_wq_b},
      {&w.idx_proj, &d.idx_proj}, {&w.gate_inp, &d.gate_inp}, {&w.sh_gate, &d.sh_gate},
      {&w.sh_up, &d.sh_up},       {&w.sh_down, &d.sh_down},   {&w.engram_wkv, &d.engram_wkv}};
  for (const auto& [src, dst] : mats) {
    ASSIGN_OR_RETURN(*dst, upload(*src));
  }
  if (engram_host_) {
    d.engram_embd = w.engram_embd;  // stays in the mapped file (engram_rows.h)
  } else {
    ASSIGN_OR_RETURN(d.engram_embd, upload(w.engram_embd));
  }
  if (streamed_ != nullptr) return absl::OkStatus();  // the routed experts come from the source
  const std::string p = absl::StrCat("blk.", l, ".");
  for (auto [name, dst] : {std::pair{"ffn_gate_exps.weight", &d.exp_gate}, std::pair{"ffn_up_exps.weight", &d.exp_up},
                           std::pair{"ffn_down_exps.weight", &d.exp_down}}) {
    const gguf::TensorInfo* t = file.find_tensor(p + name);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor ", p, name));
    ASSIGN_OR_RETURN(const kernels::Weight host, kernels::weight_view(file, *t));
    ASSIGN_OR_RETURN(*dst, upload_experts(host));
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::load(const gguf::Model& file, const config::ModelConfig& cfg,
                                                         ExpertSource* streamed, const Options& options) {
  if (!kernels::cuda_available()) {
    return absl::FailedPreconditionError("the CUDA backend was asked for, but no CUDA device is usable (or this build has no CUDA)");
  }
  std::unique_ptr<DeviceModel> m(new DeviceModel());
  m->cfg_ = cfg;
  m->streamed_ = streamed;
  m->prefetch_next_ = options.prefetch_next_layer;
  m->engram_host_ = options.engram_on_host;
  m->expert_act_q8_ = options.expert_act_q8;
  ASSIGN_OR_RETURN(void* stream, kernels::stream_create());
  m->load_ctx_ = ExecCtx{kernels::Backend::kCuda, stream};
  m->layers_.resize(cfg.n_layer);
  for (uint32_t l = 0; l < cfg.n_layer; ++l) RETURN_IF_ERROR(m->upload_layer(file, static_cast<int>(l)));
  ASSIGN_OR_RETURN(const kernels::Weight embd, kernels::weight_view(file, *file.find_tensor("token_embd.weight")));
  ASSIGN_OR_RETURN(m->token_embd_, m->upload(embd));
  // The head is read by linear_cuda alone: a Q6_K head goes in the tile layout (~0.24 ms of a
  // perf-preset step at ~2.2 TB/s in the GGUF order, whose odd blocks are 2-byte aligned).
  ASSIGN_OR_RETURN(const kernels::Weight head, kernels::weight_view(file, *file.find_tensor("output.weight")));
  if (kernels::linear_tiles_apply(head)) {
    ASSIGN_OR_RETURN(m->output_, m->upload_tiled(head));
  } else {
    ASSIGN_OR_RETURN(m->output_, m->upload(head));
  }
  ASSIGN_OR_RETURN(const std::vector<float> norm, load_f32(file, "output_norm.weight"));
  ASSIGN_OR_RETURN(m->output_norm_, m->upload(norm));
  const auto plain = kernels::rope::make_table(static_cast<int>(cfg.rope_dims), cfg.rope_theta, 0, 1.0f, 0, 0);
  const auto yarn = kernels::rope::make_table(static_cast<int>(cfg.rope_dims), cfg.compress_rope_theta,
                                              static_cast<int>(cfg.yarn_orig_ctx), cfg.yarn_factor, cfg.yarn_beta_fast,
                                              cfg.yarn_beta_slow);
  ASSIGN_OR_RETURN(m->rope_plain_, m->upload(plain.freqs));
  ASSIGN_OR_RETURN(m->rope_yarn_, m->upload(yarn.freqs));
  std::vector<float> pre_init(cfg.hc_mult, 0.0f);
  pre_init[0] = 1.0f;
  ASSIGN_OR_RETURN(m->pre_init_, m->upload(pre_init));
  for (Layer& w : m->layers_) {
    w.routed_on_device = streamed == nullptr && m->experts_have_decode_gemvs(m->resident_table(w, nullptr));
  }
  m->routed_decode_ = std::all_of(m->layers_.begin(), m->layers_.end(), [](const Layer& w) { return w.routed_on_device; });
  RETURN_IF_ERROR(kernels::stream_sync(m->load_ctx_));
  return m;
}

StatusOr<std::shared_ptr<DeviceSequence>> DeviceModel::new_sequence() const {
  auto s = std::make_shared<DeviceSequence>();
  ASSIGN_OR_RETURN(void* stream, kernels::stream_create());
  s->ctx = ExecCtx{kernels::Backend::kCuda, stream};
  static const bool branches = [] {
    const char* e = std::getenv("DSF_BRANCHES");
    return e == nullptr || std::string_view(e) != "0";
  }();
  if (branches) {
    for (kernels::Branch& b : s->branches) {
      ASSIGN_OR_RETURN(b, kernels::branch_create());
    }
    for (size_t e = 0; e < cfg_.engram.layer_ids.size(); ++e) {
      ASSIGN_OR_RETURN(kernels::Branch b, kernels::branch_create());
      s->engram_branches.push_back(b);
    }
  }
  s->layers.resize(cfg_.n_layer);
  const int64_t Dh = cfg_.head_dim;
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) {
    DeviceLayerState& st = s->layers[l];
    ASSIGN_OR_RETURN(st.ring, DevBuf<float>::make(s->ctx, cfg_.window * Dh));
    RETURN_IF_ERROR(kernels::fill_zero(s->ctx, st.ring.get(), cfg_.window * Dh * sizeof(float)));
    st.comp_kv.width = Dh;
    st.index_k.width = cfg_.index_head_dim;
    if (cfg_.layers[l].is_kv_source && cfg_.layers[l].compress_ratio == 2) {
      ASSIGN_OR_RETURN(st.kv_state, DevBuf<float>::make(s->ctx, 2 * Dh));
      ASSIGN_OR_RETURN(st.score_state, DevBuf<float>::make(s->ctx, 2 * Dh));
      const std::vector<float> zero(2 * Dh, 0.0f), ninf(2 * Dh, -INFINITY);
      RETURN_IF_ERROR(kernels::copy(s->ctx, Copy::kHostToDevice, st.kv_state.get(), zero.data(), 2 * Dh * sizeof(float)));
      RETURN_IF_ERROR(kernels::copy(s->ctx, Copy::kHostToDevice, st.score_state.get(), ninf.data(), 2 * Dh * sizeof(float)));
    }
  }
  RETURN_IF_ERROR(kernels::stream_sync(s->ctx));
  return s;
}

StatusOr<std::shared_ptr<DeviceSequence>> DeviceModel::copy_sequence(const DeviceSequence& src) const {
  if (src.layers.size() != cfg_.n_layer) return absl::InvalidArgumentError("the sequence is not one of this model's");
  RETURN_IF_ERROR(kernels::stream_sync(src.ctx));
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceSequence> s, new_sequence());
  auto same = [&](DevBuf<float>& dst, const DevBuf<float>& from) -> Status {
    if (dst.size() != from.size()) return absl::InternalError("a sequence buffer differs in size from its copy");
    return from.size() == 0 ? absl::OkStatus()
                            : kernels::copy(s->ctx, Copy::kDeviceToDevice, dst.get(), from.get(), from.size() * sizeof(float));
  };
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) {
    const DeviceLayerState& a = src.layers[l];
    DeviceLayerState& b = s->layers[l];
    RETURN_IF_ERROR(same(b.ring, a.ring));
    RETURN_IF_ERROR(same(b.kv_state, a.kv_state));
    RETURN_IF_ERROR(same(b.score_state, a.score_state));
    RETURN_IF_ERROR(b.comp_kv.append(s->ctx, a.comp_kv.buf.get(), a.comp_kv.rows));
    RETURN_IF_ERROR(b.index_k.append(s->ctx, a.index_k.buf.get(), a.index_k.rows));
  }
  RETURN_IF_ERROR(kernels::stream_sync(s->ctx));
  return s;
}

Status DeviceModel::forward(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceOut& out) const {
  const int64_t S = static_cast<int64_t>(tokens.size());
  if (graph_eligible(seq, S)) return graph_step(seq, tokens[0], out);
  return eager(seq, tokens, out);
}

Status DeviceModel::deliver(DeviceSequence& ds, float* logits, int64_t rows, const DeviceOut& out) const {
  const int64_t V = output_.rows;
  if (out.draw == nullptr) {
    out.logits->assign(static_cast<size_t>(rows * V), 0.0f);
    RETURN_IF_ERROR(kernels::copy(ds.ctx, Copy::kDeviceToHost, out.logits->data(), logits, rows * V * sizeof(float)));
    return kernels::stream_sync(ds.ctx);
  }
  if (ds.sampler == nullptr) {
    ASSIGN_OR_RETURN(ds.sampler, kernels::sample::DeviceSampler::create(ds.ctx, V));
  }
  const DeviceDraw& d = *out.draw;
  // The logits are the pass's own buffer: the draw's edits change them in place.
  float* last = logits + (rows - 1) * V;
  if (d.top_logprobs >= 0) {
    ASSIGN_OR_RETURN(*out.token, ds.sampler->draw_logprobs(last, V, d.edits, d.penalties, d.params, d.u01,
                                                            d.top_logprobs, out.logprobs));
  } else {
    ASSIGN_OR_RETURN(*out.token, ds.sampler->draw(last, V, d.edits, d.penalties, d.params, d.u01));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<int64_t>> DeviceModel::engram_ids(const Sequence& seq, int64_t pos0, int64_t S) const {
  const config::EngramConfig& ec = cfg_.engram;
  const int64_t cols = ec.cols();
  std::vector<int64_t> ids(ec.layer_ids.size() * static_cast<size_t>(S * cols));
  for (size_t e = 0; e < ec.layer_ids.size(); ++e) {
    const int l = ec.layer_ids[e];
    int64_t* out = ids.data() + e * S * cols;
    for (int64_t t = 0; t < S; ++t) kernels::engram::hash_ids(ec, e, seq.engram_ids.data(), pos0 + t + 1, out + t * cols);
    for (int64_t i = 0; i < S * cols; ++i) {
      if (out[i] < 0 || out[i] >= layers_[l].engram_embd.rows) {
        return absl::InternalError(absl::StrCat("Engram layer ", l, ": row id ", out[i], " outside the table"));
      }
    }
  }
  return ids;
}

// A call run as issued: token and Engram ids uploaded, the pass, its logits handed back.
Status DeviceModel::eager(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceOut& dout) const {
  DeviceSequence& ds = *seq.device;
  const ExecCtx& ctx = ds.ctx;
  const bool all_logits = dout.all_logits;
  const int64_t S = static_cast<int64_t>(tokens.size()), V = output_.rows, n = all_logits ? S : 1;
  Call call(ctx, ds);
  call.source = streamed_;
  call.pos0 = seq.n_past;
  call.S = S;
  call.n_win = call.pos0 == 0 ? S : (S == 1 ? cfg_.window : cfg_.window + S);
  ASSIGN_OR_RETURN(std::vector<int64_t> eids, engram_ids(seq, call.pos0, S));
  std::vector<int64_t> table_ids;
  DevBuf<uint8_t> rows_d;
  if (engram_host_) {  // the ids number the staged rows; engram() stages them layer by layer
    table_ids = begin_engram_staging(eids, S);
    call.engram_host_ids = table_ids.data();
    const uint64_t bytes = engram_stage_offset(cfg_.engram.layer_ids.size(), S);
    ASSIGN_OR_RETURN(call.engram_stage, engram_stage(ds, bytes));
    ASSIGN_OR_RETURN(rows_d, DevBuf<uint8_t>::make(ctx, static_cast<int64_t>(bytes)));
    call.engram_rows = rows_d.get();
  }
  ASSIGN_OR_RETURN(auto eids_d, DevBuf<int64_t>::make(ctx, static_cast<int64_t>(eids.size())));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, eids_d.get(), eids.data(), eids.size() * sizeof(int64_t)));
  call.engram_ids = eids_d.get();
  ASSIGN_OR_RETURN(auto ids, DevBuf<int64_t>::make(ctx, S));
  const std::vector<int64_t> ids_h(tokens.begin(), tokens.end());
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, ids.get(), ids_h.data(), S * sizeof(int64_t)));
  ASSIGN_OR_RETURN(auto out, DevBuf<float>::make(ctx, n * V));
  RETURN_IF_ERROR(pass(call, ids.get(), all_logits, out.get()));
  return deliver(ds, out.get(), n, dout);
}

// Engram projections read the token ids alone (through their hashed rows), not h: where a
// call's rows are at hand when it is issued (tables on the device, or a replay's staged rows)
// and it is short (decode steps; held kv is S x 100 KB a layer), each Engram layer's rows are
// gathered and projected from the pass's start on a branch of its own, beside the layers before
// it, each branch after the previous one's; the layer joins it before its gate. Otherwise (a
// prefill chunk staging its rows layer by layer, a segmented capture, no branches) the layer
// projects them itself.
class DeviceModel::EngramAhead {
 public:
  static constexpr int64_t kMaxTokens = 64;
  explicit EngramAhead(const ExecCtx& main) : main_(main) {}
  EngramAhead(const EngramAhead&) = delete;
  EngramAhead& operator=(const EngramAhead&) = delete;
  ~EngramAhead() {  // an early return: nothing the branches write is freed before they have run
    for (const kernels::Branch* b : open_) {
      if (b != nullptr) (void)kernels::join(main_, *b);
    }
  }

  Status start(const DeviceModel& m, Call& call) {
    const size_t n = m.cfg_.engram.layer_ids.size();
    if (n == 0 || call.S > kMaxTokens || (m.engram_host_ && call.engram_host_ids != nullptr)) return absl::OkStatus();
    const char* env = std::getenv("DSF_ENGRAM_AHEAD");  // "0": in the layers (measurement, tests)
    if (env != nullptr && std::string_view(env) == "0") return absl::OkStatus();
    for (size_t e = 0; e < n; ++e) {
      if (call.engram_branch(e) == nullptr) return absl::OkStatus();
    }
    kv_.resize(n);
    open_.assign(n, nullptr);
    for (size_t e = 0; e < n; ++e) {
      const kernels::Branch& b = *call.engram_branch(e);
      ASSIGN_OR_RETURN(kv_[e], DevBuf<float>::make(main_, call.S * m.layers_[m.cfg_.engram.layer_ids[e]].engram_wkv.rows));
      RETURN_IF_ERROR(kernels::fork(main_, b));
      open_[e] = &b;
      if (e > 0) RETURN_IF_ERROR(kernels::join(b.ctx, *open_[e - 1]));  // one projection at a time
      RETURN_IF_ERROR(m.engram_project(e, call, b.ctx, kv_[e].get()));
    }
    return absl::OkStatus();
  }

  // Engram layer e's kv once main has joined its branch, or null: not projected ahead.
  StatusOr<const float*> take(size_t e) {
    if (e >= open_.size() || open_[e] == nullptr) return nullptr;
    RETURN_IF_ERROR(kernels::join(main_, *open_[e]));
    open_[e] = nullptr;
    return kv_[e].get();
  }

 private:
  const ExecCtx& main_;
  std::vector<DevBuf<float>> kv_;  // freed on main, after the joins
  std::vector<const kernels::Branch*> open_;
};

Status DeviceModel::pass(Call& call, const int64_t* ids, bool all_logits, float* out) const {
  const ExecCtx& ctx = call.ctx;
  const int64_t S = call.S, C = cfg_.hc_mult, D = cfg_.n_embd;
  // Embedding: bf16 rows copied into every stream.
  std::optional<Phase> embed_phase(std::in_place, *this, ctx, "embed");
  ASSIGN_OR_RETURN(auto row, DevBuf<float>::make(ctx, S * D));
  RETURN_IF_ERROR(kernels::dequant::gather_rows_cuda(ctx, token_embd_.type, token_embd_.data, token_embd_.cols,
                                                     token_embd_.row_bytes, token_embd_.rows, ids, S, true,
                                                     row.get()));
  // The streams: each sub-layer's expansion writes the other buffer (its residual input stays).
  ASSIGN_OR_RETURN(auto h_a, DevBuf<float>::make(ctx, S * C * D));
  ASSIGN_OR_RETURN(auto h_b, DevBuf<float>::make(ctx, S * C * D));
  float *h = h_a.get(), *h_alt = h_b.get();
  for (int64_t c = 0; c < C; ++c) {
    RETURN_IF_ERROR(kernels::copy_2d(ctx, h + c * D, C * D * sizeof(float), row.get(), D * sizeof(float),
                                     D * sizeof(float), S));
  }
  ASSIGN_OR_RETURN(auto pre_mix, DevBuf<float>::make(ctx, S * C));
  ASSIGN_OR_RETURN(auto spare_pre, DevBuf<float>::make(ctx, S * C));
  if (S == 1) {  // a decode step (may be captured: no host source)
    RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToDevice, pre_mix.get(), pre_init_, C * sizeof(float)));
  } else {
    std::vector<float> pre_h(static_cast<size_t>(S * C), 0.0f);
    for (int64_t t = 0; t < S; ++t) pre_h[t * C] = 1.0f;
    RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, pre_mix.get(), pre_h.data(), pre_h.size() * sizeof(float)));
  }
  embed_phase.reset();
  ASSIGN_OR_RETURN(auto x, DevBuf<float>::make(ctx, S * cfg_.n_embd));
  EngramAhead ahead(ctx);
  RETURN_IF_ERROR(ahead.start(*this, call));
  bool x_ready = false;
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) {
    if (cfg_.layers[l].has_engram && !x_ready) {  // else the block before applied its gate (block())
      Phase phase(*this, ctx, "engram");
      RETURN_IF_ERROR(engram(static_cast<int>(l), call, h, ahead));
    }
    RETURN_IF_ERROR(block(static_cast<int>(l), call, h, h_alt, pre_mix, spare_pre, x.get(), x_ready, ahead));
  }
  Phase phase(*this, ctx, "head");
  return head(call, h, pre_mix.get(), x_ready ? x.get() : nullptr, all_logits, out);
}

// One block (model.cc Model::block): each sub-layer collapses the streams with the previous
// sub-layer's pre coefficients and expands back with its own; pre buffers alternate, and so do
// the stream buffers (the expansion reads h as its residual and writes h_alt). A sub-layer's
// expansion also makes the next sub-layer's normed input where that follows directly, and the
// head's after the last block; before an Engram layer, with that layer's gate and update
// between (post_gate_pre_norm_cuda; else the layer's own launch, pass()).
Status DeviceModel::block(int l, Call& call, float*& h, float*& h_alt, DevBuf<float>& pre_mix,
                          DevBuf<float>& spare_pre, float* x, bool& x_ready, EngramAhead& ahead) const {
  const Layer& w = layers_[l];
  const ExecCtx& ctx = call.ctx;
  const int C = static_cast<int>(cfg_.hc_mult);
  const int64_t D = cfg_.n_embd, S = call.S;
  ASSIGN_OR_RETURN(auto post, DevBuf<float>::make(ctx, S * C));
  ASSIGN_OR_RETURN(auto comb, DevBuf<float>::make(ctx, S * C * C));
  ASSIGN_OR_RETURN(auto y, DevBuf<float>::make(ctx, S * D));
  // next_norm: the next sub-layer's norm weights when its input is made here, else null;
  // gate_layer: the Engram layer whose gate comes between (with next_norm), or -1.
  auto sublayer = [&](const Layer::Hc& hw, const float* norm, const float* in_pre, float* out_pre,
                      const float* next_norm, int gate_layer, auto&& body) -> Status {
    std::optional<Phase> hc_phase(std::in_place, *this, ctx, "hc_pre_norm");
    const int iters = static_cast<int>(cfg_.hc_sinkhorn_iters);
    BranchScope split(ctx, call.branch(0));
    if (split.on()) {
      // The split feeds only this sub-layer's post and the next one's pre: beside the norm and
      // the body (its serial Sinkhorn passes are the longest kernel of a sub-layer's entry).
      RETURN_IF_ERROR(split.fork());
      RETURN_IF_ERROR(kernels::hc::mixes_split_cuda(split.ctx(), h, hw.fn, hw.scale, hw.base, C, D, S, cfg_.norm_eps,
                                                    iters, cfg_.hc_eps, out_pre, post.get(), comb.get()));
      if (!x_ready) RETURN_IF_ERROR(kernels::hc::pre_norm_cuda(ctx, h, in_pre, C, D, S, norm, cfg_.norm_eps, x));
    } else if (x_ready) {
      RETURN_IF_ERROR(kernels::hc::mixes_split_cuda(ctx, h, hw.fn, hw.scale, hw.base, C, D, S, cfg_.norm_eps, iters,
                                                    cfg_.hc_eps, out_pre, post.get(), comb.get()));
    } else {
      RETURN_IF_ERROR(kernels::hc::sublayer_in_cuda(ctx, h, hw.fn, hw.scale, hw.base, C, D, S, cfg_.norm_eps, iters,
                                                    cfg_.hc_eps, in_pre, norm, out_pre, post.get(), comb.get(), x));
    }
    hc_phase.reset();
    RETURN_IF_ERROR(body());
    RETURN_IF_ERROR(split.join());
    Phase post_phase(*this, ctx, "hc_post");
    if (gate_layer >= 0) {  // the Engram layer after this block, then the next sub-layer's norm
      // Its kv joined (or projected) only here: the projection ahead runs beside the block.
      DevBuf<float> own;
      ASSIGN_OR_RETURN(const float* kv, engram_kv(gate_layer, call, ahead, own));
      RETURN_IF_ERROR(kernels::hc::post_gate_pre_norm_cuda(ctx, y.get(), h, post.get(), comb.get(), C, D, S, kv,
                                                           layers_[gate_layer].engram_qk, out_pre, next_norm,
                                                           cfg_.norm_eps, h_alt, x));
    } else if (next_norm != nullptr) {  // the next sub-layer's pre is this one's (out_pre)
      RETURN_IF_ERROR(kernels::hc::post_pre_norm_cuda(ctx, y.get(), h, post.get(), comb.get(), C, D, S, out_pre,
                                                      next_norm, cfg_.norm_eps, h_alt, x));
    } else {
      RETURN_IF_ERROR(kernels::hc::post_cuda(ctx, y.get(), h, post.get(), comb.get(), C, D, S, h_alt));
    }
    x_ready = next_norm != nullptr;
    std::swap(h, h_alt);
    return absl::OkStatus();
  };
  // What follows the block directly: the next block's attention norm, or the head's norm.
  const bool last = l + 1 == static_cast<int>(cfg_.n_layer);
  const bool next_block = !last && !cfg_.layers[l + 1].has_engram;
  const float* exit_norm = next_block ? layers_[l + 1].attn_norm : last ? output_norm_ : nullptr;
  // An Engram layer next: its gate joins the block's exit where one kernel takes them
  // (post_gate_pre_norm_cuda).
  int gate_layer = -1;
  if (!last && !next_block && kernels::hc::post_gate_pre_norm_applies(C, D)) {
    gate_layer = l + 1;
    exit_norm = layers_[l + 1].attn_norm;
  }
  RETURN_IF_ERROR(sublayer(w.hc_attn, w.attn_norm, pre_mix.get(), spare_pre.get(), w.ffn_norm, -1,
                           [&] {
                             Phase phase(*this, ctx, "attention");
                             return attention(l, call, x, y.get());
                           }));
  RETURN_IF_ERROR(sublayer(w.hc_ffn, w.ffn_norm, spare_pre.get(), pre_mix.get(),
                           exit_norm, gate_layer,
                           [&] {
                             Phase phase(*this, ctx, "moe");
                             return moe(l, call, x, y.get());
                           }));
  return absl::OkStatus();
}

Status DeviceModel::head(Call& call, const float* h, const float* pre_mix, const float* normed, bool all_logits,
                         float* out) const {
  const ExecCtx& ctx = call.ctx;
  const int C = static_cast<int>(cfg_.hc_mult);
  const int64_t D = cfg_.n_embd, S = call.S;
  const int64_t first = all_logits ? 0 : S - 1, n = S - first;
  if (normed != nullptr) return dev_linear(ctx, output_, normed + first * D, n, out, kernels::OutRound::kF32);
  ASSIGN_OR_RETURN(auto x, DevBuf<float>::make(ctx, n * D));
  RETURN_IF_ERROR(kernels::hc::pre_norm_cuda(ctx, h + first * C * D, pre_mix + first * C, C, D, n, output_norm_,
                                             cfg_.norm_eps, x.get()));
  return dev_linear(ctx, output_, x.get(), n, out, kernels::OutRound::kF32);
}

// Engram (ffn.cc Model::engram): rows of the call's ids (hashed on the host, call.engram_ids)
// gathered and projected on the device, gate and update.
Status DeviceModel::engram(int l, Call& call, float* h, EngramAhead& ahead) const {
  DevBuf<float> own;
  ASSIGN_OR_RETURN(const float* kv, engram_kv(l, call, ahead, own));
  return kernels::engram::gate_update_cuda(call.ctx, h, kv, layers_[l].engram_qk, static_cast<int>(cfg_.hc_mult),
                                           cfg_.n_embd, call.S, cfg_.norm_eps, nullptr);
}

StatusOr<const float*> DeviceModel::engram_kv(int l, Call& call, EngramAhead& ahead, DevBuf<float>& own) const {
  size_t e = 0;
  while (cfg_.engram.layer_ids[e] != l) ++e;
  ASSIGN_OR_RETURN(const float* kv, ahead.take(e));
  if (kv != nullptr) return kv;
  ASSIGN_OR_RETURN(own, DevBuf<float>::make(call.ctx, call.S * layers_[l].engram_wkv.rows));
  RETURN_IF_ERROR(engram_project(e, call, call.ctx, own.get()));
  return own.get();
}

Status DeviceModel::engram_project(size_t e, Call& call, const ExecCtx& ctx, float* kv) const {
  const Layer& w = layers_[cfg_.engram.layer_ids[e]];
  const int64_t cols = cfg_.engram.cols(), S = call.S;
  // The table on the device, or the call's rows staged from the host (by a replay's host
  // before it ran, else here: the copy overlaps the layers the stream is still running).
  const uint8_t* table = w.engram_embd.data;
  int64_t n_rows = w.engram_embd.rows;
  if (engram_host_) {
    const uint64_t off = engram_stage_offset(e, S);
    if (call.engram_host_ids != nullptr) {
      RETURN_IF_ERROR(stage_engram_rows(ctx, e, call.engram_host_ids + e * S * cols, S, call.engram_stage + off,
                                        call.engram_rows + off));
    }
    table = call.engram_rows + off;
    n_rows = S * cols;
  }
  // Allocated and freed on ctx: a branch's rows are freed on the branch, after its projection.
  ASSIGN_OR_RETURN(auto rows, DevBuf<float>::make(ctx, S * cols * w.engram_embd.cols));
  RETURN_IF_ERROR(kernels::dequant::gather_rows_cuda(ctx, w.engram_embd.type, table, w.engram_embd.cols,
                                                     w.engram_embd.row_bytes, n_rows,
                                                     call.engram_ids + e * S * cols, S * cols, true, rows.get()));
  return dev_linear(ctx, w.engram_wkv, rows.get(), S, kv);
}

uint64_t DeviceModel::engram_stage_offset(size_t e, int64_t S) const {
  uint64_t off = 0;
  for (size_t i = 0; i < e; ++i) {
    off += static_cast<uint64_t>(S * cfg_.engram.cols()) * layers_[cfg_.engram.layer_ids[i]].engram_embd.row_bytes;
  }
  return off;
}

StatusOr<uint8_t*> DeviceModel::engram_stage(DeviceSequence& ds, uint64_t bytes) const {
  RETURN_IF_ERROR(kernels::stream_sync(ds.ctx));  // no copy from an earlier (failed) call pending
  if (bytes > ds.engram_stage_bytes) {
    kernels::host_free_pinned(ds.engram_stage);
    ds.engram_stage = nullptr;
    ds.engram_stage_bytes = 0;
    ASSIGN_OR_RETURN(void* p, kernels::host_alloc_pinned(std::max<uint64_t>(bytes, 64 << 10)));
    ds.engram_stage = static_cast<uint8_t*>(p);
    ds.engram_stage_bytes = std::max<uint64_t>(bytes, 64 << 10);
  }
  return ds.engram_stage;
}

std::vector<int64_t> DeviceModel::begin_engram_staging(std::vector<int64_t>& ids, int64_t S) const {
  const int64_t per_layer = S * cfg_.engram.cols();
  for (size_t e = 0; e < cfg_.engram.layer_ids.size(); ++e) {
    prefetch_rows(layers_[cfg_.engram.layer_ids[e]].engram_embd, ids.data() + e * per_layer, per_layer);
  }
  std::vector<int64_t> table_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) % per_layer;
  return table_ids;
}

Status DeviceModel::stage_engram_rows(const ExecCtx& ctx, size_t e, const int64_t* ids, int64_t S, uint8_t* stage,
                                      uint8_t* dev) const {
  const kernels::Weight& table = layers_[cfg_.engram.layer_ids[e]].engram_embd;
  const int64_t n = S * cfg_.engram.cols();
  copy_rows(table, ids, n, stage);
  return kernels::copy(ctx, Copy::kHostToDevice, dev, stage, static_cast<uint64_t>(n) * table.row_bytes);
}

}  // namespace dsflash::model
