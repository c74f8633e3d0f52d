// The DeepSeek-V4.1 model on the CPU backend: resident weights from a GGUF set, per-sequence
// state, and the forward pass (prefill of S tokens at position 0, then single-token decode),
// written against kernels/ and following spec/model-v41.md §2-3 op by op.
//
// Conventions of the goldens (../shared/golden/README.md §2), which this code follows:
//  - every KV source republishes its own index-key cache on every call (spec §2.6 quirk fixed);
//  - every top-k (indexer, candidate blocks, MoE gate) breaks exact ties towards the lower index;
//  - plain bf16 GEMMs on the dequantised weights (no activation FP8 quantisation); the four
//    explicit QDQ points (window KV, compressed KV, indexer q and k) are kept.
// Thread-safety: a Model is immutable after load and may serve several Sequences, one forward
// at a time per Sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/status.h"
#include "kernels/exec.h"
#include "kernels/linear/linear.h"
#include "kernels/rope/rope.h"
#include "kernels/sample/sample.h"

namespace dsflash::model {

// The three matrices of one routed expert.
struct ExpertWeights {
  kernels::Weight gate, up, down;
  // From an arena of equal slots (the expert store): the slot these matrices occupy, the
  // arena's first byte and the distance between slots. Every slot holds its matrices at the
  // same offsets, so a kernel can take slot numbers instead of pointers. -1 / null / 0 otherwise.
  int64_t slot = -1;
  const uint8_t* arena = nullptr;
  uint64_t slot_stride = 0;
};

// Where routed-expert bytes come from: in-process from the GGUF here, from the expert store
// (shared memory / device arena) in the service. acquire() may block; every acquire is paired
// with a release() once the forward step no longer reads the weights.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual StatusOr<ExpertWeights> acquire(int layer, int expert) = 0;
  virtual void release(int layer, int expert) = 0;
  // A hint, before a layer's acquires, naming every expert it will acquire (a remote source
  // starts all their loads at once).
  virtual void prefetch(int /*layer*/, const std::vector<int>& /*experts*/) {}
  // Where the matrices acquire() hands out live: host memory (the CPU backend reads them) or
  // device memory (a device arena; the CUDA backend reads them).
  virtual kernels::Backend memory() const { return kernels::Backend::kCpu; }
  // How many leases one forward may hold at once (the arena's slots): a forward that needs
  // more experts than this waits for its kernels and releases before acquiring further.
  virtual size_t lease_budget() const { return SIZE_MAX; }
  // The first byte of the arena acquire() hands out slots of now (ExpertWeights::arena), or
  // null where the source has no arena of slots; it changes when a remote source reconnects to
  // a new arena. Pure, so a wrapping source must forward it (streamed graph segments need it).
  virtual const uint8_t* arena_base() const = 0;
};

// Reads expert slices straight from the (mapped) merged 3-D GGUF tensors.
class GgufExpertSource : public ExpertSource {
 public:
  static StatusOr<std::unique_ptr<GgufExpertSource>> create(const gguf::Model& m, const config::ModelConfig& c);
  StatusOr<ExpertWeights> acquire(int layer, int expert) override;
  void release(int, int) override {}
  const uint8_t* arena_base() const override { return nullptr; }  // the file's tensors, no slots

 private:
  std::vector<ExpertWeights> merged_;  // per layer: rows of all experts
  int64_t n_expert_ = 0;
};

// Everything a sequence carries between calls (spec §2.12).
struct LayerState {
  std::vector<float> window;     // [window][head_dim] ring, slot p mod window
  std::vector<float> kv_state;   // ratio-2 KV sources: partial group [2][head_dim] fp32
  std::vector<float> score_state;
  std::vector<float> comp_kv;    // KV sources: compressed rows [n][head_dim]
  std::vector<float> index_k;    // KV sources: index keys [n][index_head_dim]
};

struct DeviceSequence;  // model/device_model.h

