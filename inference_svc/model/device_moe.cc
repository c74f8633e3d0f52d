// The MoE sub-layer on the CUDA backend (ffn.cc Model::moe on device buffers), with routed
// experts resident in device memory or streamed from a device-memory ExpertSource (the expert
// store's arena).
#include <algorithm>
#include <climits>
#include <map>

#include "absl/strings/str_cat.h"
#include "inference_svc/model/device_model.h"
#include "kernels/dequant/dequant.h"
#include "kernels/moe/moe_cuda.h"

namespace dsflash::model {

using kernels::Copy;
using kernels::ExecCtx;

namespace {

// n rows of `cols` activations (packed) quantised to 8 bits for the dp4a expert GEMVs.
struct ActQ8Buf {
  DevBuf<int8_t> q;
  DevBuf<float> d, s16;
  kernels::ActQ8 view() const { return kernels::ActQ8{q.get(), d.get(), s16.get()}; }
};

StatusOr<ActQ8Buf> quantize_act_q8(const ExecCtx& ctx, const float* x, int64_t cols, int n) {
  ActQ8Buf b;
  ASSIGN_OR_RETURN(b.q, DevBuf<int8_t>::make(ctx, n * cols));
  ASSIGN_OR_RETURN(b.d, DevBuf<float>::make(ctx, n * cols / 32));
  ASSIGN_OR_RETURN(b.s16, DevBuf<float>::make(ctx, n * cols / 16));
  RETURN_IF_ERROR(kernels::quantize_act_q8_cuda(ctx, x, cols, n, cols, b.view()));
  return b;
}

std::vector<int> distinct(const std::vector<int32_t>& ids) {
  std::vector<int> out(ids.begin(), ids.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The acquired experts of a decode token as slots of one arena (every slot holds its matrices
// at the same offsets): base = the matrices of slot 0, slots[k] = expert k's slot. False when
// they are not all slots of one arena (e.g. a reconnect to the store between two acquires).
bool as_slots(const std::vector<ExpertWeights>& ew, ExpertWeights* base, std::vector<int32_t>* slots) {
  const ExpertWeights& a = ew[0];
  if (a.arena == nullptr || a.slot_stride == 0) return false;
  const auto offset = [](const ExpertWeights& e, const kernels::Weight& m) {
    return m.data - e.arena - static_cast<int64_t>(e.slot) * static_cast<int64_t>(e.slot_stride);
  };
  slots->clear();
  for (const ExpertWeights& e : ew) {
    if (e.arena != a.arena || e.slot_stride != a.slot_stride || e.slot < 0 || e.slot > INT32_MAX ||
        offset(e, e.gate) != offset(a, a.gate) || offset(e, e.up) != offset(a, a.up) ||
        offset(e, e.down) != offset(a, a.down)) {
      return false;
    }
    slots->push_back(static_cast<int32_t>(e.slot));
  }
  *base = a;
  base->gate.data = a.arena + offset(a, a.gate);
  base->up.data = a.arena + offset(a, a.up);
  base->down.data = a.arena + offset(a, a.down);
  return true;
}

}  // namespace

// Routing on the device. A decode token's K experts then run as one launch per matrix from the
// device-side routing (resident experts) or from their arena slots (streamed experts, acquired
// after the routing is copied to the host); otherwise the routed tokens are grouped by expert
// on the host (grouped_experts).
Status DeviceModel::moe(int l, Call& call, const float* x, float* y) const {
  const Layer& w = layers_[l];
  const ExecCtx& ctx = call.ctx;
  const int64_t E = cfg_.n_expert, K = cfg_.n_expert_used, S = call.S;
  const bool x_aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const bool resident_decode = call.segmenting == nullptr && S == 1 && w.routed_on_device && x_aligned;
  // A resident decode token's shared expert runs beside its routing and routed experts.
  BranchScope side(ctx, resident_decode ? call.branch(1) : nullptr);
  DevBuf<float> shared;
  if (side.on()) {
    ASSIGN_OR_RETURN(shared, DevBuf<float>::make(ctx, cfg_.n_embd));  // freed on ctx, after the join
    RETURN_IF_ERROR(side.fork());
    RETURN_IF_ERROR(shared_expert(w, cfg_.layers[l], side.ctx(), 1, x, shared.get()));
  }
  ASSIGN_OR_RETURN(auto logits, DevBuf<float>::make(ctx, S * E));
  RETURN_IF_ERROR(dev_linear(ctx, w.gate_inp, x, S, logits.get(), kernels::OutRound::kF32));
  ASSIGN_OR_RETURN(auto experts, DevBuf<int32_t>::make(ctx, S * K));
  ASSIGN_OR_RETURN(auto weights, DevBuf<float>::make(ctx, S * K));
  RETURN_IF_ERROR(kernels::moe::route_cuda(ctx, logits.get(), w.exp_probs_b, S, E, K, cfg_.norm_topk, cfg_.route_scale,
                                           experts.get(), weights.get()));
  if (call.segmenting != nullptr) {
    if (!x_aligned) return absl::InternalError("a streamed decode step's MoE input is not 16-byte aligned");
    return segment_experts(l, call, x, experts.get(), weights.get(), y);
  }
  if (resident_decode) {
    return decode_experts(l, call, x, resident_table(w, experts.get()), experts.get(), weights.get(), y, &side,
                          side.on() ? shared.get() : nullptr);
  }
  return host_routed_experts(l, call, x, x_aligned, experts.get(), weights.get(), y);
}

// A streamed decode step being captured: the segment ends with the routing copied to the host;
// the next starts by copying the slots the host acquired (device_graph.cc).
Status DeviceModel::segment_experts(int l, Call& call, const float* x, const int32_t* experts, const float* weights,
                                    float* y) const {
  const ExecCtx& ctx = call.ctx;
  const int64_t K = cfg_.n_expert_used;
  DecodeGraphs& g = *call.segmenting;
  ExpertTable t;
  {
    std::lock_guard<std::mutex> lock(slot_mu_);
    t = slot_layout_[l];
  }
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToHost, g.routing_host + l * K, experts, K * sizeof(int32_t)));
  ASSIGN_OR_RETURN(void* segment, kernels::capture_end(ctx));
  g.segments[call.parity].push_back(segment);
  g.split_layer[call.parity].push_back(l);
  RETURN_IF_ERROR(kernels::capture_begin(ctx));
  ASSIGN_OR_RETURN(auto slots_d, DevBuf<int32_t>::make(ctx, K));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, slots_d.get(), g.slots_host + l * K, K * sizeof(int32_t)));
  t.ids = slots_d.get();
  return decode_experts(l, call, x, t, experts, weights, y);
}

