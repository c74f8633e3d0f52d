// Decode steps replayed from CUDA graphs (issue 6): a sequence captures its decode step once
// per position parity and replays it at every later position below the capacity it captured
// for. The captured ops read the step's position-dependent values (position, token, Engram
// row ids, cache rows) from a small device array the host rewrites before each replay, and
// size everything position-dependent by the capacity: index scores, candidate masks and top-k
// run over `cap / ratio` keys, keys a position cannot see yet score -inf and are never chosen
// ahead of a visible key, so the published lists are the eager step's followed by -1 (which
// sparse attention skips exactly). The caches are reserved for the capacity first, so no
// captured address moves; a sequence that outgrows it (or whose caches moved in an eager call)
// captures again at twice the capacity.
//
// With streamed experts the step is a chain of segments, split where each MoE layer's routing
// reaches the host (segmented_step): the buffers that live across a split are graph
// allocations of an earlier segment, read and freed by later ones (stream-ordered after it).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "inference_svc/model/device_model.h"

namespace dsflash::model {

using kernels::Copy;

void DecodeGraphs::drop() {
  for (void*& g : exec) {
    kernels::graph_destroy(g);
    g = nullptr;
  }
  drop_segments();
  for (auto& a : appends) a.clear();
  cap = 0;
}

void DecodeGraphs::drop_segments() {
  for (int p : {0, 1}) {
    if (!segments[p].empty()) drop_segments(p);
  }
}

void DecodeGraphs::drop_segments(int parity) {
  for (void* g : segments[parity]) kernels::graph_destroy(g);
  segments[parity].clear();
  split_layer[parity].clear();
  appends[parity].clear();
}

void DecodeGraphs::release() {
  drop();
  step = DevBuf<int64_t>();
  logits = DevBuf<float>();
  engram_rows = DevBuf<uint8_t>();
  kernels::host_free_pinned(step_host);
  step_host = nullptr;
  kernels::host_free_pinned(routing_host);
  kernels::host_free_pinned(slots_host);
  routing_host = slots_host = nullptr;
}

bool DeviceModel::graph_eligible(const Sequence& seq, int64_t S) const {
  return S == 1 && seq.n_past > 0 && graphs_ && !profile_ && (routed_decode_ || segments_possible());
}

bool DeviceModel::segments_possible() const {
  if (streamed_ == nullptr || prefetch_next_ || !segments_ok_) return false;
  const uint8_t* arena = streamed_->arena_base();
  std::lock_guard<std::mutex> lock(slot_mu_);
  if (arena == nullptr || arena != slot_arena_) {  // a new arena (the store came back): record again
    slot_layout_known_.assign(slot_layout_known_.size(), false);
    return false;
  }
  return !slot_layout_known_.empty() &&
         std::all_of(slot_layout_known_.begin(), slot_layout_known_.end(), [](bool b) { return b; });
}

namespace {
int64_t reallocs_of(const DeviceSequence& ds) {
  int64_t n = 0;
  for (const DeviceLayerState& st : ds.layers) n += st.comp_kv.reallocs + st.index_k.reallocs;
  return n;
}
}  // namespace

// Graphs valid for position `pos`: the buffers exist, the capacity covers pos, no cache moved.
Status DeviceModel::prepare_graphs(DeviceSequence& ds, int64_t pos) const {
  DecodeGraphs& g = ds.graphs;
  if (g.step_host == nullptr) {
    const int64_t slots = StepSlots::kEngram + static_cast<int64_t>(cfg_.engram.layer_ids.size()) * cfg_.engram.cols();
    ASSIGN_OR_RETURN(g.step, DevBuf<int64_t>::make(ds.ctx, slots));
    ASSIGN_OR_RETURN(g.logits, DevBuf<float>::make(ds.ctx, output_.rows));
    if (engram_host_) {
      ASSIGN_OR_RETURN(g.engram_rows, DevBuf<uint8_t>::make(ds.ctx, static_cast<int64_t>(engram_stage_offset(
                                                                        cfg_.engram.layer_ids.size(), 1))));
    }
    ASSIGN_OR_RETURN(void* pinned, kernels::host_alloc_pinned(static_cast<size_t>(slots) * sizeof(int64_t)));
    g.step_host = static_cast<int64_t*>(pinned);
    if (streamed_ != nullptr) {
      const size_t n = size_t{cfg_.n_layer} * cfg_.n_expert_used * sizeof(int32_t);
      ASSIGN_OR_RETURN(void* routing, kernels::host_alloc_pinned(n));
      g.routing_host = static_cast<int32_t*>(routing);
      ASSIGN_OR_RETURN(void* slots_h, kernels::host_alloc_pinned(n));
      g.slots_host = static_cast<int32_t*>(slots_h);
    }
  }
  if (pos < g.cap && reallocs_of(ds) == g.reallocs) return absl::OkStatus();
  g.drop();
  int64_t cap = 256;
  while (cap <= pos) cap *= 2;
  cap = std::min<int64_t>(cap, cfg_.n_ctx);
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) {
    const config::LayerConfig& L = cfg_.layers[l];
    if (!L.is_kv_source) continue;
    RETURN_IF_ERROR(ds.layers[l].comp_kv.reserve(ds.ctx, cap / L.compress_ratio));
    RETURN_IF_ERROR(ds.layers[l].index_k.reserve(ds.ctx, cap / L.compress_ratio));
  }
  g.cap = cap;
  g.reallocs = reallocs_of(ds);
  return absl::OkStatus();
}

