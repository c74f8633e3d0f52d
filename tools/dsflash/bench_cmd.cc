// `dsflash bench --model FILE [--prompt N] [--decode M] [--runs R] [--csv PATH] [--label L]`:
// CPU prefill and decode throughput of one sequence (median of R runs, all cores), with the
// bytes-moved bound for decode, appended to bench/results.csv:
//   date,commit,machine,benchmark,configuration,metric,value,unit
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"
#include "inference_svc/model/model.h"
#include "kernels/cpu/parallel.h"
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
  double prefill_tps, decode_tps;
};

StatusOr<Result> measure(const model::Model& m, int64_t n_prompt, int64_t n_decode, int runs) {
  std::vector<double> pre, dec;
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (int64_t i = 0; i < n_prompt; ++i) prompt[i] = static_cast<int32_t>(3 + (i * 7919) % (m.config().n_vocab - 3));
  for (int r = 0; r < runs + 1; ++r) {  // the first run warms caches and is not counted
    auto seq = m.new_sequence();
    std::vector<float> logits;
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(m.forward(*seq, prompt, false, &logits));
    const auto t1 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n_decode; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      RETURN_IF_ERROR(m.forward(*seq, {next}, false, &logits));
    }
    const auto t2 = std::chrono::steady_clock::now();
    if (r == 0) continue;
    pre.push_back(n_prompt / std::chrono::duration<double>(t1 - t0).count());
    dec.push_back(n_decode / std::chrono::duration<double>(t2 - t1).count());
  }
  return Result{median(pre), median(dec)};
}

Status run(const Args& a) {
  ASSIGN_OR_RETURN(const int64_t n_prompt, a.get_int("prompt", 64));
  ASSIGN_OR_RETURN(const int64_t n_decode, a.get_int("decode", 16));
  ASSIGN_OR_RETURN(const int64_t runs, a.get_int("runs", 3));
  if (n_prompt < 1 || n_decode < 1 || runs < 1) return absl::InvalidArgumentError("--prompt, --decode, --runs must be >= 1");
  ASSIGN_OR_RETURN(auto file, gguf::Model::open(a.get_or("model", "")));
  ASSIGN_OR_RETURN(auto m, model::Model::load(*file));
  if (n_prompt + n_decode > m->config().n_ctx) return absl::InvalidArgumentError("prompt + decode exceed the context");
  ASSIGN_OR_RETURN(const Result r, measure(*m, n_prompt, n_decode, static_cast<int>(runs)));
  const double bytes = decode_bytes(*file, m->config());
  const std::string config = absl::StrCat(a.get_or("label", m->config().name), " prompt=", n_prompt, " decode=", n_decode,
                                          " runs=", runs, " backend=cpu");
  RETURN_IF_ERROR(append_bench_rows(a.get_or("csv", "bench/results.csv"), "cpu_forward", config,
                                    {{"prefill_tokens_per_s", r.prefill_tps, "tok/s"},
                                     {"decode_tokens_per_s", r.decode_tps, "tok/s"},
                                     {"decode_weight_bytes_per_token", bytes, "bytes"},
                                     {"decode_weight_read_rate", bytes * r.decode_tps / 1e9, "GB/s"}}));
  std::printf("(median of %lld runs)\n", static_cast<long long>(runs));
  return absl::OkStatus();
}

}  // namespace

int bench_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {}, {"model", "prompt", "decode", "runs", "csv", "label"});
  if (!args.ok() || !args->has("model")) {
    std::fprintf(stderr, "usage: dsflash bench --model FILE [--prompt N] [--decode M] [--runs R] [--csv PATH] [--label L]\n");
    return 2;
  }
  return exit_code(run(*args));
}

}  // namespace dsflash::tools
