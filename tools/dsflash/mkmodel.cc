// `dsflash mkmodel`: writes a synthetic DeepSeek-V4.1 GGUF (see synth_model.h), with a
// progress bar on a terminal.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/commands.h"
#include "tools/dsflash/synth_model.h"

namespace dsflash::tools {
namespace {

void progress_bar(uint64_t done, uint64_t total) {
  static auto last = std::chrono::steady_clock::time_point{};
  const auto now = std::chrono::steady_clock::now();
  if (done < total && now - last < std::chrono::milliseconds(200)) return;
  last = now;
  const double f = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int width = 40, filled = static_cast<int>(f * width);
  std::fprintf(stderr, "\r[%.*s%*s] %5.1f%%  %.2f / %.2f GB", filled, "########################################",
               width - filled, "", 100.0 * f, done / 1e9, total / 1e9);
  if (done >= total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace

int mkmodel_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"no-progress", "pooled-experts"}, {"out", "preset", "seed", "shards", "experts", "threads", "routing-skew"});
  if (!args.ok() || !args->has("out") || !args->positional().empty()) {
    std::fprintf(stderr,
                 "usage: dsflash mkmodel --out PATH [--preset tiny|perf] [--seed N] [--shards N] [--experts N] "
                 "[--threads N] [--routing-skew Z] [--pooled-experts] [--no-progress]\n%s\n",
                 args.ok() ? "" : std::string(args.status().message()).c_str());
    return 2;
  }
  SynthOptions o;
  o.preset = args->get_or("preset", "tiny");
  auto seed = args->get_int("seed", 1);
  auto shards = args->get_int("shards", 1);
  auto experts = args->get_int("experts", 0);
  auto threads = args->get_int("threads", 0);
  for (const auto* s : {&seed, &shards, &experts, &threads}) {
    if (!s->ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s->status().message()).c_str());
      return 2;
    }
  }
  if (*seed < 0 || *shards < 1 || *shards > 65535 || *experts < 0 || *experts > 4096 || *threads < 0) {
    std::fprintf(stderr, "error: --seed >= 0, --shards in 1..65535, --experts in 0..4096, --threads >= 0\n");
    return 2;
  }
  double skew = 0;
  if (args->has("routing-skew") && (!absl::SimpleAtod(*args->get("routing-skew"), &skew) || !(skew >= 0 && skew <= 10))) {
    std::fprintf(stderr, "error: --routing-skew takes a number in 0..10\n");
    return 2;
  }
  o.routing_skew = static_cast<float>(skew);
  o.pooled_experts = args->has("pooled-experts");
  o.seed = static_cast<uint64_t>(*seed);
  o.n_expert = static_cast<uint32_t>(*experts);
  o.threads = static_cast<uint32_t>(*threads);
  const bool bar = !args->has("no-progress") && ::isatty(STDERR_FILENO);
  auto paths = write_synthetic_model(o, *args->get("out"), static_cast<uint32_t>(*shards),
                                     bar ? std::function<void(uint64_t, uint64_t)>(progress_bar) : nullptr);
  if (!paths.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(paths.status().message()).c_str());
    return 1;
  }
  for (const auto& p : *paths) std::printf("wrote %s\n", p.c_str());
  return 0;
}

}  // namespace dsflash::tools
