// The fused routed-expert FFN (linear_experts_ffn_cuda, linear/experts_ffn.cu) against the
// separate launches it replaces (gate and up, moe::swiglu_cuda, the down), bit for bit, at the
// released model's shapes: run after run (its counters must come back to zero), from a CUDA
// graph, with outputs poisoned before each run. Skipped where no GPU is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "tests/kernels/cuda_test_util.h"

namespace dsflash::kernels {
namespace {

using quant::GgmlType;

class ExpertsFfnCuda : public testing::CudaStreamTest {
 protected:
  // E experts of rows x cols, random, in the tile layout on the device.
  Weight tiled_experts(GgmlType type, int64_t rows, int64_t cols, int64_t E, uint32_t seed) {
    const uint64_t rb = *quant::row_bytes(type, cols);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> wf(static_cast<size_t>(rows * cols * E));
    for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(cols));
    std::vector<uint8_t> bytes(rb * rows * E);
    EXPECT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), rows * cols * E).ok());
    uint8_t* gguf = dev(bytes);
    uint8_t* tiles = dev(std::vector<uint8_t>(bytes.size(), 0));
    EXPECT_TRUE(to_tiles_cuda(ctx(), Weight{type, cols, rows * E, gguf, rb}, tiles).ok());
    return Weight{type, cols, rows, tiles, rb, WeightLayout::kTiles16};
  }
  std::vector<float> host(const float* d, int64_t n) {
    std::vector<float> h(static_cast<size_t>(n));
    EXPECT_EQ(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    sync();
    return h;
  }
  void poison(float* d, int64_t n) {
    ASSERT_EQ(cudaMemsetAsync(d, 0xff, n * sizeof(float), stream_), cudaSuccess);  // NaNs
  }
};

TEST_F(ExpertsFfnCuda, MatchesTheSeparateLaunchesBitForBit) {
  const int64_t D = 5120, F = 2304, E = 8;
  const std::vector<int32_t> ids = {7, 0, 3, 3, 5, 1};  // expert 3 twice
  const int n = static_cast<int>(ids.size());
  const float limit = 1.5f;  // clamps a good share of the gate and up values
  for (const GgmlType down_type : {GgmlType::kQ3_K, GgmlType::kQ2_K}) {
    SCOPED_TRACE(quant::traits(down_type).name);
    const Weight gate = tiled_experts(GgmlType::kQ2_K, F, D, E, 11);
    const Weight up = tiled_experts(GgmlType::kQ2_K, F, D, E, 12);
    const Weight down = tiled_experts(down_type, D, F, E, 13 + static_cast<uint32_t>(down_type));
    const int64_t gb = F * static_cast<int64_t>(gate.row_bytes), db = D * static_cast<int64_t>(down.row_bytes);
    ASSERT_TRUE(linear_experts_ffn_supported(gate, gb, up, gb, down, db, n));
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(D), w(n);
    for (float& v : x) v = quant::round_bf16(nd(rng));
    for (float& v : w) v = std::fabs(nd(rng));
    const float* dx = dev(x);
    const float* dw = dev(w);
    const int32_t* di = dev(ids);
    float* a = dev(std::vector<float>(n * F));
    float* b = dev(std::vector<float>(n * F));
    float* y = dev(std::vector<float>(n * D));
    int32_t* counters = dev(std::vector<int32_t>(kExpertsFfnCounters, 0));
    // The separate launches.
    ASSERT_TRUE(linear_experts_gate_up_cuda(ctx(), gate, gb, up, gb, di, n, dx, a, b, F).ok());
    ASSERT_TRUE(moe::swiglu_cuda(ctx(), a, b, n, F, limit, dw).ok());
    ASSERT_TRUE(linear_experts_cuda(ctx(), down, db, di, n, a, F, y, D).ok());
    const std::vector<float> want_a = host(a, n * F), want_y = host(y, n * D);
    int finite = 0;
    for (float v : want_y) finite += std::isfinite(v) && v != 0.0f;
    ASSERT_GT(finite, n * D * 9 / 10);
    const auto check = [&](const std::string& what) {
      const std::vector<float> got_a = host(a, n * F), got_y = host(y, n * D);
      EXPECT_EQ(std::memcmp(got_a.data(), want_a.data(), got_a.size() * 4), 0) << what << ": SwiGLU outputs";
      EXPECT_EQ(std::memcmp(got_y.data(), want_y.data(), got_y.size() * 4), 0) << what << ": down products";
      EXPECT_EQ(host(reinterpret_cast<const float*>(counters), kExpertsFfnCounters),
                std::vector<float>(kExpertsFfnCounters, 0.0f))
          << what << ": counters left zero";
    };
    for (int run = 0; run < 3; ++run) {
      poison(a, n * F), poison(b, n * F), poison(y, n * D);
      ASSERT_TRUE(linear_experts_ffn_cuda(ctx(), gate, gb, up, gb, down, db, di, n, dx, limit, dw, a, b, y, D, counters)
                      .ok());
      check("run " + std::to_string(run));
    }
    // Captured once, replayed: the launch's counters come back to zero between replays.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status captured =
        linear_experts_ffn_cuda(ctx(), gate, gb, up, gb, down, db, di, n, dx, limit, dw, a, b, y, D, counters);
    ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
    ASSERT_TRUE(captured.ok()) << captured;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 3; ++replay) {
      poison(a, n * F), poison(y, n * D);
      ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
      check("replay " + std::to_string(replay));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST_F(ExpertsFfnCuda, RefusesWhatItIsNotBuiltFor) {
  const int64_t D = 5120, F = 2304;
  const Weight gate = tiled_experts(GgmlType::kQ2_K, F, D, 2, 21);
  const Weight down = tiled_experts(GgmlType::kQ3_K, D, F, 2, 22);
  const int64_t gb = F * static_cast<int64_t>(gate.row_bytes), db = D * static_cast<int64_t>(down.row_bytes);
  EXPECT_TRUE(linear_experts_ffn_supported(gate, gb, gate, gb, down, db, 6));
  EXPECT_FALSE(linear_experts_ffn_supported(gate, gb, gate, gb, down, db, kMaxExpertsFfn + 1));
  Weight gguf = gate;
  gguf.layout = WeightLayout::kGguf;
  EXPECT_FALSE(linear_experts_ffn_supported(gguf, gb, gguf, gb, down, db, 6));
  // Small shapes take other row groups than the kernel is compiled for.
  const Weight small_gate = tiled_experts(GgmlType::kQ2_K, 256, 256, 2, 23);
  const Weight small_down = tiled_experts(GgmlType::kQ3_K, 256, 256, 2, 24);
  const int64_t sg = 256 * static_cast<int64_t>(small_gate.row_bytes), sd = 256 * static_cast<int64_t>(small_down.row_bytes);
  EXPECT_FALSE(linear_experts_ffn_supported(small_gate, sg, small_gate, sg, small_down, sd, 1));
  const Status s = linear_experts_ffn_cuda(ctx(), gguf, gb, gguf, gb, down, db, nullptr, 6, nullptr, 0.0f, nullptr,
                                           nullptr, nullptr, nullptr, D, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("fused"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace dsflash::kernels
