// Model loading and the forward pass: embedding, stream expansion, the blocks with their
// delayed-pre hyper-connections (spec §2.1-2.2), the final collapse and the head (§2.10).
#include "inference_svc/model/model.h"

#include "absl/strings/str_cat.h"
#include "common/quant/numeric.h"
#include "inference_svc/model/call.h"
#include "inference_svc/model/device_model.h"
#include "inference_svc/model/weights.h"
#include "kernels/exec.h"
#include "kernels/hc/hc.h"
#include "kernels/norm/norm.h"

namespace dsflash::model {

Model::~Model() = default;

StatusOr<std::unique_ptr<Model>> Model::load(const gguf::Model& file, std::unique_ptr<ExpertSource> experts,
                                             const LoadOptions& options) {
  if (options.expert_act_q8 && options.backend != kernels::Backend::kCuda) {
    return absl::InvalidArgumentError(
        "8-bit expert activations (--expert-activations q8) are a CUDA-backend option; the CPU backend multiplies fp32 "
        "activations (run with --backend cuda, or leave them at f32)");
  }
  std::unique_ptr<Model> m(new Model());
  ASSIGN_OR_RETURN(m->cfg_, config::from_gguf(file));
  RETURN_IF_ERROR(config::validate_tensors(m->cfg_, file));
  const config::ModelConfig& c = m->cfg_;
  if (c.hc_mult > static_cast<uint32_t>(kernels::hc::Split::kMaxC)) {
    return absl::UnimplementedError(absl::StrCat("hyper_connection.count ", c.hc_mult, " > ", kernels::hc::Split::kMaxC));
  }
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    ASSIGN_OR_RETURN(LayerWeights w, load_layer(file, c, static_cast<int>(l)));
    m->layers_.push_back(std::move(w));
  }
  ASSIGN_OR_RETURN(m->token_embd_, kernels::weight_view(file, *file.find_tensor("token_embd.weight")));
  ASSIGN_OR_RETURN(m->output_, kernels::weight_view(file, *file.find_tensor("output.weight")));
  ASSIGN_OR_RETURN(m->output_norm_, load_f32(file, "output_norm.weight"));
  m->rope_plain_ = kernels::rope::make_table(static_cast<int>(c.rope_dims), c.rope_theta, 0, 1.0f, 0, 0);
  m->rope_yarn_ = kernels::rope::make_table(static_cast<int>(c.rope_dims), c.compress_rope_theta,
                                            static_cast<int>(c.yarn_orig_ctx), c.yarn_factor, c.yarn_beta_fast,
                                            c.yarn_beta_slow);
  if (experts == nullptr) {
    ASSIGN_OR_RETURN(auto src, GgufExpertSource::create(file, c));
    experts = std::move(src);
  }
  m->experts_ = std::move(experts);
  const bool in_process = dynamic_cast<GgufExpertSource*>(m->experts_.get()) != nullptr;
  const bool device_memory = m->experts_->memory() == kernels::Backend::kCuda;
  if (options.backend == kernels::Backend::kCuda) {
    if (!in_process && !device_memory) {
      return absl::FailedPreconditionError(
          "the CUDA backend reads streamed experts from device memory, but this expert source hands out host memory "
          "(start dsflash-expertstore with --arena device)");
    }
    DeviceModel::Options o;
    o.prefetch_next_layer = options.prefetch_next_layer;
    o.engram_on_host = options.engram_tables == LoadOptions::EngramTables::kHost ||
                       (options.engram_tables == LoadOptions::EngramTables::kAuto && !in_process);
    o.expert_act_q8 = options.expert_act_q8;
    ASSIGN_OR_RETURN(m->device_, DeviceModel::load(file, c, in_process ? nullptr : m->experts_.get(), o));
  } else if (device_memory) {
    return absl::FailedPreconditionError(
        "the CPU backend reads experts from host memory, but this expert source hands out device memory "
        "(start dsflash-expertstore with --arena host, or run with --backend cuda)");
  }
  return m;
}

void Model::set_profiling(bool on) {
  if (device_) device_->set_profiling(on);
}

void Model::set_decode_graphs(bool on) {
  if (device_) device_->set_decode_graphs(on);
}

int64_t Model::decode_graph_replays() const { return device_ ? device_->graph_replays() : 0; }

std::map<std::string, double> Model::profile() const { return device_ ? device_->profile() : std::map<std::string, double>{}; }

