// What a kernel's code costs to fetch when it is not in the SM's instruction caches: kernels of
// N straight-line FMAs (8 independent chains, 4 warps a CTA, one CTA a SM) timed with their
// code (a) in the SM's caches (run twice in a row), (b) in L2 only (another kernel's 256 KB of
// code ran between) and (c) in DRAM only (as (b), then 256 MB written through L2), the way a
// decode step's kernels find theirs after the layer's weights streamed through. Each timed
// launch is queued behind a ~20 us spin, so its events time the GPU's work only (the first
// form, without the spin, timed the host's launch latency in (a) and (b) but not in (c)).
// Medians of --reps launches; rows (bench/results.csv format) with --csv.
//   icache_bench [--reps N] [--csv FILE] [--label TEXT]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_csv.h"
#include "bench/bench_cuda.cuh"

namespace {

using bench::delay_kernel;
using bench::median;

// kOps FMAs in 8 chains, fully unrolled: kOps instructions of straight-line code. kSalt makes
// distinct copies of the same size (their constants differ).
template <int kOps, int kSalt>
__global__ void __launch_bounds__(128) straight_kernel(float* out, float a, float b) {
  float v[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) v[c] = static_cast<float>(threadIdx.x + c + kSalt);
#pragma unroll
  for (int i = 0; i < kOps / 8; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c) v[c] = fmaf(v[c], a, b + static_cast<float>(kSalt));
  }
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) s += v[c];
  if (s == 1234.5f) out[threadIdx.x] = s;  // keeps the chains alive; never true for these inputs
}

using Kernel = void (*)(float*, float, float);

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
  }
  long long delay_cycles = 40000;
  float run(Kernel k, int sms, float* out) {
    delay_kernel<<<1, 1>>>(delay_cycles);
    CHECK(cudaEventRecord(a));
    k<<<sms, 128>>>(out, 0.999f, 0.001f);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000.0f;  // us
  }
};

struct Size {
  int ops;
  Kernel k, other;  // `other`: a different copy, run between to take k's code out of the SM
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 21;
  std::string csv, label = "one CTA of 4 warps a SM";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv = argv[++i];
    } else if (!std::strcmp(argv[i], "--label") && i + 1 < argc) {
      label = argv[++i];
    } else {
      std::fprintf(stderr, "usage: icache_bench [--reps N] [--csv FILE] [--label TEXT]\n");
      return 2;
    }
  }
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, dev));
  float* out = nullptr;
  CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
  const size_t flush_bytes = size_t{256} << 20;
  void* flush = nullptr;
  CHECK(cudaMalloc(&flush, flush_bytes));
  // 256 KB of other code: takes any kernel's code out of the SM's instruction caches.
  const Kernel evict = straight_kernel<16384, 99>;
  const std::vector<Size> sizes = {{256, straight_kernel<256, 0>, straight_kernel<256, 1>},
                                   {1024, straight_kernel<1024, 0>, straight_kernel<1024, 1>},
                                   {2048, straight_kernel<2048, 0>, straight_kernel<2048, 1>},
                                   {4096, straight_kernel<4096, 0>, straight_kernel<4096, 1>},
                                   {8192, straight_kernel<8192, 0>, straight_kernel<8192, 1>}};
  Timer timer;
  for (const Size& s : sizes) {  // module loading
    timer.run(s.k, sms, out);
    timer.run(s.other, sms, out);
  }
  timer.run(evict, sms, out);
  CsvRows rows(csv, "icache_bench", prop.name);
  std::printf("%-8s %10s %10s %10s %14s %14s\n", "ops", "warm_us", "l2_us", "dram_us", "l2_ns_per_op",
              "dram_ns_per_op");
  for (const Size& s : sizes) {
    std::vector<float> warm, l2, dram;
    for (int r = 0; r < reps; ++r) {
      timer.run(evict, sms, out);
      timer.run(s.k, sms, out);
      warm.push_back(timer.run(s.k, sms, out));
      timer.run(evict, sms, out);
      l2.push_back(timer.run(s.k, sms, out));
      timer.run(evict, sms, out);
      CHECK(cudaMemset(flush, r & 0xff, flush_bytes));
      dram.push_back(timer.run(s.k, sms, out));
    }
    const float w = median(warm), l = median(l2), d = median(dram);
    std::printf("%-8d %10.2f %10.2f %10.2f %14.3f %14.3f\n", s.ops, w, l, d, 1000.0f * (l - w) / s.ops,
                1000.0f * (d - w) / s.ops);
    const std::string config = label + ", " + std::to_string(s.ops) + " straight-line FMAs (" +
                               std::to_string(16 * s.ops / 1024) + " KB of code), " + std::to_string(sms) + " CTAs";
    rows.add(config, "launch_us_code_in_sm", w, "us");
    rows.add(config, "launch_us_code_in_l2", l, "us");
    rows.add(config, "launch_us_code_in_dram", d, "us");
  }
  CHECK(cudaFree(flush));
  CHECK(cudaFree(out));
  return 0;
}