struct Sequence {
  int64_t n_past = 0;
  std::vector<LayerState> layers;   // CPU backend
  std::vector<int64_t> engram_ids;  // compressed ids of every position so far
  std::shared_ptr<DeviceSequence> device;  // CUDA backend: caches and stream on the device
};

struct LoadOptions {
  // kCuda: the forward pass runs in device memory (model/device_model.h). Every weight is
  // copied there; the routed experts too with the in-process source, while an expert source
  // with device memory (the expert store's device arena) streams them: each MoE layer
  // acquires the experts its routing picked and releases them once its kernels have run.
  kernels::Backend backend = kernels::Backend::kCpu;
  // kCuda with streamed experts, decode: layer l+1's router also runs on layer l's MoE input
  // and the experts it picks are hinted to the source (loads start a layer early). Off by
  // default: it always reads more (12-16 % on the H200, bench/results.csv expert_streaming);
  // with nearly even routing it decoded 9-15 % slower, with skewed routing (mkmodel
  // --routing-skew 0.3) 6-9 % faster at 25-50 % arenas (more reads in flight), and Atlas
  // measured a net loss on V4.1 on a GB10. dsflash-inference --prefetch-next-layer on.
  bool prefetch_next_layer = false;
  // kCuda: where the Engram tables live. kAuto: on the host when the routed experts are
  // streamed (a model larger than memory; the real tables are ~80 GB at Q2_K), else in device
  // memory. On the host, each call's rows are read from the mapped file (model/engram_rows.h)
  // and copied to the device with the call; the logits are the same either way.
  enum class EngramTables { kAuto, kDevice, kHost };
  EngramTables engram_tables = EngramTables::kAuto;
  // kCuda, decode: the routed experts' Q2_K / Q3_K GEMVs read the activations quantised to 8
  // bits per run of 32 (scale max|x| / 127) and multiply the codes with dp4a, as llama.cpp's
  // MMVQ does. On the H200 (perf preset) those GEMVs take 3.3 instead of 5.4 ms per token and
  // decode runs at 63.7 instead of 57.2 tok/s; each product's NMSE against fp32 is ~3e-5. Off
  // by default: the CPU reference multiplies fp32 activations, and this moves the logits by
  // more than summation order (golden_cuda_test measures it: still within the CPU's own
  // sensitivity to one bf16 ulp at layer 0).
  bool expert_act_q8 = false;
};

// A token drawn on the device from a forward's last logits (CUDA backend): the logits get
// `edits`, then the pick is kernels/sample/sample.h's (greedy at temperature 0).
struct DeviceDraw {
  kernels::sample::Params params;
  kernels::sample::Penalties penalties;
  std::vector<kernels::sample::Edit> edits;  // ascending ids
  double u01 = 0;                            // the draw's uniform in [0, 1)
  // >= 0: the draw's log-probabilities come back too (forward_draw's `logprobs`), with this
  // many alternatives (at most kernels::sample::DeviceSampler::kMaxTopLogprobs).
  int top_logprobs = -1;
};

// Called with every named intermediate (e.g. "L3.attn.norm_out", rows x cols values); the
// hook may overwrite the values (teacher forcing in tests). Diagnosis only.
using Hook = std::function<void(const std::string& name, float* data, int64_t rows, int64_t cols)>;

struct LayerWeights;  // model/weights.h
class DeviceModel;    // model/device_model.h
struct DeviceOut;     // model/device_model.h

class Model {
 public:
  static StatusOr<std::unique_ptr<Model>> load(const gguf::Model& file, std::unique_ptr<ExpertSource> experts = nullptr,
                                               const LoadOptions& options = {});
  ~Model();