std::unique_ptr<Sequence> Model::new_sequence() const {
  auto s = std::make_unique<Sequence>();
  if (device_) {
    auto d = device_->new_sequence();
    if (!d.ok()) return nullptr;
    s->device = std::move(*d);
    return s;
  }
  s->layers.resize(cfg_.n_layer);
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) {
    LayerState& st = s->layers[l];
    st.window.assign(static_cast<size_t>(cfg_.window) * cfg_.head_dim, 0.0f);
    if (cfg_.layers[l].is_kv_source && cfg_.layers[l].compress_ratio == 2) {
      st.kv_state.assign(2 * cfg_.head_dim, 0.0f);
      st.score_state.assign(2 * cfg_.head_dim, -INFINITY);
    }
  }
  return s;
}

Status Model::release_memory() const {
  return device_ != nullptr ? kernels::release_cached_memory() : absl::OkStatus();
}

StatusOr<std::unique_ptr<Sequence>> Model::copy_sequence(const Sequence& seq) const {
  if ((device_ != nullptr) != (seq.device != nullptr) || (device_ == nullptr && seq.layers.size() != cfg_.n_layer)) {
    return absl::InvalidArgumentError("the sequence is not one of this model's");
  }
  if (device_ == nullptr) return std::make_unique<Sequence>(seq);
  auto s = std::make_unique<Sequence>();
  s->n_past = seq.n_past;
  s->engram_ids = seq.engram_ids;
  ASSIGN_OR_RETURN(s->device, device_->copy_sequence(*seq.device));
  return s;
}

void Model::embed(const std::vector<int32_t>& tokens, std::vector<float>& h) const {
  const int64_t C = cfg_.hc_mult, D = cfg_.n_embd;
  h.resize(tokens.size() * C * D);
  std::vector<float> row(static_cast<size_t>(D));
  for (size_t t = 0; t < tokens.size(); ++t) {
    kernels::decode_weight_row(token_embd_, tokens[t], row.data());
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t d = 0; d < D; ++d) h[(t * C + c) * D + d] = quant::round_bf16(row[d]);
    }
  }
}

// One block (spec §2.2): attention and FFN sub-layers, each collapsing the streams with the
// *previous* sub-layer's pre coefficients (delayed pre) and expanding back with its own.
Status Model::block(int l, Sequence& seq, Call& call, std::vector<float>& h, std::vector<float>& pre_mix,
                    const Hook& hook) const {
  const LayerWeights& w = layers_[l];
  const int C = static_cast<int>(cfg_.hc_mult);
  const int64_t D = cfg_.n_embd, S = call.S, M = cfg_.hc_mix();
  const std::string p = absl::StrCat("L", l, ".");
  std::vector<kernels::hc::Split> split(static_cast<size_t>(S));
  std::vector<float> x(static_cast<size_t>(S * D)), y, res, mix(static_cast<size_t>(M));
  std::vector<float> attn_pre(static_cast<size_t>(S * C));
  auto sublayer = [&](const char* name, const HcWeights& hw, const std::vector<float>& norm, const std::vector<float>& in_pre,
                      std::vector<float>& out_pre, auto&& body) -> Status {
    res = h;
    for (int64_t t = 0; t < S; ++t) {
      kernels::hc::mixes(&h[t * C * D], hw.fn.data(), C, D, cfg_.norm_eps, mix.data());
      split[t] = kernels::hc::split(mix.data(), hw.scale.data(), hw.base.data(), C, static_cast<int>(cfg_.hc_sinkhorn_iters),
                                    cfg_.hc_eps);
      kernels::hc::pre(&h[t * C * D], &in_pre[t * C], C, D, &x[t * D]);
      std::copy_n(split[t].pre, C, &out_pre[t * C]);
    }
    if (hook) hook(p + name + ".hc_pre", x.data(), S, D);
    kernels::rms_norm(x.data(), norm.data(), S, D, cfg_.norm_eps, x.data());
    if (hook) hook(p + name + ".norm_out", x.data(), S, D);
    RETURN_IF_ERROR(body());
    if (hook) hook(p + name + ".out", y.data(), S, D);
    for (int64_t t = 0; t < S; ++t) kernels::hc::post(&y[t * D], &res[t * C * D], split[t], C, D, &h[t * C * D]);
    return absl::OkStatus();
  };
  if (hook) hook(p + "stream_in", h.data(), S, C * D);
  RETURN_IF_ERROR(sublayer("attn", w.hc_attn, w.attn_norm, pre_mix, attn_pre, [&]() -> Status {
    attention(l, seq, call, x, y, hook);
    return absl::OkStatus();
  }));
  if (hook) hook(p + "ffn.stream_in", h.data(), S, C * D);
  std::vector<float> ffn_pre(static_cast<size_t>(S * C));
  RETURN_IF_ERROR(sublayer("ffn", w.hc_ffn, w.ffn_norm, attn_pre, ffn_pre, [&] { return moe(l, x, S, y, hook); }));
  if (hook) hook(p + "stream_out", h.data(), S, C * D);
  pre_mix = std::move(ffn_pre);
  return absl::OkStatus();
}

