// Token sampling on the host (inference_svc/engine/sampler.h) at the model's vocabulary
// (129,280 ids), rows appended to bench/results.csv: median ms per draw over --runs draws for
// pure temperature, top-k, top-p and min-p, on flat logits (the worst case: the mass spread
// over the whole vocabulary) and peaked ones (a few likely tokens over a normal spread, as a
// model's next-token distribution usually is). The decode step it follows is ~12 ms on an H200.
// Where a CUDA device is present, the same draws on the device (kernels/sample/sample_cuda.h,
// logits already in device memory, the id copied back) and greedy, with the GPU time of the
// sampler's own kernels (not CUB's sort) printed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "inference_svc/engine/sampler.h"
#include "kernels/exec.h"
#include "kernels/sample/sample_cuda.h"
#include "tools/dsflash/bench_csv.h"

using namespace dsflash;

namespace {

std::vector<float> make_logits(bool peaked, int64_t V, std::mt19937& gen) {
  std::normal_distribution<float> nd(0.0f, peaked ? 2.0f : 3.0f);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& v : l) v = nd(gen);
  if (peaked) {
    std::uniform_int_distribution<int64_t> id(0, V - 1);
    for (float boost : {16.0f, 14.5f, 13.0f, 12.0f, 11.0f}) l[static_cast<size_t>(id(gen))] += boost;
  }
  return l;
}

struct Config {
  const char* name;
  float temperature;
  int top_k;
  float top_p, min_p;
};

// Median ms per device draw of each config (and greedy) on `base`, copied to the device once.
Status device_rows(const std::vector<float>& base, const std::vector<Config>& configs, int runs,
                   std::vector<tools::BenchRow>* rows) {
  ASSIGN_OR_RETURN(void* stream, kernels::stream_create());
  const kernels::ExecCtx ctx{kernels::Backend::kCuda, stream};
  const int64_t V = static_cast<int64_t>(base.size());
  ASSIGN_OR_RETURN(void* d, kernels::device_alloc(ctx, base.size() * sizeof(float)));
  float* logits = static_cast<float*>(d);
  RETURN_IF_ERROR(kernels::copy(ctx, kernels::Copy::kHostToDevice, logits, base.data(), base.size() * sizeof(float)));
  ASSIGN_OR_RETURN(auto sampler, kernels::sample::DeviceSampler::create(ctx, V));
  std::vector<Config> all = configs;
  all.push_back({"greedy", 0.0f, 0, 1.0f, 0.0f});
  std::mt19937_64 rng(7);
  for (const Config& c : all) {
    const kernels::sample::Params p{c.temperature, c.top_k, c.top_p, c.min_p};
    std::vector<double> ms;
    for (int r = 0; r < runs + 3; ++r) {
      const double u = std::generate_canonical<double, 53>(rng);
      RETURN_IF_ERROR(kernels::stream_sync(ctx));
      const auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(const int32_t token, sampler->draw(logits, V, {}, {}, p, u));
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (token < 0 || token >= V) return absl::InternalError("device draw outside the vocabulary");
      if (r >= 3) ms.push_back(dt);
    }
    rows->push_back({absl::StrCat("device_draw_ms_median ", c.name), tools::median(ms), "ms"});
  }
  kernels::set_kernel_timing(true);
  for (const Config& c : all) {
    RETURN_IF_ERROR(sampler->draw(logits, V, {}, {}, {c.temperature, c.top_k, c.top_p, c.min_p}, 0.5).status());
  }
  ASSIGN_OR_RETURN(const auto times, kernels::kernel_times());
  kernels::set_kernel_timing(false);
  for (const auto& t : times) std::printf("  %-40s %8.1f us over %lld launches\n", t.name.c_str(), t.ms * 1e3, static_cast<long long>(t.launches));
  sampler.reset();
  kernels::device_free(ctx, logits);
  RETURN_IF_ERROR(kernels::stream_sync(ctx));
  kernels::stream_destroy(stream);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv = "bench/results.csv";
  int runs = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--csv") {
      csv = v;
    } else if (!(a == "--runs" && absl::SimpleAtoi(v, &runs) && runs > 0)) {
      std::fprintf(stderr, "usage: sampler_bench [--runs N] [--csv bench/results.csv]\n");
      return 2;
    }
  }
  constexpr int64_t kVocab = 129280;
  const std::vector<Config> configs = {{"temperature 1", 1.0f, 0, 1.0f, 0.0f},
                            {"temperature 0.7 top_k 40", 0.7f, 40, 1.0f, 0.0f},
                            {"temperature 1 top_p 0.9", 1.0f, 0, 0.9f, 0.0f},
                            {"temperature 0.8 min_p 0.05", 0.8f, 0, 1.0f, 0.05f}};
  std::mt19937 gen(1);
  for (const bool peaked : {true, false}) {
    const std::vector<float> base = make_logits(peaked, kVocab, gen);
    std::vector<tools::BenchRow> rows;
    for (const Config& c : configs) {
      engine::SamplingParams p;
      p.temperature = c.temperature, p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p, p.seed = 7;
      engine::Sampler s(p);
      std::vector<double> ms;
      for (int r = 0; r < runs + 3; ++r) {
        std::vector<float> l = base;
        const auto t0 = std::chrono::steady_clock::now();
        const int32_t token = s.sample(l, {});
        const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (token < 0 || token >= kVocab) return 1;
        if (r >= 3) ms.push_back(dt);
      }
      rows.push_back({absl::StrCat("draw_ms_median ", c.name), tools::median(ms), "ms"});
    }
    const std::string config = absl::StrCat(peaked ? "peaked" : "flat", " logits vocab=", kVocab, " runs=", runs);
    Status st = tools::append_bench_rows(csv, "host_sampler", config, rows);
    if (st.ok() && kernels::cuda_available()) {
      std::vector<tools::BenchRow> dev;
      std::printf("device sampler, %s:\n", config.c_str());
      st = device_rows(base, configs, runs, &dev);
      if (st.ok()) st = tools::append_bench_rows(csv, "device_sampler", config, dev);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "sampler_bench: %s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  return 0;
}
