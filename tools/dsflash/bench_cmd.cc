// `dsflash bench --model FILE [--prompt N] [--decode M] [--runs R] [--warmup W] [--csv PATH]
//  [--label L] [--backend cpu|cuda] [--expert-activations f32|q8] [--profile-step]`: prefill
// and decode throughput of one sequence and the time to copy its state after the prompt
// (median of R runs after W uncounted warm-up runs, default 1), with the bytes-moved bound for
// decode, appended to bench/results.csv:
//   date,commit,machine,benchmark,configuration,metric,value,unit
// On the CUDA backend also: the median decode step replayed from CUDA graphs and issued eagerly
// (M further steps), the device's measured copy bandwidth, the fraction of the bound (bytes
// read per token / copy bandwidth) the graph step reaches, a per-phase breakdown from a further,
// synchronised (profiled) decode run, the GPU time per kernel of an eager run, and the step with
// an API request's draw (temperature 1, top-p 0.95) made on the host and on the device.
// --profile-step (CUDA): instead, after the prompt and M graph decode steps, one more graph step
// inside the range an external profiler records (kernels::profiler_range; run under
// `ncu --profile-from-start off`, scripts/gpu-step-profile.sh); no rows are appended.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "inference_svc/engine/sampler.h"
#include "inference_svc/model/model.h"
#include "kernels/cpu/parallel.h"
#include "kernels/exec.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/bench_csv.h"
#include "tools/dsflash/commands.h"

