// CUDA linear vs the CPU reference: fresh random weights of every supported type, odd row
// counts and 1..5 tokens, output poisoned before the run; fp32 outputs agree to summation-
// order rounding, bf16 outputs to one bf16 ulp. Skipped where no GPU is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/tiles.h"

namespace dsflash::kernels {
namespace {

using quant::GgmlType;

using testing::to_device;

class LinearCuda : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(LinearCuda, MatchesCpu) {
  const GgmlType type = GetParam();
  std::mt19937 rng(77 + static_cast<int>(type));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t K : {256, 2048, 4096}) {  // 2048, 4096: Q4_K / Q6_K columns split over warps, the GEMM's over CTAs
    for (int64_t N : {1, 17, 257, 1031}) {  // below and above the block-per-row threshold (1024 rows)
      for (int64_t T : {1, 5, 21, 70}) {  // several passes of kTok tokens; 21, 70: the prefill GEMM (1, 2 token tiles)
        std::vector<float> wf(static_cast<size_t>(K * N)), x(static_cast<size_t>(K * T));
        for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
        for (float& v : x) v = quant::round_bf16(nd(rng));
        const uint64_t rb = *quant::row_bytes(type, K);
        std::vector<uint8_t> bytes(rb * N);
        ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N).ok());
        Weight w{type, K, N, bytes.data(), rb};
        std::vector<float> ref(T * N), ref16(T * N);
        linear(w, x.data(), T, ref.data(), OutRound::kF32);
        linear(w, x.data(), T, ref16.data(), OutRound::kBf16);
        uint8_t* dw = to_device(bytes);
        float* dx = to_device(x);
        float* dy = to_device(std::vector<float>(T * N, std::nanf("")));
        Weight wd = w;
        wd.data = dw;
        cudaStream_t s;
        ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
        for (OutRound r : {OutRound::kF32, OutRound::kBf16}) {
          ASSERT_TRUE(linear_cuda(ExecCtx{Backend::kCuda, s}, wd, dx, T, dy, r).ok());
          std::vector<float> got(T * N);
          ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
          for (int64_t i = 0; i < T * N; ++i) {
            if (r == OutRound::kF32) {
              EXPECT_NEAR(got[i], ref[i], 1e-5 * std::sqrt(static_cast<double>(K)) * (1 + std::fabs(ref[i])))
                  << quant::traits(type).name << " K " << K << " N " << N << " i " << i;
            } else {
              EXPECT_LE(std::fabs(got[i] - ref16[i]), std::ldexp(std::fabs(ref16[i]), -7) + 1e-6) << i;
            }
          }
        }
        cudaStreamDestroy(s);
        cudaFree(dw);
        cudaFree(dx);
        cudaFree(dy);
      }
    }
  }
}

// A batch of single-token products (the routed experts of a decode step) in one launch: each
// output as its own linear on the CPU, to fp32 rounding.
TEST_P(LinearCuda, BatchMatchesCpu) {
  const GgmlType type = GetParam();
  std::mt19937 rng(5 + static_cast<int>(type));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t K = 2048, N = 37;
  const int n = 6;
  const uint64_t rb = *quant::row_bytes(type, K);
  std::vector<uint8_t> bytes(rb * N * n);
  std::vector<float> wf(static_cast<size_t>(K * N)), x(static_cast<size_t>(K * n));
  for (int e = 0; e < n; ++e) {
    for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
    ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data() + e * rb * N, K * N).ok());
  }
  for (float& v : x) v = quant::round_bf16(nd(rng));
  uint8_t* dw = to_device(bytes);
  float* dx = to_device(x);
  float* dy = to_device(std::vector<float>(N * n, std::nanf("")));
  std::vector<LinearJob> jobs;
  for (int e = 0; e < n; ++e) jobs.push_back({Weight{type, K, N, dw + e * rb * N, rb}, dx + e * K, dy + e * N});
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_TRUE(linear_batch_cuda(ExecCtx{Backend::kCuda, s}, jobs.data(), n, OutRound::kF32).ok());
  std::vector<float> got(N * n);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int e = 0; e < n; ++e) {
    std::vector<float> ref(N);
    linear(Weight{type, K, N, bytes.data() + e * rb * N, rb}, x.data() + e * K, 1, ref.data(), OutRound::kF32);
    for (int64_t i = 0; i < N; ++i) {
      EXPECT_NEAR(got[e * N + i], ref[i], 1e-5 * std::sqrt(static_cast<double>(K)) * (1 + std::fabs(ref[i])))
          << quant::traits(type).name << " product " << e << " row " << i;
    }
  }
  cudaStreamDestroy(s);
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dy);
}

