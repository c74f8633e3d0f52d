// CUDA dequantisation vs the CPU reference, bit for bit: fresh random blocks of every
// supported type (finite scales, random codes), odd block counts, output poisoned before the
// run, and every tensor of the golden model. Skipped where no GPU is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "kernels/dequant/dequant.h"
#include "tests/test_util.h"

namespace dsflash::kernels::dequant {
namespace {

using quant::GgmlType;

// Runs the CUDA path on host bytes and returns the values (NaN-poisoned output first).
std::vector<float> run_cuda(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n) {
  void* d_src = nullptr;
  float* d_dst = nullptr;
  EXPECT_EQ(cudaMalloc(&d_src, bytes.size()), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_dst, n * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_src, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_dst, 0xff, n * sizeof(float)), cudaSuccess);
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const Status s = dequantize(ExecCtx{Backend::kCuda, stream}, type, d_src, d_dst, n);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), d_dst, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaStreamDestroy(stream);
  cudaFree(d_src);
  cudaFree(d_dst);
  return out;
}

// Random bytes with every fp16 / E8M0 scale field forced finite.
std::vector<uint8_t> random_blocks(GgmlType type, int64_t n_blocks, std::mt19937& rng) {
  const quant::TypeTraits& t = quant::traits(type);
  std::vector<uint8_t> b(n_blocks * t.block_bytes);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  auto finite_half = [&](uint8_t* p) {
    const uint16_t h = static_cast<uint16_t>((rng() % 0x7000) | ((rng() & 1) << 15));  // exponent < 28
    std::memcpy(p, &h, 2);
  };
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* blk = b.data() + i * t.block_bytes;
    switch (type) {
      case GgmlType::kQ8_0: finite_half(blk); break;
      case GgmlType::kQ2_K: finite_half(blk + 80); finite_half(blk + 82); break;
      case GgmlType::kQ3_K: finite_half(blk + 108); break;
      case GgmlType::kQ4_K: case GgmlType::kQ5_K: finite_half(blk); finite_half(blk + 2); break;
      case GgmlType::kQ6_K: finite_half(blk + 208); break;
      case GgmlType::kF16: for (uint32_t k = 0; k < t.block_bytes; k += 2) finite_half(blk + k); break;
      case GgmlType::kF32: { const float f = std::ldexp(static_cast<float>(rng() % 2000) - 1000.0f, static_cast<int>(rng() % 40) - 20); std::memcpy(blk, &f, 4); break; }
      default: break;  // BF16 / MXFP4: every byte pattern is a value
    }
  }
  return b;
}

void expect_bit_identical(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n, const std::string& what) {
  std::vector<float> ref(n);
  ASSERT_TRUE(quant::decode_row(type, bytes.data(), ref.data(), n).ok());
  const std::vector<float> got = run_cuda(type, bytes, n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool same = std::memcmp(&ref[i], &got[i], 4) == 0 || (std::isnan(ref[i]) && std::isnan(got[i]));
    if (!same && bad++ < 5) ADD_FAILURE() << what << " element " << i << ": cpu " << ref[i] << " cuda " << got[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

class DequantCuda : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(DequantCuda, RandomBlocksMatchCpuBitForBit) {
  const GgmlType type = GetParam();
  std::mt19937 rng(1000 + static_cast<int>(type));
  const quant::TypeTraits& t = quant::traits(type);
  for (int64_t n_blocks : {1, 17, 31, 257, 4096}) {
    const auto bytes = random_blocks(type, n_blocks, rng);
    expect_bit_identical(type, bytes, n_blocks * t.block_elems, absl::StrCat(t.name, " x", n_blocks));
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantCuda,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                                           GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                           GgmlType::kQ6_K, GgmlType::kMXFP4),
                         [](const auto& info) { return std::string(quant::traits(info.param).name); });

TEST(DequantCudaGolden, EveryGoldenTensorMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto m = gguf::Model::open(testing::golden_dir() + "/tiny_a.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  for (const auto& t : (*m)->tensors()) {
    std::vector<uint8_t> bytes(t.n_bytes);
    ASSERT_TRUE((*m)->read(t, 0, bytes.data(), bytes.size()).ok());
    expect_bit_identical(t.type, bytes, static_cast<int64_t>(t.n_elems), t.name);
  }
}

TEST(DequantCudaErrors, PartialBlocksAreRejected) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_FALSE(dequantize(ExecCtx{Backend::kCuda, nullptr}, GgmlType::kQ2_K, nullptr, nullptr, 100).ok());
  EXPECT_FALSE(dequantize(ExecCtx{Backend::kCuda, nullptr}, GgmlType::kIQ2_XXS, nullptr, nullptr, 256).ok());
}

}  // namespace
}  // namespace dsflash::kernels::dequant
