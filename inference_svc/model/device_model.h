// The model on the CUDA backend (internal to model/; users go through model.h with
// LoadOptions::backend = kCuda). The forward pass follows Model's CPU code op by op
// (model.cc, attention.cc, ffn.cc) on device buffers and the kernels' *_cuda ops; decisions the
// CPU makes on the host (window and top-k index lists, candidate masks, routing) are made on
// the device too, except the grouping of routed tokens by expert (host, from the routed ids).
// The routed experts are either resident in device memory (copied from the GGUF at load) or
// streamed from an ExpertSource with device memory (the expert store's device arena): then
// every MoE layer copies its routing to the host, acquires the experts it picked (the decode
// GEMVs take their slot numbers), and its leases are released at the next layer's routing
// copy or the end of the forward, once the kernels reading them have completed.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/status.h"
#include "inference_svc/model/model.h"
#include "kernels/exec.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/sample/sample_cuda.h"

namespace dsflash::model {

// A device array owned by a scope: stream-ordered allocation and release on one context.
template <typename T>
class DevBuf {
 public:
  DevBuf() = default;
  static StatusOr<DevBuf> make(const kernels::ExecCtx& ctx, int64_t n) {
    DevBuf b;
    ASSIGN_OR_RETURN(void* p, kernels::device_alloc(ctx, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
    b.ctx_ = ctx;
    b.p_ = static_cast<T*>(p);
    b.n_ = n;
    return b;
  }
  DevBuf(DevBuf&& o) noexcept { *this = std::move(o); }
  DevBuf& operator=(DevBuf&& o) noexcept {
    reset();
    ctx_ = o.ctx_;
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
    return *this;
  }
  ~DevBuf() { reset(); }
  T* get() const { return p_; }
  int64_t size() const { return n_; }

 private:
  void reset() {
    if (p_ != nullptr) kernels::device_free(ctx_, p_);
    p_ = nullptr;
  }
  kernels::ExecCtx ctx_;
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// Rows of `width` floats appended over a sequence's life (compressed KV, index keys).
struct DevRows {
  DevBuf<float> buf;
  int64_t rows = 0, width = 0;
  int64_t reallocs = 0;  // how often buf moved (graphs captured on the old address are stale)
  Status append(const kernels::ExecCtx& ctx, const float* src, int64_t n);
  // Room for n more rows (grown as append grows it), so that an append of up to n on another
  // stream does not move buf.
  Status room_for(const kernels::ExecCtx& ctx, int64_t n);
  // Room for `capacity` rows without moving again.
  Status reserve(const kernels::ExecCtx& ctx, int64_t capacity);
};

// linear_cuda that accepts an empty batch.
inline Status dev_linear(const kernels::ExecCtx& ctx, const kernels::Weight& w, const float* x, int64_t n, float* y,
                         kernels::OutRound round = kernels::OutRound::kBf16) {
  return n <= 0 ? absl::OkStatus() : kernels::linear_cuda(ctx, w, x, n, y, round);
}

struct DeviceLayerState {
  DevBuf<float> ring;                      // [window][head_dim]
  DevBuf<float> kv_state, score_state;     // ratio-2 sources: [2][head_dim]
  DevRows comp_kv, index_k;
};

// The per-step values a decode step replayed from a CUDA graph reads (int64 slots of
// DecodeGraphs::step, written by the host before each replay).
struct StepSlots {
  static constexpr int kPos = 0;    // the step's position
  static constexpr int kToken = 1;  // its token id
  static constexpr int group_start(int ratio) { return 1 + ratio; }  // (pos / ratio) * ratio, ratio 1 or 2
  static constexpr int new_row(int ratio) { return 3 + ratio; }      // cache row of a latent the step completes
  static constexpr int kEngram = 6;  // Engram row ids: [engram layer][cols]
};

// A sequence's decode graphs (device_graph.cc): one per position parity (ratio-2 compressors
// complete a pair on odd positions), captured for every position below `cap`, with the caches
// reserved for `cap` tokens.
struct DecodeGraphs {
  ~DecodeGraphs() { release(); }
  void drop();     // destroys the graphs (the next step captures again)
  void drop_segments();  // destroys the streamed segment chains only
  void drop_segments(int parity);  // one parity's chain, split layers and appends
  void release();  // drop() and frees the buffers (before the sequence's stream goes)
  void* exec[2] = {nullptr, nullptr};
  int64_t cap = 0;       // positions < cap replay; 0: none captured
  int64_t reallocs = 0;  // cache moves seen at capture
  DevBuf<int64_t> step;  // StepSlots on the device
  int64_t* step_host = nullptr;  // pinned mirror
  DevBuf<float> logits;  // [n_vocab]: the replay's output
  DevBuf<uint8_t> engram_rows;  // Engram tables on the host: the step's rows, staged before each replay
  // Streamed experts (device_graph.cc): a parity's step is a chain of segments, each but the
  // last ending with MoE layer split_layer[i]'s routing copied to routing_host; the host
  // acquires that layer's experts and writes their arena slots to slots_host before it
  // launches the next segment, whose first op copies them to the device.
  std::vector<void*> segments[2];
  std::vector<int> split_layer[2];
  int32_t* routing_host = nullptr;  // pinned [n_layer][n_expert_used]
  int32_t* slots_host = nullptr;    // pinned [n_layer][n_expert_used]
  const uint8_t* segments_arena = nullptr;  // the arena the segments read
  std::vector<std::pair<DevRows*, int64_t>> appends[2];  // rows each graph appends per replay
};

struct DeviceSequence {
  ~DeviceSequence();
  kernels::ExecCtx ctx;  // the sequence's own stream
  // Branches beside it (BranchScope): 0 for a sub-layer's hc split, 1 for work inside the
  // sub-layer's body, 2 for an index source's selection beside its query. Not made with
  // DSF_BRANCHES=0 (measurement: everything on ctx).
  kernels::Branch branches[3];
  // One branch per Engram layer: its rows gathered and projected from the pass's start
  // (DeviceModel::EngramAhead).
  std::vector<kernels::Branch> engram_branches;
  std::unique_ptr<kernels::sample::DeviceSampler> sampler;  // made by the first device draw
  std::vector<DeviceLayerState> layers;
  DecodeGraphs graphs;
  uint8_t* engram_stage = nullptr;  // pinned: Engram rows on their way to the device
  uint64_t engram_stage_bytes = 0;
};

// A branch of a call's stream open for one scope: work issued on ctx() after fork() may run
// beside what the call's stream runs next, until join(). Without a branch (none made, or a
// streamed step captured as segments, whose segments end inside moe()) ctx() is the call's
// stream and fork/join do nothing. An early return joins in the destructor, so nothing the
// branch writes is freed on the call's stream before the branch has run.
class BranchScope {
 public:
  BranchScope(const kernels::ExecCtx& main, const kernels::Branch* b) : main_(main), b_(b) {}
  BranchScope(const BranchScope&) = delete;
  BranchScope& operator=(const BranchScope&) = delete;
  ~BranchScope() {
    if (open_) (void)kernels::join(main_, *b_);
  }
  bool on() const { return b_ != nullptr; }
  const kernels::ExecCtx& ctx() const { return b_ != nullptr ? b_->ctx : main_; }
  Status fork() {
    if (b_ == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(kernels::fork(main_, *b_));
    open_ = true;
    return absl::OkStatus();
  }
  Status join() {
    if (!open_) return absl::OkStatus();
    open_ = false;
    return kernels::join(main_, *b_);
  }

 private:
  const kernels::ExecCtx& main_;
  const kernels::Branch* b_;
  bool open_ = false;
};

// What a forward hands back: the logits (every position's when all_logits, else the last's)
// copied to the host, or, with `draw`, the last position's token drawn on the device.
struct DeviceOut {
  bool all_logits = false;
  std::vector<float>* logits = nullptr;
  const DeviceDraw* draw = nullptr;
  int32_t* token = nullptr;
  kernels::sample::DrawLogprobs* logprobs = nullptr;  // draw->top_logprobs >= 0: the draw's
};

class DeviceModel {
 public:
  struct Layer {
    struct Hc {
      float *fn = nullptr, *base = nullptr, *scale = nullptr;
    } hc_attn, hc_ffn;
    float *attn_norm = nullptr, *ffn_norm = nullptr, *sinks = nullptr, *q_norm = nullptr, *kv_norm = nullptr;
    float *comp_norm = nullptr, *idx_k_norm = nullptr, *exp_probs_b = nullptr, *engram_qk = nullptr;
    kernels::Weight wq_a, wq_b, wkv, wo_a, wo_b, comp_kv, comp_gate, idx_wk, idx_wq_b, idx_proj;
    kernels::Weight gate_inp, sh_gate, sh_up, sh_down, engram_embd, engram_wkv;
    kernels::Weight exp_gate, exp_up, exp_down;  // all experts, merged rows
    bool routed_on_device = false;  // decode GEMVs take its experts (routing stays on the device)
  };
  struct Options {
    // Streamed experts: layer l+1's experts hinted a layer early at decode.
    bool prefetch_next_layer = false;
    // The Engram tables stay in the mapped file and each call copies the rows it needs to the
    // device (engram_rows.h); else they are uploaded with the other weights.
    bool engram_on_host = false;
    // Decode's routed-expert GEMVs (Q2_K / Q3_K) read 8-bit activations (LoadOptions).
    bool expert_act_q8 = false;
  };
  // `streamed`: null keeps every routed expert resident; else the source (device memory) each
  // MoE layer acquires its experts from.
  static StatusOr<std::unique_ptr<DeviceModel>> load(const gguf::Model& file, const config::ModelConfig& cfg,
                                                     ExpertSource* streamed, const Options& options);
  ~DeviceModel();

  StatusOr<std::shared_ptr<DeviceSequence>> new_sequence() const;
  // A new sequence holding a copy of `src`'s caches (its graphs are captured afresh); `src`
  // is left as it was. Both streams are synchronised, so either may go on at once.
  StatusOr<std::shared_ptr<DeviceSequence>> copy_sequence(const DeviceSequence& src) const;
  // As Model::forward after its checks (seq.engram_ids already holds this call's ids).
  Status forward(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceOut& out) const;
  // Milliseconds per phase summed over the forwards run while profiling was on (each phase then
  // ends with a stream synchronisation, which slows the pass down, and decode runs eagerly);
  // turning it on clears them.
  void set_profiling(bool on);
  // Decode steps replayed from CUDA graphs (default) or issued op by op (eager).
  void set_decode_graphs(bool on) { graphs_ = on; }
  int64_t graph_replays() const { return replays_; }
  std::map<std::string, double> profile() const;

 struct Call;  // per-forward state shared down the layer stack (below)

 private:
  DeviceModel() = default;
  StatusOr<float*> upload(const std::vector<float>& v);
  StatusOr<kernels::Weight> upload(const kernels::Weight& w);
  // A routed experts' tensor (n_expert matrices, merged rows): in the tile layout where every
  // kernel that reads it takes tiles (kernels::tiles_apply, whole tiles an expert, GGUF-order
  // activations), else as upload.
  StatusOr<kernels::Weight> upload_experts(const kernels::Weight& w);
  // w reordered into the tile layout on the way (kernels::to_tiles_cuda, whole tiles at a time
  // through a device scratch); the caller has checked that its readers take tiles.
  StatusOr<kernels::Weight> upload_tiled(const kernels::Weight& w);
  Status upload_layer(const gguf::Model& file, int l);
  // The pass from token ids (device) to logits (device, rows first..S-1 of `out`).
  Status pass(Call& call, const int64_t* ids, bool all_logits, float* out) const;
  Status eager(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceOut& out) const;
  // Hands back `rows` rows of logits (device; a draw edits the last in place) as `out` asks;
  // the stream is synchronised on return.
  Status deliver(DeviceSequence& ds, float* logits, int64_t rows, const DeviceOut& out) const;
  // Device-graph decode (device_graph.cc).
  bool graph_eligible(const Sequence& seq, int64_t S) const;
  Status graph_step(Sequence& seq, int32_t token, const DeviceOut& out) const;
  Status capture(DeviceSequence& ds, Sequence& seq, int parity) const;
  Status prepare_graphs(DeviceSequence& ds, int64_t pos) const;
  // A streamed decode step from its segments (captured first if needed; device_graph.cc).
  Status segmented_step(Sequence& seq, int32_t token, int parity, const DeviceOut& out) const;
  // Replay of a segmented step: layer l's routed experts (K ids) acquired by the call, their
  // arena slots written to `slots`; UNAVAILABLE if they are not slots of the captured layout.
  Status acquire_routed_slots(int l, Call& call, const int32_t* experts, int32_t* slots) const;
  // Streamed decode can run from segments: no next-layer prediction, and every layer's slot
  // layout seen (an eager decode step records them).
  bool segments_possible() const;
  // Engram row ids of every Engram layer for the call's tokens ([engram layer][S][cols]),
  // hashed on the host from the compressed ids and checked against the tables.
  StatusOr<std::vector<int64_t>> engram_ids(const Sequence& seq, int64_t pos0, int64_t S) const;
  // Engram tables on the host: where Engram layer e's rows of an S-token call start in the
  // call's staged rows, and their total size (bytes).
  uint64_t engram_stage_offset(size_t e, int64_t S) const;
  // The sequence's pinned staging buffer for `bytes` of rows (grown as needed; the sequence's
  // previous call has completed).
  StatusOr<uint8_t*> engram_stage(DeviceSequence& ds, uint64_t bytes) const;
  // Starts the page-ins of every Engram layer's rows `ids` ([engram layer][S][cols]) and
  // renumbers them as rows of the call's staged rows (0..S*cols-1 per layer); returns the
  // table rows they were.
  std::vector<int64_t> begin_engram_staging(std::vector<int64_t>& ids, int64_t S) const;
  // Copies Engram layer e's rows of `ids` to its place in `stage` and from there to `dev`.
  Status stage_engram_rows(const kernels::ExecCtx& ctx, size_t e, const int64_t* ids, int64_t S, uint8_t* stage,
                           uint8_t* dev) const;
  // Block l on the streams h (h_alt: scratch of the same size; the two are swapped as the
  // sub-layers expand). x [S][n_embd]: a sub-layer's normed input; x_ready: x already holds
  // the first sub-layer's (the previous block's last post made it), and on return whether it
  // holds the next block's.
  class EngramAhead;
  Status block(int l, Call& call, float*& h, float*& h_alt, DevBuf<float>& pre_mix, DevBuf<float>& spare_pre, float* x,
               bool& x_ready, EngramAhead& ahead) const;
  Status attention(int l, Call& call, const float* x, float* y) const;
  Status kv_path(int l, Call& call, BranchScope& side, const float* x, float* kv, DevBuf<float>& latent) const;
  // A KV source's new latents (n_new of them) into `latent` ([S / ratio + 1][head_dim]), on
  // ctx's stream; then cache_latents keys (index sources) and caches them on that stream.
  Status compress(int l, Call& call, const kernels::ExecCtx& ctx, const float* x, float* latent, int64_t* n_new) const;
  Status cache_latents(int l, Call& call, const kernels::ExecCtx& ctx, float* latent, int64_t n_new) const;
  Status select(int l, Call& call, BranchScope& sel, const kernels::Branch* kv, const float* x, const float* qr) const;
  Status indexer(int l, Call& call, const kernels::ExecCtx& ctx, const kernels::Branch* keys_from, const float* x,
                 const float* qr) const;
  bool lists_every_key(int l, const Call& call) const;
  Status grouped_output(int l, Call& call, const float* o, float* y) const;
  Status moe(int l, Call& call, const float* x, float* y) const;
  // moe's routed experts in a streamed decode step being captured as segments (x 16-byte aligned).
  Status segment_experts(int l, Call& call, const float* x, const int32_t* experts, const float* weights,
                         float* y) const;
  // moe's routed experts from the routing copied to the host (prefill; streamed decode eager).
  Status host_routed_experts(int l, Call& call, const float* x, bool x_aligned, const int32_t* experts,
                             const float* weights, float* y) const;
  // Expert e of layer l: resident slices, or a lease from the streamed source (held by the call).
  StatusOr<ExpertWeights> acquire_expert(int l, int32_t e, Call& call) const;
  Status grouped_experts(int l, Call& call, const float* x, const std::vector<int32_t>& e_h,
                         const std::vector<float>& w_h, const std::map<int32_t, ExpertWeights>& held, float* y) const;
  // The K routed experts of one decode token for the device-routed GEMVs: entry k's matrices
  // at base's + ids[k] * the matrix's stride (ids: expert numbers, or arena slots).
  struct ExpertTable {
    ExpertWeights base;
    int64_t gate_stride = 0, up_stride = 0, down_stride = 0;
    const int32_t* ids = nullptr;  // device [K]
  };
  bool experts_have_decode_gemvs(const ExpertTable& t) const;
  ExpertTable resident_table(const Layer& w, const int32_t* ids) const;  // ids: expert numbers
  // `shared`: the shared expert's output on the branch `side` (joined before it is read), or
  // null: run here.
  Status decode_experts(int l, Call& call, const float* x, const ExpertTable& t, const int32_t* experts,
                        const float* weights, float* y, BranchScope* side = nullptr,
                        const float* shared = nullptr) const;
  // Layer l+1's router on layer l's MoE input, its picks copied to `host` (with the next sync).
  Status predict_next_layer(int l, Call& call, const float* x, int32_t* host) const;
  // The shared expert of S tokens x into out ([S][n_embd]), on ctx's stream.
  Status shared_expert(const Layer& w, const config::LayerConfig& L, const kernels::ExecCtx& ctx, int64_t S,
                       const float* x, float* out) const;
  // Engram layer l's update of h; its projection taken from `ahead` where that made it.
  Status engram(int l, Call& call, float* h, EngramAhead& ahead) const;
  // Engram layer l's kv ([S][wkv rows]): projected ahead (joined here), else into `own` on the
  // call's stream.
  StatusOr<const float*> engram_kv(int l, Call& call, EngramAhead& ahead, DevBuf<float>& own) const;
  // Engram layer e's table rows of the call gathered and projected into kv ([S][wkv rows]) on ctx.
  Status engram_project(size_t e, Call& call, const kernels::ExecCtx& ctx, float* kv) const;
  // normed: the last block's exit has made the head's normed input already (rows [S][D]), or
  // null: made here from h and pre_mix.
  Status head(Call& call, const float* h, const float* pre_mix, const float* normed, bool all_logits, float* out) const;

  config::ModelConfig cfg_;
  kernels::ExecCtx load_ctx_;
  std::vector<Layer> layers_;
  kernels::Weight token_embd_, output_;
  float* output_norm_ = nullptr;
  float* rope_plain_ = nullptr;  // device frequencies
  float* rope_yarn_ = nullptr;
  float* pre_init_ = nullptr;  // [hc_mult]: 1, 0, ... (the first block's collapse of one token)
  bool routed_decode_ = false;  // every layer's routed experts have device-routed GEMVs
  ExpertSource* streamed_ = nullptr;  // the routed experts' source when they are not resident
  bool prefetch_next_ = false;
  bool expert_act_q8_ = false;
  // Streamed experts: each layer's arena slot layout (ExpertTable without ids), recorded by the
  // eager decode path, for segmented graphs; off for good after a failed capture.
  mutable std::mutex slot_mu_;
  mutable std::vector<ExpertTable> slot_layout_;
  mutable std::vector<bool> slot_layout_known_;
  mutable const uint8_t* slot_arena_ = nullptr;  // the arena the layouts point into
  mutable std::atomic<bool> segments_ok_{true};
  bool engram_host_ = false;  // Engram tables on the host: Layer::engram_embd views the mapped file
  std::atomic<bool> graphs_{true};
  mutable std::atomic<int64_t> replays_{0};
  std::vector<void*> owned_;  // every weight allocation, freed with the model
  std::atomic<bool> profile_{false};
  mutable std::mutex profile_mu_;
  mutable std::map<std::string, double> profile_ms_;
  class Phase;
};

// A profiled phase: synchronises the stream at both ends and adds the wall time (profiling on).
class DeviceModel::Phase {
 public:
  Phase(const DeviceModel& m, const kernels::ExecCtx& ctx, const char* name);
  ~Phase();

 private:
  const DeviceModel& m_;
  const kernels::ExecCtx& ctx_;
  const char* name_;
  bool on_;
  int64_t t0_ns_ = 0;
};

// Per-forward state shared down the layer stack (call.h's Model::Call on the device).
struct DeviceModel::Call {
  Call(const kernels::ExecCtx& c, DeviceSequence& s) : ctx(c), seq(s) {}
  const kernels::ExecCtx& ctx;
  DeviceSequence& seq;
  int64_t pos0 = 0, S = 0, n_win = 0;
  const int64_t* engram_ids = nullptr;  // device [engram layer][S][cols]
  // Engram tables on the host: the ids above number rows of `engram_rows` (device, at
  // engram_stage_offset), which a call run as issued fills layer by layer from
  // `engram_host_ids` (the table rows) through the pinned `engram_stage`; a replay finds them
  // staged.
  uint8_t* engram_rows = nullptr;
  const int64_t* engram_host_ids = nullptr;
  uint8_t* engram_stage = nullptr;
  // A captured decode step: per-step values read from `step` (StepSlots) when it runs, sizes
  // from the capacity `cap` (positions below it); null / 0 for a call run as issued.
  const int64_t* step = nullptr;
  int64_t cap = 0;
  std::vector<std::pair<DevRows*, int64_t>>* appends = nullptr;  // a capture: the rows it appends
  // A streamed decode step being captured: moe() ends the segment at each routing copy.
  DecodeGraphs* segmenting = nullptr;
  int parity = 0;
  kernels::DevScalar pos() const { return {pos0, slot(StepSlots::kPos)}; }
  kernels::DevScalar group_start(int r) const { return {(pos0 / r) * r, slot(StepSlots::group_start(r))}; }
  // The cache row of the first latent this call completes (rows = the cache's rows before it).
  kernels::DevScalar new_row(int r, int64_t rows) const { return {rows, slot(StepSlots::new_row(r))}; }
  // Keys visible to the call's last token (a capture: room for any position below cap).
  int64_t n_keys(int r) const { return cap > 0 ? cap / r : (pos0 + S) / r; }
  const int64_t* slot(int i) const { return step != nullptr ? step + i : nullptr; }
  // The sequence's branch i for a BranchScope, or null (none made; a segmented capture).
  const kernels::Branch* branch(int i) const {
    return segmenting == nullptr && seq.branches[i].ctx.cuda_stream != nullptr ? &seq.branches[i] : nullptr;
  }
  // The branch of Engram layer e (the e-th of the config's layer ids), or null as branch().
  const kernels::Branch* engram_branch(size_t e) const {
    return segmenting == nullptr && e < seq.engram_branches.size() ? &seq.engram_branches[e] : nullptr;
  }
  DevBuf<int32_t> topk;   // [S][topk_width], already + n_win, or -1
  int64_t topk_width = 0;
  DevBuf<uint8_t> cand;   // [S][cand_width]
  int64_t cand_width = 0;
  // Streamed experts: the (layer, expert) leases this call holds, released once the stream
  // has run past the kernels that read them (at the latest here, after a synchronisation).
  ExpertSource* source = nullptr;
  std::vector<std::pair<int, int>> leases;
  void release_leases() {
    for (const auto& [layer, expert] : leases) source->release(layer, expert);
    leases.clear();
  }
  ~Call() {
    if (!leases.empty()) {
      (void)kernels::stream_sync(ctx);
      release_leases();
    }
  }
};

}  // namespace dsflash::model