void Model::head(const std::vector<float>& h, const std::vector<float>& pre_mix, int64_t S, bool all_logits,
                 std::vector<float>* logits, const Hook& hook) const {
  const int C = static_cast<int>(cfg_.hc_mult);
  const int64_t D = cfg_.n_embd, V = output_.rows;
  const int64_t first = all_logits ? 0 : S - 1, n = S - first;
  std::vector<float> x(static_cast<size_t>(n * D));
  for (int64_t t = first; t < S; ++t) kernels::hc::pre(&h[t * C * D], &pre_mix[t * C], C, D, &x[(t - first) * D]);
  if (hook) hook("final.hc_pre", x.data(), n, D);
  kernels::rms_norm(x.data(), output_norm_.data(), n, D, cfg_.norm_eps, x.data());
  if (hook) hook("final.norm_out", x.data(), n, D);
  logits->assign(static_cast<size_t>(n * V), 0.0f);
  kernels::linear(output_, x.data(), n, logits->data(), kernels::OutRound::kF32);
}

Status Model::admit(Sequence& seq, const std::vector<int32_t>& tokens) const {
  const int64_t S = static_cast<int64_t>(tokens.size());
  if (S == 0) return absl::InvalidArgumentError("forward: no tokens");
  if (seq.n_past + S > static_cast<int64_t>(cfg_.n_ctx)) {
    return absl::OutOfRangeError(absl::StrCat("sequence of ", seq.n_past + S, " tokens exceeds the context of ", cfg_.n_ctx));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= static_cast<int32_t>(cfg_.n_vocab)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is outside the vocabulary (", cfg_.n_vocab, ")"));
    }
  }
  for (int32_t t : tokens) seq.engram_ids.push_back(cfg_.engram.token_map[t]);
  return absl::OkStatus();
}

Status Model::device_forward(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceOut& out) const {
  if (!seq.device) return absl::InvalidArgumentError("a CPU sequence given to the CUDA backend");
  RETURN_IF_ERROR(admit(seq, tokens));
  const Status s = device_->forward(seq, tokens, out);
  if (!s.ok()) {
    seq.engram_ids.resize(seq.engram_ids.size() - tokens.size());
    return s;
  }
  seq.n_past += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

Status Model::forward_draw(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceDraw& draw, int32_t* token,
                           kernels::sample::DrawLogprobs* logprobs) const {
  if (!device_) return absl::FailedPreconditionError("forward_draw: device sampling needs the CUDA backend");
  if (draw.top_logprobs >= 0 && logprobs == nullptr) {
    return absl::InvalidArgumentError("forward_draw: log-probabilities asked for with nowhere to put them");
  }
  return device_forward(seq, tokens, DeviceOut{false, nullptr, &draw, token, logprobs});
}

Status Model::forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits, std::vector<float>* logits,
                      const Hook& hook) const {
  if (device_) {
    if (hook) return absl::InvalidArgumentError("forward hooks are a CPU-backend facility");
    return device_forward(seq, tokens, DeviceOut{all_logits, logits, nullptr, nullptr});
  }
  RETURN_IF_ERROR(admit(seq, tokens));
  const int64_t S = static_cast<int64_t>(tokens.size());
  Call call;
  call.pos0 = seq.n_past;
  call.S = S;
  // Window rows ahead of the compressed rows (see window_kv): this call's rows in a first
  // prefill, the ring in a decode step, ring + this call's rows in a later prefill chunk.
  call.n_win = call.pos0 == 0 ? S : (S == 1 ? cfg_.window : cfg_.window + S);
  std::vector<float> h;
  embed(tokens, h);
  std::vector<float> pre_mix(static_cast<size_t>(S * cfg_.hc_mult), 0.0f);
  for (int64_t t = 0; t < S; ++t) pre_mix[t * cfg_.hc_mult] = 1.0f;
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) {
    if (cfg_.layers[l].has_engram) RETURN_IF_ERROR(engram(static_cast<int>(l), seq, call.pos0, S, h, hook));
    RETURN_IF_ERROR(block(static_cast<int>(l), seq, call, h, pre_mix, hook));
  }
  head(h, pre_mix, S, all_logits, logits, hook);
  seq.n_past += S;
  return absl::OkStatus();
}

}  // namespace dsflash::model