  const config::ModelConfig& config() const { return cfg_; }
  kernels::Backend backend() const { return device_ ? kernels::Backend::kCuda : kernels::Backend::kCpu; }
  // CUDA backend: times the forward's phases from now on (synchronising after each, so the
  // pass is slower) and returns the milliseconds per phase so far; empty on the CPU backend.
  void set_profiling(bool on);
  std::map<std::string, double> profile() const;
  // CUDA backend: decode steps replayed from CUDA graphs (on, the default) or issued op by op.
  // Both give the same logits, bit for bit.
  void set_decode_graphs(bool on);
  // Decode steps replayed from graphs so far (CUDA backend; 0 on the CPU).
  int64_t decode_graph_replays() const;
  // A fresh sequence (on the CUDA backend its device state; null when that allocation fails).
  std::unique_ptr<Sequence> new_sequence() const;
  // A copy of `seq` that goes on independently of it, on either backend (prefix reuse keeps a
  // prompt's state before its last token this way).
  StatusOr<std::unique_ptr<Sequence>> copy_sequence(const Sequence& seq) const;
  // CUDA backend: gives the device memory of freed sequences (kept by the allocation pools for
  // reuse) back to the driver, so that on GB10 the host sees it again; nothing on the CPU.
  Status release_memory() const;

  // Runs `tokens` at positions seq.n_past...: a prefill (seq empty), a further prefill chunk,
  // or one decode token. The reference supports only the first and the last; a chunk does
  // the same math (each query lists its window in increasing position order, as a prefill
  // does). logits gets [rows][n_vocab] fp32: every position when all_logits, else the last.
  // Hooks are a CPU-backend facility. After a failed call the sequence's caches may be partly
  // written: discard it.
  Status forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits, std::vector<float>* logits,
                 const Hook& hook = nullptr) const;
  // Whether forward_draw is available: the CUDA backend.
  bool draws_on_device() const { return device_ != nullptr; }
  // As forward, but the last position's token is drawn on the device and only it comes back:
  // no copy of the logits, no host pass over the vocabulary; with draw.top_logprobs >= 0 its
  // log-probabilities too, into `logprobs`. FailedPrecondition on the CPU.
  Status forward_draw(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceDraw& draw, int32_t* token,
                      kernels::sample::DrawLogprobs* logprobs = nullptr) const;

 private:
  struct Call;   // per-forward scratch shared between layers (published top-k, candidates)
  struct KvSet;  // rows and index lists given to sparse attention
  Model() = default;
  // forward's checks of a call; appends the tokens' compressed ids to seq.engram_ids.
  Status admit(Sequence& seq, const std::vector<int32_t>& tokens) const;
  // The CUDA backend's forward (a device sequence, then admit); the call's ids are taken back
  // on failure.
  Status device_forward(Sequence& seq, const std::vector<int32_t>& tokens, const DeviceOut& out) const;
  void embed(const std::vector<int32_t>& tokens, std::vector<float>& h) const;
  Status engram(int layer, Sequence& seq, int64_t pos0, int64_t S, std::vector<float>& h, const Hook& hook) const;
  Status block(int layer, Sequence& seq, Call& call, std::vector<float>& h, std::vector<float>& pre_mix,
               const Hook& hook) const;
  void attention(int layer, Sequence& seq, Call& call, std::vector<float>& x, std::vector<float>& out,
                 const Hook& hook) const;
  void compressed_kv(int layer, Sequence& seq, Call& call, const std::vector<float>& x, const std::vector<float>& qr,
                     KvSet& kv, const Hook& hook) const;
  std::vector<float> compress(int layer, Sequence& seq, const Call& call, const std::vector<float>& x) const;
  std::vector<int32_t> indexer(int layer, Sequence& seq, Call& call, const std::vector<float>& x,
                               const std::vector<float>& qr, const std::vector<float>& latent, const Hook& hook) const;
  Status moe(int layer, const std::vector<float>& x, int64_t S, std::vector<float>& out, const Hook& hook) const;
  void head(const std::vector<float>& h, const std::vector<float>& pre_mix, int64_t S, bool all_logits,
            std::vector<float>* logits, const Hook& hook) const;

  config::ModelConfig cfg_;
  std::vector<LayerWeights> layers_;
  kernels::Weight token_embd_, output_;
  std::vector<float> output_norm_;
  kernels::rope::Table rope_plain_, rope_yarn_;
  std::unique_ptr<ExpertSource> experts_;
  std::unique_ptr<DeviceModel> device_;
};

}  // namespace dsflash::model