// The routing copied to the host: the routed tokens grouped by expert (prefill, or experts
// without decode GEMVs), or a streamed decode token's K experts acquired, then run from their
// arena slots.
Status DeviceModel::host_routed_experts(int l, Call& call, const float* x, bool x_aligned, const int32_t* experts,
                                        const float* weights, float* y) const {
  const ExecCtx& ctx = call.ctx;
  const int64_t K = cfg_.n_expert_used, S = call.S;
  std::vector<int32_t> e_h(static_cast<size_t>(S * K)), next_h;
  std::vector<float> w_h(static_cast<size_t>(S * K));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToHost, e_h.data(), experts, S * K * sizeof(int32_t)));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kDeviceToHost, w_h.data(), weights, S * K * sizeof(float)));
  const bool predict = streamed_ != nullptr && prefetch_next_ && S == 1 && l + 1 < static_cast<int>(cfg_.n_layer) &&
                       layers_[l + 1].gate_inp.valid();
  if (predict) {
    next_h.resize(static_cast<size_t>(K));
    RETURN_IF_ERROR(predict_next_layer(l, call, x, next_h.data()));
  }
  RETURN_IF_ERROR(kernels::stream_sync(ctx));
  if (streamed_ != nullptr) {
    // The stream has run past every earlier layer's expert kernels, so their leases go back;
    // this layer's misses are asked for together.
    call.release_leases();
    streamed_->prefetch(l, distinct(e_h));
  }
  if (streamed_ == nullptr || S != 1) return grouped_experts(l, call, x, e_h, w_h, {}, y);
  std::vector<ExpertWeights> ew;
  std::map<int32_t, ExpertWeights> held;
  for (int32_t e : e_h) {
    ASSIGN_OR_RETURN(ExpertWeights got, acquire_expert(l, e, call));
    ew.push_back(got);
    held.emplace(e, got);
  }
  if (predict) streamed_->prefetch(l + 1, distinct(next_h));  // after this layer's demand
  ExpertTable t;
  std::vector<int32_t> slots;
  if (!x_aligned || !as_slots(ew, &t.base, &slots)) return grouped_experts(l, call, x, e_h, w_h, held, y);
  t.gate_stride = t.up_stride = t.down_stride = static_cast<int64_t>(ew[0].slot_stride);
  if (!experts_have_decode_gemvs(t)) return grouped_experts(l, call, x, e_h, w_h, held, y);
  {  // the layer's slot layout, for decode steps captured as segments
    std::lock_guard<std::mutex> lock(slot_mu_);
    slot_layout_.resize(cfg_.n_layer);
    slot_layout_known_.resize(cfg_.n_layer, false);
    if (slot_arena_ != ew[0].arena) slot_layout_known_.assign(cfg_.n_layer, false);
    slot_arena_ = ew[0].arena;
    slot_layout_[l] = t;
    slot_layout_known_[l] = true;
  }
  ASSIGN_OR_RETURN(auto slots_d, DevBuf<int32_t>::make(ctx, K));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, slots_d.get(), slots.data(), K * sizeof(int32_t)));
  t.ids = slots_d.get();
  return decode_experts(l, call, x, t, experts, weights, y);
}

