// GPU benchmark (not a test): quantised GEMV (one token) through kernels::linear_cuda on the
// matrix shapes of one DeepSeek-V4.1 decode step, CUDA-event timing after warm-up, median of
// 20 runs, achieved weight-read bandwidth against the device's. Appends rows to the CSV given
// as argv[1] (date,commit,machine,benchmark,configuration,metric,value,unit).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/linear/linear_cuda.h"

using namespace dsflash;
using quant::GgmlType;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: linear_cuda_bench OUT.csv COMMIT\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  struct Shape {
    const char* what;
    GgmlType type;
    int64_t cols, rows;
  };
  const Shape shapes[] = {
      {"expert gate/up 5120->2304", GgmlType::kQ2_K, 5120, 2304},
      {"expert down 2304->5120", GgmlType::kQ3_K, 2304, 5120},
      {"6 experts gate 5120->6x2304", GgmlType::kQ2_K, 5120, 6 * 2304},
      {"attn q_b 1280->32768", GgmlType::kQ4_K, 1280, 32768},
      {"attn wo_b 8192->5120", GgmlType::kQ4_K, 8192, 5120},
      {"head 5120->129280", GgmlType::kQ6_K, 5120, 129280},
      {"shared expert 5120->2304 q8_0", GgmlType::kQ8_0, 5120, 2304},
      {"attn q_a 5120->1280", GgmlType::kQ4_K, 5120, 1280},
      {"attn kv 5120->512", GgmlType::kQ4_K, 5120, 512},
      {"shared expert down 2304->5120", GgmlType::kQ4_K, 2304, 5120},
      {"router 5120->16 bf16", GgmlType::kBF16, 5120, 16},
  };
  std::ofstream csv(argv[1], std::ios::app);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 0.02f);
  cudaStream_t s;
  cudaStreamCreate(&s);
  for (const Shape& sh : shapes) {
    const uint64_t rb = *quant::row_bytes(sh.type, sh.cols);
    std::vector<float> wf(static_cast<size_t>(sh.cols * sh.rows));
    for (float& v : wf) v = nd(rng);
    std::vector<uint8_t> bytes(rb * sh.rows);
    (void)quant::encode_row(sh.type, wf.data(), bytes.data(), sh.cols * sh.rows);
    uint8_t* dw;
    float *dx, *dy;
    cudaMalloc(&dw, bytes.size());
    cudaMalloc(&dx, sh.cols * 4);
    cudaMalloc(&dy, sh.rows * 4);
    cudaMemcpy(dw, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    cudaMemset(dx, 0, sh.cols * 4);
    kernels::Weight w{sh.type, sh.cols, sh.rows, dw, rb};
    const kernels::ExecCtx ctx{kernels::Backend::kCuda, s};
    for (int i = 0; i < 5; ++i) (void)kernels::linear_cuda(ctx, w, dx, 1, dy);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
      cudaEventRecord(a, s);
      (void)kernels::linear_cuda(ctx, w, dx, 1, dy);
      cudaEventRecord(b, s);
      cudaEventSynchronize(b);
      float t;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2] * 1e-3;
    const double gbs = bytes.size() / med / 1e9;
    std::printf("%-32s %-6s %8.1f us  %7.1f GB/s  (%.2f MB of weights)\n", sh.what, quant::traits(sh.type).name, med * 1e6,
                gbs, bytes.size() / 1e6);
    const std::string machine = std::string("\"") + prop.name + " (sm_" + std::to_string(prop.major) +
                                std::to_string(prop.minor) + ")\"";
    const std::string conf = std::string("\"") + sh.what + " " + quant::traits(sh.type).name + " n_tok=1 median of 20\"";
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    csv << date << ',' << argv[2] << ',' << machine << ",linear_cuda_gemv," << conf << ",time," << med * 1e6 << ",us\n";
    csv << date << ',' << argv[2] << ',' << machine << ",linear_cuda_gemv," << conf << ",weight_read_bandwidth," << gbs
        << ",GB/s\n";
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
  }
  return 0;
}