namespace dsflash::tools {
namespace {

// Bytes of weights one decode token reads: every tensor except the routed experts and the
// Engram tables, plus top-k of the routed experts per layer and the Engram rows.
double decode_bytes(const gguf::Model& m, const config::ModelConfig& c) {
  double bytes = 0;
  for (const auto& t : m.tensors()) {
    if (t.name.find("_exps.") != std::string::npos) {
      bytes += static_cast<double>(t.n_bytes) * c.n_expert_used / c.n_expert;
    } else if (t.name.find("engram_embd") != std::string::npos) {
      bytes += static_cast<double>(t.n_bytes) / static_cast<double>(t.ne[1]) * c.engram.cols();
    } else if (t.name != "token_embd.weight") {
      bytes += static_cast<double>(t.n_bytes);
    }
  }
  return bytes;
}

struct Result {
  double prefill_tps = 0, decode_tps = 0, step_ms = 0;
  double eager_step_ms = 0;  // CUDA: the same steps issued op by op instead of replayed graphs
  double copy_ms = 0;        // Model::copy_sequence of the prompt's state (prefix reuse's copy)
};

// Bytes of caches one decode step at position `pos` reads: every layer's window ring, the
// selected compressed rows and, for index sources, every index key.
double decode_cache_bytes(const config::ModelConfig& c, int64_t pos) {
  double bytes = 0;
  for (const auto& L : c.layers) {
    bytes += static_cast<double>(c.window) * c.head_dim * 4;
    if (L.compress_ratio == 0) continue;
    const int64_t n = pos / L.compress_ratio;
    bytes += static_cast<double>(std::min<int64_t>(n, c.index_topk)) * c.head_dim * 4;
    if (L.is_index_source) bytes += static_cast<double>(n) * c.index_head_dim * 4;
  }
  return bytes;
}

// The benchmark's prompt: n ids spread over the vocabulary (past the first 3).
std::vector<int32_t> bench_prompt(const model::Model& m, int64_t n) {
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) prompt[i] = static_cast<int32_t>(3 + (i * 7919) % (m.config().n_vocab - 3));
  return prompt;
}

// The greedy next token: the index of the largest logit.
int32_t greedy_next(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Per run: prefill, a copy of the prompt's state (what prefix reuse takes of a thinking-mode
// prompt; a new sequence and its caches' copy), n_decode steps (graphs on the CUDA backend),
// then on the CUDA backend n_decode further steps issued eagerly.
StatusOr<Result> measure(model::Model& m, int64_t n_prompt, int64_t n_decode, int runs, int warmup, bool cuda) {
  std::vector<double> pre, dec, steps, eager_steps, copies;
  const std::vector<int32_t> prompt = bench_prompt(m, n_prompt);
  for (int r = 0; r < runs + warmup; ++r) {  // warm-up runs (caches, allocator pools) are not counted
    auto seq = m.new_sequence();
    if (seq == nullptr) return absl::ResourceExhaustedError("no device memory for a sequence");
    std::vector<float> logits;
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(m.forward(*seq, prompt, false, &logits));
    const auto t1 = std::chrono::steady_clock::now();
    auto copy = m.copy_sequence(*seq);
    if (!copy.ok()) return copy.status();
    const double copy_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    copy->reset();
    const auto t1d = std::chrono::steady_clock::now();
    auto decode = [&](std::vector<double>& out) -> Status {
      for (int64_t i = 0; i < n_decode; ++i) {
        const int32_t next = greedy_next(logits);
        const auto s0 = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(m.forward(*seq, {next}, false, &logits));
        out.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
      }
      return absl::OkStatus();
    };
    std::vector<double> run_steps, run_eager;
    RETURN_IF_ERROR(decode(run_steps));
    const auto t2 = std::chrono::steady_clock::now();
    if (cuda) {
      m.set_decode_graphs(false);
      const Status s = decode(run_eager);
      m.set_decode_graphs(true);
      RETURN_IF_ERROR(s);
    }
    if (r < warmup) continue;
    pre.push_back(n_prompt / std::chrono::duration<double>(t1 - t0).count());
    dec.push_back(n_decode / std::chrono::duration<double>(t2 - t1d).count());
    copies.push_back(copy_ms);
    steps.insert(steps.end(), run_steps.begin(), run_steps.end());
    eager_steps.insert(eager_steps.end(), run_eager.begin(), run_eager.end());
  }
  return Result{median(pre), median(dec), median(steps), eager_steps.empty() ? 0.0 : median(eager_steps),
                median(copies)};
}

// Median milliseconds of a graph decode step that also draws the next token as an API request
// does (temperature 1, top-p 0.95): on the device (forward_draw: one id comes back), or on the
// host (the logits copied back, the engine's Sampler).
// top_logprobs >= 0: each draw's log-probabilities too, with that many alternatives (as a
// request with logprobs asks).
StatusOr<double> sampled_step_ms(model::Model& m, int64_t n_prompt, int64_t n_decode, bool on_device,
                                 int top_logprobs) {
  engine::SamplingParams sp;
  sp.top_p = 0.95f;
  sp.seed = 1;
  engine::Sampler sampler(sp);
  model::DeviceDraw d;
  d.params = sampler.params();
  d.penalties = sampler.penalties();
  d.top_logprobs = top_logprobs;
  kernels::sample::DrawLogprobs lp;
  auto seq = m.new_sequence();
  if (seq == nullptr) return absl::ResourceExhaustedError("no device memory for a sequence");
  std::vector<float> logits;
  int32_t next = 0;
  auto step = [&](const std::vector<int32_t>& tokens) -> Status {
    if (on_device) {
      d.u01 = sampler.next_uniform();
      return m.forward_draw(*seq, tokens, d, &next, &lp);
    }
    RETURN_IF_ERROR(m.forward(*seq, tokens, false, &logits));
    const std::vector<float> raw = top_logprobs >= 0 ? logits : std::vector<float>{};
    next = sampler.sample(logits, {});
    if (top_logprobs >= 0) (void)engine::Sampler::logprobs(raw, next, static_cast<uint32_t>(top_logprobs));
    return absl::OkStatus();
  };
  const std::vector<int32_t> prompt = bench_prompt(m, n_prompt);
  RETURN_IF_ERROR(step(prompt));
  std::vector<double> ms;
  for (int64_t i = 0; i < n_decode; ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(step({next}));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
  }
  return median(ms);
}

// Device-to-device copy bandwidth (bytes read + written per second) of a 1 GiB buffer, median
// of 5 copies.
StatusOr<double> copy_bandwidth() {
  ASSIGN_OR_RETURN(void* stream, kernels::stream_create());
  const kernels::ExecCtx ctx{kernels::Backend::kCuda, stream};
  const size_t n = size_t{1} << 30;
  ASSIGN_OR_RETURN(void* a, kernels::device_alloc(ctx, n));
  ASSIGN_OR_RETURN(void* b, kernels::device_alloc(ctx, n));
  std::vector<double> bw;
  for (int i = 0; i < 6; ++i) {
    RETURN_IF_ERROR(kernels::stream_sync(ctx));
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(kernels::copy(ctx, kernels::Copy::kDeviceToDevice, b, a, n));
    RETURN_IF_ERROR(kernels::stream_sync(ctx));
    if (i > 0) bw.push_back(2.0 * n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  kernels::device_free(ctx, a);
  kernels::device_free(ctx, b);
  RETURN_IF_ERROR(kernels::stream_sync(ctx));
  kernels::stream_destroy(stream);
  return median(bw);
}

// Milliseconds per decode step by phase, from a synchronised run of n_decode steps.
StatusOr<std::map<std::string, double>> decode_profile(model::Model& m, int64_t n_prompt, int64_t n_decode) {
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt), 5);
  auto seq = m.new_sequence();
  if (seq == nullptr) return absl::ResourceExhaustedError("no device memory for a sequence");
  std::vector<float> logits;
  RETURN_IF_ERROR(m.forward(*seq, prompt, false, &logits));
  m.set_profiling(true);
  for (int64_t i = 0; i < n_decode; ++i) RETURN_IF_ERROR(m.forward(*seq, {7}, false, &logits));
  auto p = m.profile();
  m.set_profiling(false);
  for (auto& [name, ms] : p) ms /= static_cast<double>(n_decode);
  return p;
}

// GPU time per kernel (events around every launch), longest first: of the prefill of
// n_prompt tokens (per prefill) or, with n_decode > 0, of n_decode eager steps after it (per
// token).
StatusOr<std::vector<kernels::KernelTime>> kernel_times(model::Model& m, int64_t n_prompt, int64_t n_decode) {
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt), 5);
  auto seq = m.new_sequence();
  if (seq == nullptr) return absl::ResourceExhaustedError("no device memory for a sequence");
  std::vector<float> logits;
  if (n_decode > 0) RETURN_IF_ERROR(m.forward(*seq, prompt, false, &logits));
  m.set_decode_graphs(false);
  kernels::set_kernel_timing(true);
  Status s = n_decode > 0 ? absl::OkStatus() : m.forward(*seq, prompt, false, &logits);
  for (int64_t i = 0; i < n_decode && s.ok(); ++i) s = m.forward(*seq, {7}, false, &logits);
  auto times = kernels::kernel_times();
  kernels::set_kernel_timing(false);
  m.set_decode_graphs(true);
  RETURN_IF_ERROR(s);
  if (!times.ok()) return times.status();
  const int64_t per = std::max<int64_t>(n_decode, 1);
  for (auto& k : *times) {
    k.ms /= static_cast<double>(per);
    k.launches /= per;
  }
  return *times;
}