Status DeviceModel::acquire_routed_slots(int l, Call& call, const int32_t* experts, int32_t* slots) const {
  const int64_t E = cfg_.n_expert, K = cfg_.n_expert_used;
  const std::vector<int32_t> e_h(experts, experts + K);
  for (int32_t e : e_h) {
    if (e < 0 || e >= E) return absl::InternalError(absl::StrCat("layer ", l, " routed to expert ", e, " of ", E));
  }
  // The stream has run past the previous layer's expert kernels.
  call.release_leases();
  streamed_->prefetch(l, distinct(e_h));
  std::vector<ExpertWeights> ew;
  for (int32_t e : e_h) {
    ASSIGN_OR_RETURN(ExpertWeights got, acquire_expert(l, e, call));
    ew.push_back(got);
  }
  ExpertWeights base;
  std::vector<int32_t> s;
  ExpertTable captured;
  {
    std::lock_guard<std::mutex> lock(slot_mu_);
    captured = slot_layout_[l];
  }
  if (!as_slots(ew, &base, &s) || base.gate.data != captured.base.gate.data ||
      base.up.data != captured.base.up.data || base.down.data != captured.base.down.data ||
      static_cast<int64_t>(ew[0].slot_stride) != captured.gate_stride) {
    return absl::UnavailableError(absl::StrCat("layer ", l, "'s experts are no longer where the captured decode step "
                                               "reads them (the expert store's arena changed); the step stops"));
  }
  std::copy(s.begin(), s.end(), slots);
  return absl::OkStatus();
}

// Layer l+1's router on layer l's MoE input (the hidden state changes little across one layer):
// its top-k copied to `host`, valid after the caller's next synchronisation.
Status DeviceModel::predict_next_layer(int l, Call& call, const float* x, int32_t* host) const {
  const Layer& next = layers_[l + 1];
  const ExecCtx& ctx = call.ctx;
  const int64_t E = cfg_.n_expert, K = cfg_.n_expert_used;
  ASSIGN_OR_RETURN(auto logits, DevBuf<float>::make(ctx, E));
  RETURN_IF_ERROR(dev_linear(ctx, next.gate_inp, x, 1, logits.get(), kernels::OutRound::kF32));
  ASSIGN_OR_RETURN(auto experts, DevBuf<int32_t>::make(ctx, K));
  ASSIGN_OR_RETURN(auto weights, DevBuf<float>::make(ctx, K));
  RETURN_IF_ERROR(kernels::moe::route_cuda(ctx, logits.get(), next.exp_probs_b, 1, E, K, cfg_.norm_topk,
                                           cfg_.route_scale, experts.get(), weights.get()));
  return kernels::copy(ctx, Copy::kDeviceToHost, host, experts.get(), K * sizeof(int32_t));
}