// Records the decode step of the current position's parity (nothing runs); with streamed
// experts as a chain of segments split at each MoE layer's routing (moe()).
Status DeviceModel::capture(DeviceSequence& ds, Sequence& seq, int parity) const {
  DecodeGraphs& g = ds.graphs;
  const bool segmented = streamed_ != nullptr;
  RETURN_IF_ERROR(kernels::capture_begin(ds.ctx));
  Status s = [&]() -> Status {
    Call call(ds.ctx, ds);  // its scratch is released inside the capture
    call.pos0 = seq.n_past;
    call.S = 1;
    call.n_win = cfg_.window;
    call.step = g.step.get();
    call.cap = g.cap;
    call.engram_ids = g.step.get() + StepSlots::kEngram;
    call.engram_rows = g.engram_rows.get();  // Engram tables on the host: staged before each replay
    call.appends = &g.appends[parity];
    if (segmented) {
      call.segmenting = &g;
      call.parity = parity;
    }
    return pass(call, g.step.get() + StepSlots::kToken, false, g.logits.get());
  }();
  StatusOr<void*> exec = kernels::capture_end(ds.ctx);
  if (s.ok() && !exec.ok()) s = exec.status();
  if (!s.ok()) {
    if (exec.ok()) kernels::graph_destroy(*exec);
    g.drop_segments(parity);  // the segments captured before the failure, and the appends
    return absl::InternalError(absl::StrCat("capturing the decode step as a CUDA graph: ", s.message()));
  }
  if (segmented) {
    g.segments[parity].push_back(*exec);
  } else {
    g.exec[parity] = *exec;
  }
  return absl::OkStatus();
}