// Rows "<prefix>_kernels_total_ms" and "<prefix>_kernel_<name>_ms" for the longest `top`.
void kernel_rows(const std::vector<kernels::KernelTime>& times, const std::string& prefix, const std::string& per,
                 size_t top, std::vector<BenchRow>* rows) {
  double total = 0;
  for (const auto& k : times) total += k.ms;
  rows->push_back({prefix + "_kernels_total_ms", total, "ms " + per + " (eager, GPU time of every kernel)"});
  for (size_t i = 0; i < times.size() && i < top; ++i) {
    std::string name = times[i].name;
    for (char& c : name) c = c == ',' ? ';' : c == ' ' ? '_' : c;
    rows->push_back({prefix + "_kernel_" + name + "_ms", times[i].ms,
                     absl::StrCat("ms ", per, " (", times[i].launches, " launches)")});
  }
}

// Device memory one sequence holds after the prompt and n_decode graph steps (its caches and
// graphs and the scratch the pools keep; the pools emptied first), and how much comes back
// once it is freed and Model::release_memory has run (MiB).
StatusOr<std::pair<double, double>> sequence_memory(model::Model& m, int64_t n_prompt, int64_t n_decode) {
  RETURN_IF_ERROR(m.release_memory());
  ASSIGN_OR_RETURN(const kernels::DeviceMemory before, kernels::device_memory());
  kernels::DeviceMemory held;
  {
    auto seq = m.new_sequence();
    if (seq == nullptr) return absl::ResourceExhaustedError("no device memory for a sequence");
    std::vector<float> logits;
    RETURN_IF_ERROR(m.forward(*seq, bench_prompt(m, n_prompt), false, &logits));
    for (int64_t i = 0; i < n_decode; ++i) RETURN_IF_ERROR(m.forward(*seq, {greedy_next(logits)}, false, &logits));
    ASSIGN_OR_RETURN(held, kernels::device_memory());
  }
  RETURN_IF_ERROR(m.release_memory());
  ASSIGN_OR_RETURN(const kernels::DeviceMemory back, kernels::device_memory());
  constexpr double kMiB = 1 << 20;
  return std::make_pair((static_cast<double>(before.free) - held.free) / kMiB,
                        (static_cast<double>(back.free) - held.free) / kMiB);
}