// Expert e of layer l: slices of the resident tensors, or a lease from the streamed source. A
// call at its lease budget first waits for its kernels and gives every lease back.
StatusOr<ExpertWeights> DeviceModel::acquire_expert(int l, int32_t e, Call& call) const {
  const Layer& w = layers_[l];
  if (streamed_ == nullptr) {
    const int64_t F = w.exp_gate.rows / cfg_.n_expert, Dd = w.exp_down.rows / cfg_.n_expert;
    return ExpertWeights{w.exp_gate.slice_rows(e * F, F), w.exp_up.slice_rows(e * F, F),
                         w.exp_down.slice_rows(e * Dd, Dd)};
  }
  if (!call.leases.empty() && call.leases.size() >= streamed_->lease_budget()) {
    RETURN_IF_ERROR(kernels::stream_sync(call.ctx));
    call.release_leases();
  }
  ASSIGN_OR_RETURN(ExpertWeights got, streamed_->acquire(l, e));
  call.leases.emplace_back(l, e);
  const config::ModelConfig& c = cfg_;
  const bool shaped = got.gate.rows == c.expert_ffn && got.gate.cols == c.n_embd && got.up.rows == c.expert_ffn &&
                      got.up.cols == c.n_embd && got.down.rows == c.n_embd && got.down.cols == c.expert_ffn;
  if (!shaped) {
    return absl::FailedPreconditionError(absl::StrCat("the expert source gave layer ", l, " expert ", e,
                                                      " matrices of another shape than this model's"));
  }
  return got;
}