// One decode step from the graph of its parity (captured first if needed).
Status DeviceModel::graph_step(Sequence& seq, int32_t token, const DeviceOut& out) const {
  DeviceSequence& ds = *seq.device;
  DecodeGraphs& g = ds.graphs;
  const int64_t pos = seq.n_past;
  RETURN_IF_ERROR(prepare_graphs(ds, pos));
  // The previous step was read back, so its replay is done with the pinned values.
  int64_t* v = g.step_host;
  v[StepSlots::kPos] = pos;
  v[StepSlots::kToken] = token;
  for (int r : {1, 2}) {
    v[StepSlots::group_start(r)] = (pos / r) * r;
    v[StepSlots::new_row(r)] = pos / r;  // latents completed before this position
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> eids, engram_ids(seq, pos, 1));
  if (engram_host_) {  // the step's rows staged for the replay; the ids number them
    const std::vector<int64_t> table_ids = begin_engram_staging(eids, 1);
    const size_t n_engram = cfg_.engram.layer_ids.size();
    ASSIGN_OR_RETURN(uint8_t* stage, engram_stage(ds, engram_stage_offset(n_engram, 1)));
    const int64_t cols = cfg_.engram.cols();
    for (size_t e = 0; e < n_engram; ++e) {
      const uint64_t off = engram_stage_offset(e, 1);
      RETURN_IF_ERROR(
          stage_engram_rows(ds.ctx, e, table_ids.data() + e * cols, 1, stage + off, g.engram_rows.get() + off));
    }
  }
  std::copy(eids.begin(), eids.end(), v + StepSlots::kEngram);
  RETURN_IF_ERROR(kernels::copy(ds.ctx, Copy::kHostToDevice, g.step.get(), v,
                                (StepSlots::kEngram + eids.size()) * sizeof(int64_t)));
  const int parity = static_cast<int>(pos % 2);
  if (streamed_ != nullptr) return segmented_step(seq, token, parity, out);
  if (g.exec[parity] == nullptr) RETURN_IF_ERROR(capture(ds, seq, parity));
  RETURN_IF_ERROR(kernels::graph_launch(ds.ctx, g.exec[parity]));
  ++replays_;
  RETURN_IF_ERROR(deliver(ds, g.logits.get(), 1, out));
  for (const auto& [rows, n] : g.appends[parity]) rows->rows += n;  // the rows the replay appended
  return absl::OkStatus();
}

// A streamed decode step: segment i runs up to MoE layer split_layer[i]'s routing; the host
// waits for it, gives back the previous layer's leases (their kernels have run), acquires the
// layer's experts and writes their slots where segment i + 1 reads them. A capture that fails
// turns segments off for the model and the step runs eagerly.
Status DeviceModel::segmented_step(Sequence& seq, int32_t token, int parity, const DeviceOut& out) const {
  DeviceSequence& ds = *seq.device;
  DecodeGraphs& g = ds.graphs;
  {
    std::lock_guard<std::mutex> lock(slot_mu_);
    if (g.segments_arena != slot_arena_) {  // captured on an arena that has gone
      g.drop_segments();
      g.segments_arena = slot_arena_;
    }
  }
  if (g.segments[parity].empty()) {
    const Status captured = capture(ds, seq, parity);
    if (!captured.ok()) {
      segments_ok_ = false;
      log::warn("streamed decode runs op by op from now on: %s", std::string(captured.message()).c_str());
      return eager(seq, {token}, out);
    }
  }
  const std::vector<void*>& segs = g.segments[parity];
  const int64_t K = cfg_.n_expert_used;
  Call call(ds.ctx, ds);  // holds the step's leases; gives them back on any exit
  call.source = streamed_;
  for (size_t i = 0; i < segs.size(); ++i) {
    RETURN_IF_ERROR(kernels::graph_launch(ds.ctx, segs[i]));
    if (i + 1 == segs.size()) break;
    RETURN_IF_ERROR(kernels::stream_sync(ds.ctx));
    const int l = g.split_layer[parity][i];
    const Status s = acquire_routed_slots(l, call, g.routing_host + l * K, g.slots_host + l * K);
    if (!s.ok()) {
      // The chain stops here and its graphs go; the scratch the segments that ran allocated
      // for the later ones to free stays allocated (a store that died mid-step: rare).
      g.drop();
      return s;
    }
  }
  ++replays_;
  RETURN_IF_ERROR(deliver(ds, g.logits.get(), 1, out));
  call.release_leases();
  for (const auto& [rows, n] : g.appends[parity]) rows->rows += n;
  return absl::OkStatus();
}

}  // namespace dsflash::model
