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
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "inference_svc/model/device_model.h"

namespace dsflash::model {

using kernels::Copy;

void DecodeGraphs::drop() {
  for (void*& g : exec) {
    kernels::graph_destroy(g);
    g = nullptr;
  }
  for (auto& a : appends) a.clear();
  cap = 0;
}

void DecodeGraphs::release() {
  drop();
  step = DevBuf<int64_t>();
  logits = DevBuf<float>();
  engram_rows = DevBuf<uint8_t>();
  kernels::host_free_pinned(step_host);
  step_host = nullptr;
}

bool DeviceModel::graph_eligible(const Sequence& seq, int64_t S) const {
  return S == 1 && seq.n_past > 0 && graphs_ && !profile_ && routed_decode_;
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

// Records the decode step of the current position's parity (nothing runs).
Status DeviceModel::capture(DeviceSequence& ds, Sequence& seq, int parity) const {
  DecodeGraphs& g = ds.graphs;
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
    return pass(call, g.step.get() + StepSlots::kToken, false, g.logits.get());
  }();
  StatusOr<void*> exec = kernels::capture_end(ds.ctx);
  if (s.ok() && !exec.ok()) s = exec.status();
  if (!s.ok()) {
    if (exec.ok()) kernels::graph_destroy(*exec);
    g.appends[parity].clear();
    return absl::InternalError(absl::StrCat("capturing the decode step as a CUDA graph: ", s.message()));
  }
  g.exec[parity] = *exec;
  return absl::OkStatus();
}

// One decode step from the graph of its parity (captured first if needed).
Status DeviceModel::graph_step(Sequence& seq, int32_t token, std::vector<float>* logits) const {
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
  if (g.exec[parity] == nullptr) RETURN_IF_ERROR(capture(ds, seq, parity));
  RETURN_IF_ERROR(kernels::graph_launch(ds.ctx, g.exec[parity]));
  ++replays_;
  logits->assign(static_cast<size_t>(output_.rows), 0.0f);
  RETURN_IF_ERROR(
      kernels::copy(ds.ctx, Copy::kDeviceToHost, logits->data(), g.logits.get(), output_.rows * sizeof(float)));
  RETURN_IF_ERROR(kernels::stream_sync(ds.ctx));
  for (const auto& [rows, n] : g.appends[parity]) rows->rows += n;  // the rows the replay appended
  return absl::OkStatus();
}

}  // namespace dsflash::model