// The routed tokens grouped by expert on the host (ascending expert index), each expert's
// SwiGLU on its rows, and the routed outputs summed per token in ascending expert order before
// the shared expert's. Experts in `held` are already acquired by the call; the rest are
// acquired here.
Status DeviceModel::grouped_experts(int l, Call& call, const float* x, const std::vector<int32_t>& e_h,
                                    const std::vector<float>& w_h, const std::map<int32_t, ExpertWeights>& held,
                                    float* y) const {
  const Layer& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const ExecCtx& ctx = call.ctx;
  const int64_t D = cfg_.n_embd, K = cfg_.n_expert_used, S = call.S, F = cfg_.expert_ffn;
  std::map<int32_t, std::vector<int64_t>> by_expert;  // expert -> (t * K + k) slots, token order
  for (int64_t i = 0; i < S * K; ++i) by_expert[e_h[i]].push_back(i);
  std::vector<int64_t> tok;  // the token of each row, rows grouped by expert
  std::vector<int32_t> rows_of(static_cast<size_t>(S * K));
  std::vector<float> row_w;
  std::vector<int64_t> filled(static_cast<size_t>(S), 0);
  for (const auto& [e, slots] : by_expert) {
    for (int64_t i : slots) {
      const int64_t t = i / K;
      rows_of[t * K + filled[t]++] = static_cast<int32_t>(tok.size());
      tok.push_back(t);
      row_w.push_back(w_h[i]);
    }
  }
  const int64_t R = S * K;
  ASSIGN_OR_RETURN(auto tok_d, DevBuf<int64_t>::make(ctx, R));
  ASSIGN_OR_RETURN(auto rows_d, DevBuf<int32_t>::make(ctx, R));
  ASSIGN_OR_RETURN(auto w_d, DevBuf<float>::make(ctx, R));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, tok_d.get(), tok.data(), R * sizeof(int64_t)));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, rows_d.get(), rows_of.data(), R * sizeof(int32_t)));
  RETURN_IF_ERROR(kernels::copy(ctx, Copy::kHostToDevice, w_d.get(), row_w.data(), R * sizeof(float)));
  ASSIGN_OR_RETURN(auto xe, DevBuf<float>::make(ctx, R * D));
  ASSIGN_OR_RETURN(auto a, DevBuf<float>::make(ctx, R * F));
  ASSIGN_OR_RETURN(auto b, DevBuf<float>::make(ctx, R * F));
  ASSIGN_OR_RETURN(auto ye, DevBuf<float>::make(ctx, R * D));
  RETURN_IF_ERROR(kernels::dequant::gather_rows_cuda(ctx, quant::GgmlType::kF32, x, D, D * sizeof(float), S, tok_d.get(),
                                                     R, false, xe.get()));
  int64_t r0 = 0;
  for (const auto& [e, slots] : by_expert) {
    const int64_t n = static_cast<int64_t>(slots.size());
    const auto h = held.find(e);
    ASSIGN_OR_RETURN(const ExpertWeights ew,
                     h != held.end() ? StatusOr<ExpertWeights>(h->second) : acquire_expert(l, e, call));
    RETURN_IF_ERROR(dev_linear(ctx, ew.gate, xe.get() + r0 * D, n, a.get() + r0 * F));
    RETURN_IF_ERROR(dev_linear(ctx, ew.up, xe.get() + r0 * D, n, b.get() + r0 * F));
    RETURN_IF_ERROR(kernels::moe::swiglu_cuda(ctx, a.get() + r0 * F, b.get() + r0 * F, n, F, L.swiglu_limit_exp,
                                              w_d.get() + r0));
    RETURN_IF_ERROR(dev_linear(ctx, ew.down, a.get() + r0 * F, n, ye.get() + r0 * D));
    r0 += n;
  }
  ASSIGN_OR_RETURN(const DevBuf<float> shared, DevBuf<float>::make(ctx, S * D));
  RETURN_IF_ERROR(shared_expert(w, L, ctx, S, x, shared.get()));
  return kernels::moe::combine_cuda(ctx, ye.get(), rows_d.get(), shared.get(), S, K, D, y);
}

DeviceModel::ExpertTable DeviceModel::resident_table(const Layer& w, const int32_t* ids) const {
  const int64_t E = cfg_.n_expert, F = w.exp_gate.rows / E, Dd = w.exp_down.rows / E;
  ExpertTable t;
  t.base = ExpertWeights{w.exp_gate.slice_rows(0, F), w.exp_up.slice_rows(0, F), w.exp_down.slice_rows(0, Dd)};
  t.gate_stride = F * static_cast<int64_t>(w.exp_gate.row_bytes);
  t.up_stride = F * static_cast<int64_t>(w.exp_up.row_bytes);
  t.down_stride = Dd * static_cast<int64_t>(w.exp_down.row_bytes);
  t.ids = ids;
  return t;
}

// Whether the device-routed decode GEMVs take these experts (types and alignments; the
// activations must be 16-byte aligned too).
bool DeviceModel::experts_have_decode_gemvs(const ExpertTable& t) const {
  return kernels::linear_experts_supported(t.base.gate, t.gate_stride) &&
         kernels::linear_experts_supported(t.base.up, t.up_stride) &&
         kernels::linear_experts_supported(t.base.down, t.down_stride) && (t.base.gate.rows * 4) % 16 == 0;
}