// Experts picked on the device: product k = expert ids[k] (a slice of one merged tensor) on x_k.
TEST_P(LinearCuda, ExpertsPickedOnTheDeviceMatchCpu) {
  const GgmlType type = GetParam();
  const int64_t K = 4096, N = 64, E = 5;  // Q4_K / Q6_K: columns split over warps
  const uint64_t rb = *quant::row_bytes(type, K);
  std::vector<uint8_t> bytes(rb * N * E);
  if (!linear_experts_supported(Weight{type, K, N, reinterpret_cast<const uint8_t*>(uintptr_t{256}), rb},
                                static_cast<int64_t>(rb * N))) {
    GTEST_SKIP() << "no decode GEMV for " << quant::traits(type).name;
  }
  std::mt19937 rng(9 + static_cast<int>(type));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(static_cast<size_t>(K * N * E)), x(static_cast<size_t>(K * 3));
  for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
  for (float& v : x) v = quant::round_bf16(nd(rng));
  ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N * E).ok());
  const std::vector<int32_t> ids = {4, 0, 2};
  uint8_t* dw = to_device(bytes);
  float* dx = to_device(x);
  int32_t* di = to_device(ids);
  float* dy = to_device(std::vector<float>(N * 3, std::nanf("")));
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_TRUE(linear_experts_cuda(ExecCtx{Backend::kCuda, s}, Weight{type, K, N, dw, rb}, static_cast<int64_t>(rb * N), di,
                                  3, dx, K, dy, N, OutRound::kF32).ok());
  std::vector<float> got(N * 3);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int k = 0; k < 3; ++k) {
    std::vector<float> ref(N);
    linear(Weight{type, K, N, bytes.data() + ids[k] * rb * N, rb}, x.data() + k * K, 1, ref.data(), OutRound::kF32);
    for (int64_t i = 0; i < N; ++i) {
      EXPECT_NEAR(got[k * N + i], ref[i], 1e-5 * std::sqrt(static_cast<double>(K)) * (1 + std::fabs(ref[i])))
          << quant::traits(type).name << " product " << k << " row " << i;
    }
  }
  cudaStreamDestroy(s);
  for (void* p : std::initializer_list<void*>{dw, dx, di, dy}) cudaFree(p);
}

// The oracle of quantize_act_q8_cuda: per run of 32, d = max|x| / 127, q = rint(x / d).
void quantize_q8_ref(const float* x, int64_t cols, int8_t* q, float* d) {
  for (int64_t r = 0; r < cols / 32; ++r) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[r * 32 + i]));
    d[r] = amax / 127.0f;
    for (int i = 0; i < 32; ++i) {
      q[r * 32 + i] = static_cast<int8_t>(d[r] > 0.0f ? std::nearbyint(x[r * 32 + i] / d[r]) : 0.0f);
    }
  }
}