// --profile-step: one graph decode step, warmed by the prompt and n_decode steps, in the
// profiler's range.
Status profile_step(model::Model& m, int64_t n_prompt, int64_t n_decode) {
  auto seq = m.new_sequence();
  if (seq == nullptr) return absl::ResourceExhaustedError("no device memory for a sequence");
  std::vector<float> logits;
  RETURN_IF_ERROR(m.forward(*seq, bench_prompt(m, n_prompt), false, &logits));
  auto step = [&]() { return m.forward(*seq, {greedy_next(logits)}, false, &logits); };
  for (int64_t i = 0; i < n_decode; ++i) RETURN_IF_ERROR(step());
  const int64_t replays0 = m.decode_graph_replays();
  RETURN_IF_ERROR(kernels::profiler_range(true));
  const Status s = step();
  RETURN_IF_ERROR(kernels::profiler_range(false));
  RETURN_IF_ERROR(s);
  if (m.decode_graph_replays() != replays0 + 1) {
    return absl::FailedPreconditionError("--profile-step: the profiled step did not run as a CUDA graph");
  }
  std::printf("profiled one graph decode step at position %lld\n", static_cast<long long>(n_prompt + n_decode));
  return absl::OkStatus();
}

Status run(const Args& a) {
  ASSIGN_OR_RETURN(const int64_t n_prompt, a.get_int("prompt", 64));
  ASSIGN_OR_RETURN(const int64_t n_decode, a.get_int("decode", 16));
  ASSIGN_OR_RETURN(const int64_t runs, a.get_int("runs", 3));
  ASSIGN_OR_RETURN(const int64_t warmup, a.get_int("warmup", 1));
  if (n_prompt < 1 || n_decode < 1 || runs < 1) return absl::InvalidArgumentError("--prompt, --decode, --runs must be >= 1");
  if (warmup < 0 || warmup > 10) return absl::InvalidArgumentError("--warmup must be 0..10");
  const std::string backend = a.get_or("backend", "cpu");
  if (backend != "cpu" && backend != "cuda") return absl::InvalidArgumentError("--backend must be cpu or cuda");
  const bool cuda = backend == "cuda";
  const std::string act = a.get_or("expert-activations", "f32");
  if (act != "f32" && act != "q8") return absl::InvalidArgumentError("--expert-activations must be f32 or q8");
  ASSIGN_OR_RETURN(auto file, gguf::Model::open(a.get_or("model", "")));
  const auto l0 = std::chrono::steady_clock::now();
  model::LoadOptions options{cuda ? kernels::Backend::kCuda : kernels::Backend::kCpu};
  options.expert_act_q8 = act == "q8";
  ASSIGN_OR_RETURN(auto m, model::Model::load(*file, nullptr, options));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
  if (n_prompt + (cuda ? 2 : 1) * n_decode > m->config().n_ctx) {
    return absl::InvalidArgumentError("prompt + decode steps exceed the context");
  }
  if (a.has("profile-step")) {
    if (!cuda) return absl::InvalidArgumentError("--profile-step needs --backend cuda");
    return profile_step(*m, n_prompt, n_decode);
  }
  const int64_t replays0 = m->decode_graph_replays();
  ASSIGN_OR_RETURN(const Result r, measure(*m, n_prompt, n_decode, static_cast<int>(runs), static_cast<int>(warmup), cuda));
  const int64_t replays = m->decode_graph_replays() - replays0;
  const double bytes = decode_bytes(*file, m->config());
  const std::string config = absl::StrCat(a.get_or("label", m->config().name), " prompt=", n_prompt, " decode=", n_decode,
                                          " runs=", runs, " warmup=", warmup, " backend=", backend,
                                          act == "q8" ? " expert-activations=q8" : "");
  std::vector<BenchRow> rows = {{"prefill_tokens_per_s", r.prefill_tps, "tok/s"},
                                {"decode_tokens_per_s", r.decode_tps, "tok/s"},
                                {"decode_weight_bytes_per_token", bytes, "bytes"},
                                {"decode_weight_read_rate", bytes * r.decode_tps / 1e9, "GB/s"},
                                {"sequence_copy_ms_median", r.copy_ms, "ms (copy_sequence after the prompt)"}};
  if (cuda) {
    const double cache = decode_cache_bytes(m->config(), n_prompt + n_decode / 2);
    ASSIGN_OR_RETURN(const double bw, copy_bandwidth());
    const double bound_ms = (bytes + cache) / bw * 1e3;
    rows.push_back({"load_seconds", load_s, "s"});
    rows.push_back({"decode_step_ms_median", r.step_ms, "ms"});
    rows.push_back({"decode_step_eager_ms_median", r.eager_step_ms, "ms"});
    rows.push_back({"decode_graph_replays", static_cast<double>(replays), "steps"});
    rows.push_back({"decode_cache_bytes_per_token", cache, "bytes"});
    rows.push_back({"device_copy_bandwidth", bw / 1e9, "GB/s"});
    rows.push_back({"decode_step_bound_ms", bound_ms, "ms"});
    rows.push_back({"decode_fraction_of_bound", bound_ms / r.step_ms, "ratio"});
    for (const int top : {-1, 5}) {
      for (const bool on_device : {false, true}) {
        ASSIGN_OR_RETURN(const double ms, sampled_step_ms(*m, n_prompt, n_decode, on_device, top));
        rows.push_back({absl::StrCat("decode_step_sampled", top >= 0 ? "_logprobs" : "",
                                     on_device ? "_on_device" : "_on_host", "_ms_median"),
                        ms, top >= 0 ? "ms (T=1 top_p=0.95, logprobs with 5 alternatives)" : "ms (T=1 top_p=0.95)"});
      }
    }
    ASSIGN_OR_RETURN(const auto mem, sequence_memory(*m, n_prompt, n_decode));
    rows.push_back({"sequence_device_mib", mem.first, "MiB (a sequence after the prompt and the decode steps)"});
    rows.push_back({"sequence_device_mib_released", mem.second, "MiB (back once freed and released)"});
    ASSIGN_OR_RETURN(const auto phases, decode_profile(*m, std::min<int64_t>(n_prompt, 64), std::min<int64_t>(n_decode, 16)));
    for (const auto& [name, ms] : phases) rows.push_back({"decode_phase_" + name + "_ms", ms, "ms (synchronised)"});
    ASSIGN_OR_RETURN(const auto decode_k,
                     kernel_times(*m, std::min<int64_t>(n_prompt, 64), std::min<int64_t>(n_decode, 16)));
    kernel_rows(decode_k, "decode", "per token", 24, &rows);
    if (n_prompt <= 1024) {  // a further prefill of the prompt, timed per kernel
      ASSIGN_OR_RETURN(const auto prefill_k, kernel_times(*m, n_prompt, 0));
      kernel_rows(prefill_k, "prefill", absl::StrCat("per ", n_prompt, "-token prefill"), 16, &rows);
    }
  }
  RETURN_IF_ERROR(append_bench_rows(a.get_or("csv", "bench/results.csv"), cuda ? "cuda_forward" : "cpu_forward", config,
                                    rows));
  std::printf("(median of %lld runs)\n", static_cast<long long>(runs));
  return absl::OkStatus();
}

}  // namespace

int bench_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"profile-step"},
                          {"model", "prompt", "decode", "runs", "warmup", "csv", "label", "backend", "expert-activations"});
  if (!args.ok() || !args->has("model")) {
    std::fprintf(stderr,
                 "usage: dsflash bench --model FILE [--prompt N] [--decode M] [--runs R] [--warmup W] [--csv PATH] "
                 "[--label L] [--backend cpu|cuda] [--expert-activations f32|q8] [--profile-step]\n");
    return 2;
  }
  return exit_code(run(*args));
}

}  // namespace dsflash::tools