// A decode token's K routed experts: gate, up and down each in one launch, rows in route order,
// summed per token in ascending expert order with the shared expert's output.
Status DeviceModel::decode_experts(int l, Call& call, const float* x, const ExpertTable& t, const int32_t* experts,
                                   const float* weights, float* y, BranchScope* side, const float* shared) const {
  const Layer& w = layers_[l];
  const config::LayerConfig& L = cfg_.layers[l];
  const ExecCtx& ctx = call.ctx;
  const int64_t D = cfg_.n_embd, K = cfg_.n_expert_used, F = t.base.gate.rows;
  const int n = static_cast<int>(K);
  ASSIGN_OR_RETURN(auto a, DevBuf<float>::make(ctx, K * F));
  ASSIGN_OR_RETURN(auto b, DevBuf<float>::make(ctx, K * F));
  ASSIGN_OR_RETURN(auto ye, DevBuf<float>::make(ctx, K * D));
  if (expert_act_q8_ && kernels::linear_experts_q8_supported(t.base.gate, t.gate_stride) &&
      kernels::linear_experts_q8_supported(t.base.up, t.up_stride) &&
      kernels::linear_experts_q8_supported(t.base.down, t.down_stride)) {  // LoadOptions::expert_act_q8
    ASSIGN_OR_RETURN(const ActQ8Buf xq, quantize_act_q8(ctx, x, D, 1));
    RETURN_IF_ERROR(kernels::linear_experts_q8_cuda(ctx, t.base.gate, t.gate_stride, t.ids, n, xq.view(), true, a.get(), F));
    RETURN_IF_ERROR(kernels::linear_experts_q8_cuda(ctx, t.base.up, t.up_stride, t.ids, n, xq.view(), true, b.get(), F));
    RETURN_IF_ERROR(kernels::moe::swiglu_cuda(ctx, a.get(), b.get(), K, F, L.swiglu_limit_exp, weights));
    ASSIGN_OR_RETURN(const ActQ8Buf aq, quantize_act_q8(ctx, a.get(), F, n));
    RETURN_IF_ERROR(kernels::linear_experts_q8_cuda(ctx, t.base.down, t.down_stride, t.ids, n, aq.view(), false, ye.get(), D));
  } else {
    RETURN_IF_ERROR(kernels::linear_experts_gate_up_cuda(ctx, t.base.gate, t.gate_stride, t.base.up, t.up_stride, t.ids, n,
                                                         x, a.get(), b.get(), F));
    RETURN_IF_ERROR(kernels::moe::swiglu_cuda(ctx, a.get(), b.get(), K, F, L.swiglu_limit_exp, weights));
    RETURN_IF_ERROR(kernels::linear_experts_cuda(ctx, t.base.down, t.down_stride, t.ids, n, a.get(), F, ye.get(), D));
  }
  DevBuf<float> own;
  if (shared == nullptr) {
    ASSIGN_OR_RETURN(own, DevBuf<float>::make(ctx, D));
    RETURN_IF_ERROR(shared_expert(w, L, ctx, 1, x, own.get()));
    shared = own.get();
  } else {
    RETURN_IF_ERROR(side->join());
  }
  return kernels::moe::combine_routed_cuda(ctx, ye.get(), experts, shared, 1, K, D, y);
}

// The shared expert on every token.
Status DeviceModel::shared_expert(const Layer& w, const config::LayerConfig& L, const ExecCtx& ctx, int64_t S,
                                 const float* x, float* out) const {
  const int64_t Fs = w.sh_gate.rows;
  ASSIGN_OR_RETURN(auto sa, DevBuf<float>::make(ctx, S * Fs));
  ASSIGN_OR_RETURN(auto sb, DevBuf<float>::make(ctx, S * Fs));
  if (S == 1) {
    const kernels::LinearJob jobs[] = {{w.sh_gate, x, sa.get()}, {w.sh_up, x, sb.get()}};
    RETURN_IF_ERROR(kernels::linear_batch_cuda(ctx, jobs, 2));
  } else {
    RETURN_IF_ERROR(dev_linear(ctx, w.sh_gate, x, S, sa.get()));
    RETURN_IF_ERROR(dev_linear(ctx, w.sh_up, x, S, sb.get()));
  }
  RETURN_IF_ERROR(kernels::moe::swiglu_cuda(ctx, sa.get(), sb.get(), S, Fs, L.swiglu_limit_shexp, nullptr));
  return dev_linear(ctx, w.sh_down, sa.get(), S, out);
}

}  // namespace dsflash::model