// Experts on 8-bit activations (LoadOptions::expert_act_q8): the quantisation equals its
// oracle bit for bit, and the products stay within the 8-bit rounding of x of the CPU's fp32
// products (NMSE; that of x alone, ~2e-5 for normal x). Shapes cover 1, 2 and 4
// rows per warp with a partial last warp, one x for all products and one x each.
TEST_P(LinearCuda, ExpertsOnEightBitActivationsStayNearTheCpu) {
  const GgmlType type = GetParam();
  if (type != GgmlType::kQ2_K && type != GgmlType::kQ3_K) GTEST_SKIP() << "Q2_K and Q3_K only";
  struct Shape {
    int64_t K, N;
    int n;
    bool one_x;
  };
  for (const Shape sh : {Shape{2304, 257, 3, true}, Shape{2304, 4100, 4, false}, Shape{5120, 31, 1, false},
                         Shape{5120, 1537, 4, true}}) {
    const int64_t K = sh.K, N = sh.N, E = 3;
    const int n = sh.n;
    const uint64_t rb = *quant::row_bytes(type, K);
    std::mt19937 rng(31 + static_cast<int>(type) + static_cast<int>(N));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> wf(static_cast<size_t>(K * N * E)), x(static_cast<size_t>(K * n));
    for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
    for (float& v : x) v = quant::round_bf16(nd(rng));
    std::vector<uint8_t> bytes(rb * N * E);
    ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N * E).ok());
    ASSERT_TRUE(linear_experts_q8_supported(Weight{type, K, N, reinterpret_cast<const uint8_t*>(uintptr_t{256}), rb},
                                            static_cast<int64_t>(rb * N)));
    const std::vector<int32_t> ids = {2, 0, 2, 1};
    uint8_t* dw = to_device(bytes);
    float* dx = to_device(x);
    int32_t* di = to_device(ids);
    float* dy = to_device(std::vector<float>(N * n, std::nanf("")));
    const int nx = sh.one_x ? 1 : n;
    int8_t* qd = to_device(std::vector<int8_t>(K * nx, 99));
    float* dd = to_device(std::vector<float>(K * nx / 32, std::nanf("")));
    float* sd = to_device(std::vector<float>(K * nx / 16, std::nanf("")));
    const ActQ8 xq{qd, dd, sd};
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    const ExecCtx ctx{Backend::kCuda, s};
    ASSERT_TRUE(quantize_act_q8_cuda(ctx, dx, K, nx, K, xq).ok());
    ASSERT_TRUE(linear_experts_q8_cuda(ctx, Weight{type, K, N, dw, rb}, static_cast<int64_t>(rb * N), di, n, xq,
                                       sh.one_x, dy, N, OutRound::kF32)
                    .ok());
    std::vector<float> got(N * n), d(K * nx / 32), s16(K * nx / 16);
    std::vector<int8_t> q(K * nx);
    ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(q.data(), qd, q.size(), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(s16.data(), sd, s16.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<int8_t> q_ref(K * nx);
    std::vector<float> d_ref(K * nx / 32);
    quantize_q8_ref(x.data(), K * nx, q_ref.data(), d_ref.data());
    EXPECT_EQ(q, q_ref) << "8-bit codes";
    EXPECT_EQ(d, d_ref) << "run scales";
    for (size_t i = 0; i < s16.size(); ++i) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += q_ref[i * 16 + j];
      ASSERT_EQ(s16[i], d_ref[i / 2] * static_cast<float>(sum)) << "sum of run " << i;
    }
    for (int k = 0; k < n; ++k) {
      std::vector<float> ref(N);
      linear(Weight{type, K, N, bytes.data() + ids[k] * rb * N, rb}, x.data() + (sh.one_x ? 0 : k * K), 1, ref.data(),
             OutRound::kF32);
      double err = 0, norm = 0;
      for (int64_t i = 0; i < N; ++i) {
        ASSERT_TRUE(std::isfinite(got[k * N + i])) << "product " << k << " row " << i;
        err += (got[k * N + i] - ref[i]) * (got[k * N + i] - ref[i]);
        norm += static_cast<double>(ref[i]) * ref[i];
      }
      std::printf("%s K=%lld N=%lld product %d: NMSE %.2e vs the CPU's fp32 product\n", quant::traits(type).name,
                  static_cast<long long>(K), static_cast<long long>(N), k, err / norm);
      EXPECT_LT(err / norm, 1e-4) << quant::traits(type).name << " K=" << K << " N=" << N << " product " << k;
    }
    cudaStreamDestroy(s);
    for (void* p : std::initializer_list<void*>{dw, dx, di, dy, qd, dd, sd}) cudaFree(p);
  }
}

// The Q4_K and Q6_K decode GEMVs on the integer tensor cores (gemv_mma.cu) split x into exact radix-128
// digits, so they keep fp32 accuracy where 8-bit x would not (NMSE ~1e-5; here ~2e-13, up to
// 3e-10 on a lone row whose sum cancels): x spanning six
// decades, three products in one launch (two sharing an x), row counts that end mid-group,
// column counts of 1, 5, 20 and 32 blocks (1, 4, 16 and 16 warps per row group; 32 blocks are the
// released model's largest input, near the digits' shared-memory limit). A NaN in x reaches
// every row, as on the CPU.
TEST_P(LinearCuda, TensorCoreGemvKeepsFp32Accuracy) {
  const GgmlType type = GetParam();
  if (type != GgmlType::kQ4_K && type != GgmlType::kQ6_K) GTEST_SKIP() << "Q4_K and Q6_K only";
  for (const int64_t K : {256, 1280, 5120, 8192}) {
    for (const int64_t N : {1, 17, 1031}) {
      std::mt19937 rng(101 + static_cast<int>(K + N));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::uniform_real_distribution<float> decade(-3.0f, 3.0f);
      const int n = 3;
      const uint64_t rb = *quant::row_bytes(type, K);
      std::vector<float> wf(static_cast<size_t>(K * N * n)), x(static_cast<size_t>(K * 2));
      for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
      for (float& v : x) v = quant::round_bf16(nd(rng) * std::pow(10.0f, decade(rng)));
      std::vector<uint8_t> bytes(rb * N * n);
      ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N * n).ok());
      uint8_t* dw = to_device(bytes);
      float* dx = to_device(x);
      float* dy = to_device(std::vector<float>(N * n, std::nanf("")));
      const int xs[n] = {0, 1, 0};  // products 0 and 2 share x 0
      std::vector<LinearJob> jobs;
      for (int k = 0; k < n; ++k) jobs.push_back({Weight{type, K, N, dw + k * rb * N, rb}, dx + xs[k] * K, dy + k * N});
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      ASSERT_TRUE(linear_batch_mma_cuda(ExecCtx{Backend::kCuda, s}, jobs.data(), n, OutRound::kF32).ok());
      std::vector<float> got(N * n);
      ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (int k = 0; k < n; ++k) {
        std::vector<float> ref(N);
        linear(Weight{type, K, N, bytes.data() + k * rb * N, rb}, x.data() + xs[k] * K, 1, ref.data(), OutRound::kF32);
        double err = 0, norm = 0;
        for (int64_t i = 0; i < N; ++i) {
          err += (got[k * N + i] - ref[i]) * (got[k * N + i] - ref[i]);
          norm += static_cast<double>(ref[i]) * ref[i];
        }
        EXPECT_LT(err / norm, 1e-8) << "K=" << K << " N=" << N << " product " << k;
        if (K == 5120 && N == 1031) std::printf("K=%lld N=%lld product %d: NMSE %.2e vs the CPU\n", static_cast<long long>(K),
                                                static_cast<long long>(N), k, err / norm);
      }
      // A NaN in x 1's last block: product 1 is NaN on every row, the others stay finite.
      const float nan = std::nanf("");
      ASSERT_EQ(cudaMemcpy(dx + 2 * K - 3, &nan, 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_TRUE(linear_batch_mma_cuda(ExecCtx{Backend::kCuda, s}, jobs.data(), n, OutRound::kF32).ok());
      ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (int64_t i = 0; i < N; ++i) {
        EXPECT_TRUE(std::isnan(got[N + i])) << "row " << i;
        EXPECT_TRUE(std::isfinite(got[i]) && std::isfinite(got[2 * N + i])) << "row " << i;
      }
      cudaStreamDestroy(s);
      for (void* p : std::initializer_list<void*>{dw, dx, dy}) cudaFree(p);
    }
  }
}

// The prefill GEMM on the integer tensor cores (Q4_K, Q2_K, Q3_K, Q6_K): fp32 accuracy against the
// CPU (NMSE < 1e-8) at token counts that fill 16-token tiles partly (5, 16, 17, 33, 100) and over
// the split's 1,024-token chunks (1,100), rows that fill 128-row tiles partly, inputs spread
// over six decades; a NaN in one token's input makes that token's outputs NaN and no other's.
TEST_P(LinearCuda, TensorCoreGemmKeepsFp32Accuracy) {
  const GgmlType type = GetParam();
  if (type != GgmlType::kQ4_K && type != GgmlType::kQ2_K && type != GgmlType::kQ3_K && type != GgmlType::kQ6_K) {
    GTEST_SKIP() << "Q4_K, Q2_K, Q3_K and Q6_K only";
  }
  struct Shape {
    int64_t K, N, T;
  };
  for (const Shape sh : {Shape{256, 17, 16}, Shape{2304, 130, 5}, Shape{2304, 130, 17}, Shape{5120, 1031, 33},
                         Shape{1280, 257, 100}, Shape{256, 17, 1100}}) {
    const int64_t K = sh.K, N = sh.N, T = sh.T;
    std::mt19937 rng(303 + static_cast<int>(K + N + T));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> decade(-3.0f, 3.0f);
    const uint64_t rb = *quant::row_bytes(type, K);
    std::vector<float> wf(static_cast<size_t>(K * N)), x(static_cast<size_t>(K * T));
    for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
    for (float& v : x) v = quant::round_bf16(nd(rng) * std::pow(10.0f, decade(rng)));
    std::vector<uint8_t> bytes(rb * N);
    ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N).ok());
    uint8_t* dw = to_device(bytes);
    float* dx = to_device(x);
    float* dy = to_device(std::vector<float>(N * T, std::nanf("")));
    const Weight wd{type, K, N, dw, rb};
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    const ExecCtx ctx{Backend::kCuda, s};
    const auto run = [&] {
      std::vector<float> got(N * T);
      EXPECT_TRUE(linear_gemm_mma_cuda(ctx, wd, dx, T, dy, OutRound::kF32).ok());
      EXPECT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      return got;
    };
    std::vector<float> got = run(), ref(N * T);
    linear(Weight{type, K, N, bytes.data(), rb}, x.data(), T, ref.data(), OutRound::kF32);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < N * T; ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " not written";
      err += (got[i] - ref[i]) * (got[i] - ref[i]);
      norm += static_cast<double>(ref[i]) * ref[i];
    }
    EXPECT_LT(err / norm, 1e-8) << quant::traits(type).name << " K=" << K << " N=" << N << " T=" << T;
    std::printf("%s K=%lld N=%lld T=%lld: NMSE %.2e vs the CPU\n", quant::traits(type).name, static_cast<long long>(K),
                static_cast<long long>(N), static_cast<long long>(T), err / norm);
    // A NaN in one token's input: its outputs are NaN, every other token's stay finite.
    const int64_t bad = T / 2;
    const float nan = std::nanf("");
    ASSERT_EQ(cudaMemcpy(dx + bad * K + K / 2, &nan, 4, cudaMemcpyHostToDevice), cudaSuccess);
    got = run();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < N; ++i) {
        if (t == bad) {
          ASSERT_TRUE(std::isnan(got[t * N + i])) << "token " << t << " row " << i;
        } else {
          ASSERT_TRUE(std::isfinite(got[t * N + i])) << "token " << t << " row " << i;
        }
      }
    }
    cudaStreamDestroy(s);
    for (void* p : std::initializer_list<void*>{dw, dx, dy}) cudaFree(p);
  }
}

// Types without a tensor-core GEMM, or an input the GEMM cannot read, are refused with the
// reason (linear_cuda then takes the SIMT GEMM).
TEST_P(LinearCuda, TensorCoreGemmRefusesWhatItCannotTake) {
  const GgmlType type = GetParam();
  const int64_t K = 256, N = 4, T = 16;
  const uint64_t rb = *quant::row_bytes(type, K);
  uint8_t* dw = to_device(std::vector<uint8_t>(rb * N + 16, 0));
  float* dx = to_device(std::vector<float>(K * T + 4, 0.0f));
  float* dy = to_device(std::vector<float>(N * T, 0.0f));
  const ExecCtx ctx{Backend::kCuda, nullptr};
  const bool has = type == GgmlType::kQ4_K || type == GgmlType::kQ2_K || type == GgmlType::kQ3_K || type == GgmlType::kQ6_K;
  const Status aligned = linear_gemm_mma_cuda(ctx, Weight{type, K, N, dw, rb}, dx, T, dy);
  EXPECT_EQ(aligned.ok(), has) << aligned;
  const Status odd_x = linear_gemm_mma_cuda(ctx, Weight{type, K, N, dw, rb}, dx + 1, T, dy);  // x 4-byte aligned only
  EXPECT_EQ(odd_x.code(), absl::StatusCode::kUnimplemented) << odd_x;
  EXPECT_NE(odd_x.message().find("tensor-core GEMM"), std::string::npos) << odd_x;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (void* p : std::initializer_list<void*>{dw, dx, dy}) cudaFree(p);
}

// An input wider than the tensor-core GEMV's shared memory holds as digits (34 blocks) is
// refused with the reason, and the ordinary entry point takes it on the fp32 kernels.
TEST_P(LinearCuda, TensorCoreGemvRefusesTooWideInput) {
  const GgmlType type = GetParam();
  if (type != GgmlType::kQ4_K && type != GgmlType::kQ6_K) GTEST_SKIP() << "Q4_K and Q6_K only";
  const int64_t K = 35 * 256, N = 64;
  const uint64_t rb = *quant::row_bytes(type, K);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(static_cast<size_t>(K * N)), x(static_cast<size_t>(K));
  for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
  for (float& v : x) v = quant::round_bf16(nd(rng));
  std::vector<uint8_t> bytes(rb * N);
  ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N).ok());
  uint8_t* dw = to_device(bytes);
  float* dx = to_device(x);
  float* dy = to_device(std::vector<float>(N, std::nanf("")));
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const LinearJob job{Weight{type, K, N, dw, rb}, dx, dy};
  const Status st = linear_batch_mma_cuda(ExecCtx{Backend::kCuda, s}, &job, 1, OutRound::kF32);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("8960 columns"), std::string_view::npos) << st;
  ASSERT_TRUE(linear_batch_cuda(ExecCtx{Backend::kCuda, s}, &job, 1, OutRound::kF32).ok());
  std::vector<float> got(N), ref(N);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, N * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  linear(Weight{type, K, N, bytes.data(), rb}, x.data(), 1, ref.data(), OutRound::kF32);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < N; ++i) err += (got[i] - ref[i]) * (got[i] - ref[i]), norm += static_cast<double>(ref[i]) * ref[i];
  EXPECT_LT(err / norm, 1e-8);
  cudaStreamDestroy(s);
  for (void* p : std::initializer_list<void*>{dw, dx, dy}) cudaFree(p);
}

// The routed experts' Q2_K / Q3_K GEMVs on the integer tensor cores: experts picked on the
// device, one x for all products (gate, up) and one x each (down), x over six decades; fp32
// accuracy as above.
TEST_P(LinearCuda, TensorCoreExpertGemvKeepsFp32Accuracy) {
  const GgmlType type = GetParam();
  if (type != GgmlType::kQ2_K && type != GgmlType::kQ3_K) GTEST_SKIP() << "Q2_K and Q3_K only";
  // The released shapes among them: gate/up (K = 5120, N = 2304) and down (K = 2304, N = 5120,
  // several tiles a CTA).
  const std::pair<int64_t, int64_t> shapes[] = {{256, 17},   {256, 2304},  {1280, 17}, {1280, 2304}, {2304, 17},
                                                 {2304, 2304}, {2304, 5120}, {5120, 17}, {5120, 2304}};
  for (const auto& [K, N] : shapes) {
    for (const bool one_x : {true, false}) {
      const int64_t E = 3;
      const int n = 4;
      const uint64_t rb = *quant::row_bytes(type, K);
      std::mt19937 rng(211 + static_cast<int>(K + N) + one_x);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::uniform_real_distribution<float> decade(-3.0f, 3.0f);
      std::vector<float> wf(static_cast<size_t>(K * N * E)), x(static_cast<size_t>(K * n));
      for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
      for (float& v : x) v = quant::round_bf16(nd(rng) * std::pow(10.0f, decade(rng)));
      std::vector<uint8_t> bytes(rb * N * E);
      ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N * E).ok());
      const std::vector<int32_t> ids = {2, 0, 2, 1};
      uint8_t* dw = to_device(bytes);
      float* dx = to_device(x);
      int32_t* di = to_device(ids);
      float* dy = to_device(std::vector<float>(N * n, std::nanf("")));
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      ASSERT_TRUE(linear_experts_mma_cuda(ExecCtx{Backend::kCuda, s}, Weight{type, K, N, dw, rb}, static_cast<int64_t>(rb * N),
                                          di, n, dx, one_x ? 0 : K, dy, N, OutRound::kF32)
                      .ok());
      std::vector<float> got(N * n);
      ASSERT_EQ(cudaMemcpyAsync(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (int k = 0; k < n; ++k) {
        std::vector<float> ref(N);
        linear(Weight{type, K, N, bytes.data() + ids[k] * rb * N, rb}, x.data() + (one_x ? 0 : k * K), 1, ref.data(),
               OutRound::kF32);
        double err = 0, norm = 0;
        for (int64_t i = 0; i < N; ++i) {
          err += (got[k * N + i] - ref[i]) * (got[k * N + i] - ref[i]);
          norm += static_cast<double>(ref[i]) * ref[i];
        }
        EXPECT_LT(err / norm, 1e-8) << "K=" << K << " N=" << N << " one_x " << one_x << " product " << k;
        if (K == 5120 && N == 2304 && k == 0) {
          std::printf("K=%lld N=%lld one_x %d: NMSE %.2e vs the CPU\n", static_cast<long long>(K),
                      static_cast<long long>(N), one_x, err / norm);
        }
      }
      cudaStreamDestroy(s);
      for (void* p : std::initializer_list<void*>{dw, dx, di, dy}) cudaFree(p);
    }
  }
}

// Gate and up of the routed experts on one x (the decode MoE): one launch on the tensor cores
// for Q2_K (the released rung type), two of the fp32 kernels otherwise; each against the CPU.
TEST_P(LinearCuda, ExpertGateAndUpMatchCpu) {
  const GgmlType type = GetParam();
  if (type != GgmlType::kQ2_K && type != GgmlType::kQ4_K) GTEST_SKIP() << "Q2_K (tensor cores) and Q4_K (fp32 kernels)";
  const int64_t K = 5120, N = 2304, E = 8;
  const int n = 6;
  const uint64_t rb = *quant::row_bytes(type, K);
  std::mt19937 rng(307 + static_cast<int>(type));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(static_cast<size_t>(K * N * E)), x(static_cast<size_t>(K));
  std::vector<uint8_t> gate(rb * N * E), up(rb * N * E);
  for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
  ASSERT_TRUE(quant::encode_row(type, wf.data(), gate.data(), K * N * E).ok());
  for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
  ASSERT_TRUE(quant::encode_row(type, wf.data(), up.data(), K * N * E).ok());
  for (float& v : x) v = quant::round_bf16(nd(rng));
  const std::vector<int32_t> ids = {7, 0, 3, 3, 5, 1};
  uint8_t* dg = to_device(gate);
  uint8_t* du = to_device(up);
  float* dx = to_device(x);
  int32_t* di = to_device(ids);
  float* dyg = to_device(std::vector<float>(N * n, std::nanf("")));
  float* dyu = to_device(std::vector<float>(N * n, std::nanf("")));
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const int64_t eb = static_cast<int64_t>(rb * N);
  ASSERT_TRUE(linear_experts_gate_up_cuda(ExecCtx{Backend::kCuda, s}, Weight{type, K, N, dg, rb}, eb, Weight{type, K, N, du, rb},
                                          eb, di, n, dx, dyg, dyu, N, OutRound::kF32)
                  .ok());
  std::vector<float> got_g(N * n), got_u(N * n);
  ASSERT_EQ(cudaMemcpyAsync(got_g.data(), dyg, got_g.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(got_u.data(), dyu, got_u.size() * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int k = 0; k < n; ++k) {
    for (const bool is_up : {false, true}) {
      std::vector<float> ref(N);
      linear(Weight{type, K, N, (is_up ? up : gate).data() + ids[k] * eb, rb}, x.data(), 1, ref.data(), OutRound::kF32);
      const std::vector<float>& got = is_up ? got_u : got_g;
      for (int64_t i = 0; i < N; ++i) {
        ASSERT_NEAR(got[k * N + i], ref[i], 1e-5 * std::sqrt(static_cast<double>(K)) * (1 + std::fabs(ref[i])))
            << (is_up ? "up" : "gate") << " product " << k << " row " << i;
      }
    }
  }
  cudaStreamDestroy(s);
  for (void* p : std::initializer_list<void*>{dg, du, dx, di, dyg, dyu}) cudaFree(p);
}

// The tile layout (linear/tiles.h): the device repack equals the CPU's byte for byte, and every
// linear on the tiles gives bit for bit what it gives on the GGUF rows: the expert GEMVs (one x,
// x per product, gate and up in one launch; Q2_K, Q3_K), the one-token GEMV of linear_cuda
// (Q6_K, the head's) and the GEMM at 1 to 40 tokens. The readers that cannot take tiles refuse
// them, naming them.
TEST_P(LinearCuda, TileLayoutGivesTheGgufProductsBitForBit) {
  const GgmlType type = GetParam();
  if (!linear_tiles_apply(Weight{type, 256, 16, nullptr, 0})) GTEST_SKIP() << "no tile layout for this type";
  const bool experts = tiles_apply(Weight{type, 256, 16, nullptr, 0});
  const std::pair<int64_t, int64_t> shapes[] = {{256, 16}, {5120, 2304}, {2304, 5120}, {1280, 48}};
  for (const auto& [K, N] : shapes) {
    const int64_t E = 3;
    const int n = 4;
    const uint64_t rb = *quant::row_bytes(type, K);
    const int64_t eb = static_cast<int64_t>(rb * N);
    std::mt19937 rng(401 + static_cast<int>(K + N));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> wf(static_cast<size_t>(K * N * E)), x(static_cast<size_t>(K * 40));
    for (float& v : wf) v = nd(rng) / std::sqrt(static_cast<float>(K));
    for (float& v : x) v = quant::round_bf16(nd(rng));
    std::vector<uint8_t> bytes(rb * N * E), want(bytes.size()), got(bytes.size());
    ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N * E).ok());
    tiles::repack(static_cast<int>(quant::traits(type).block_bytes), N * E, K / 256, bytes.data(), want.data());
    uint8_t* dw = to_device(bytes);
    uint8_t* dt = to_device(std::vector<uint8_t>(bytes.size(), 0));
    float* dx = to_device(x);
    const std::vector<int32_t> ids = {2, 0, 2, 1};
    int32_t* di = to_device(ids);
    float* dy = to_device(std::vector<float>(N * 40, 0.0f));
    float* dz = to_device(std::vector<float>(N * 40, 0.0f));
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    const ExecCtx ctx{Backend::kCuda, s};
    const Weight gguf{type, K, N * E, dw, rb};
    ASSERT_TRUE(linear_tiles_apply(gguf));
    ASSERT_TRUE(to_tiles_cuda(ctx, gguf, dt).ok());
    ASSERT_EQ(cudaMemcpyAsync(got.data(), dt, got.size(), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << "K=" << K << " N=" << N;
    Weight tiled{type, K, N, dt, rb, WeightLayout::kTiles16};
    const Weight plain{type, K, N, dw, rb};
    const auto same = [&](int64_t count, const char* what) {
      std::vector<float> a(count), b(count);
      ASSERT_EQ(cudaMemcpyAsync(a.data(), dy, count * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(b.data(), dz, count * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), count * 4), 0) << what << " K=" << K << " N=" << N;
      EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); })) << what;
    };
    if (experts) {
      for (const bool one_x : {true, false}) {
        ASSERT_TRUE(linear_experts_mma_cuda(ctx, plain, eb, di, n, dx, one_x ? 0 : K, dy, N, OutRound::kF32).ok());
        ASSERT_TRUE(linear_experts_cuda(ctx, tiled, eb, di, n, dx, one_x ? 0 : K, dz, N, OutRound::kF32).ok());
        same(N * n, one_x ? "experts, one x" : "experts, an x each");
      }
      // Gate and up (here the same weight twice) in one launch.
      ASSERT_TRUE(linear_experts_gate_up_cuda(ctx, plain, eb, plain, eb, di, n, dx, dy, dy + N * n, N).ok());
      ASSERT_TRUE(linear_experts_gate_up_cuda(ctx, tiled, eb, tiled, eb, di, n, dx, dz, dz + N * n, N).ok());
      same(2 * N * n, "gate and up");
    } else {
      const Status ex = linear_experts_cuda(ctx, tiled, eb, di, n, dx, 0, dz, N, OutRound::kF32);
      EXPECT_EQ(ex.code(), absl::StatusCode::kUnimplemented) << ex;
      EXPECT_NE(ex.message().find("tiles"), std::string_view::npos) << ex;
      // One token through linear_cuda: the tensor-core GEMV on either order, over all E x N rows.
      ASSERT_TRUE(linear_cuda(ctx, gguf, dx, 1, dy, OutRound::kF32).ok());
      ASSERT_TRUE(linear_cuda(ctx, Weight{type, K, N * E, dt, rb, WeightLayout::kTiles16}, dx, 1, dz, OutRound::kF32).ok());
      same(N * E, "one-token GEMV");
    }
    for (const int64_t T : {1, 3, 40}) {
      ASSERT_TRUE(linear_gemm_mma_cuda(ctx, plain, dx, T, dy, OutRound::kF32).ok());
      ASSERT_TRUE(linear_gemm_mma_cuda(ctx, tiled, dx, T, dz, OutRound::kF32).ok());
      same(N * T, "GEMM");
      if (T > 1) {
        ASSERT_TRUE(linear_cuda(ctx, tiled, dx, T, dz, OutRound::kF32).ok());
        same(N * T, "linear_cuda's GEMM");
      }
    }
    const ActQ8 none{};
    const Status q8 = linear_experts_q8_cuda(ctx, tiled, eb, di, n, none, true, dy, N);
    EXPECT_EQ(q8.code(), absl::StatusCode::kUnimplemented) << q8;
    if (N > 16) {  // rows that are not whole tiles
      const Status part = linear_cuda(ctx, tiled.slice_rows(0, 17), dx, 1, dz);
      EXPECT_EQ(part.code(), absl::StatusCode::kUnimplemented) << part;
      EXPECT_NE(part.message().find("tiles"), std::string_view::npos) << part;
    }
    cudaStreamDestroy(s);
    for (void* p : std::initializer_list<void*>{dw, dt, dx, di, dy, dz}) cudaFree(p);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, LinearCuda,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                                           GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ6_K,
                                           GgmlType::kMXFP4),
                         [](const auto& info) { return std::string(quant::traits(info.param).name); });

}  // namespace
}  // namespace dsflash::kernels
