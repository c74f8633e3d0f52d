// The digit split of the tensor-core decode GEMVs (kernels/linear/digits.h, the code the CUDA
// kernel runs): on blocks spanning many decades, with zeros, subnormals and one outlier, every
// digit fits |q| <= 64, the value is recovered within amax 2^-27, and exactly when |v| >=
// amax / 8. Reconstruction in double (exact for four 7-bit digits).
#include "kernels/linear/digits.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dsflash::kernels {
namespace {

struct Checked {
  int exact = 0, inexact = 0;
};

// Splits one block and checks every value; returns how many were recovered exactly.
Checked check_block(const std::vector<float>& v) {
  float amax = 0.0f;
  for (float x : v) amax = std::fmax(amax, std::fabs(x));
  const int e = digits::scale_exponent(amax);
  const double S = std::ldexp(1.0, e - 5);
  if (amax > 0.0f) {
    EXPECT_GE(amax / S, 32.0);
    EXPECT_LT(amax / S, 64.0);
  }
  Checked c;
  for (float x : v) {
    int q[digits::kDigits];
    digits::split(x, e, q);
    double back = 0.0;
    for (int j = 0; j < digits::kDigits; ++j) {
      EXPECT_LE(std::abs(q[j]), 64) << "digit " << j << " of " << x;
      back += std::ldexp(static_cast<double>(q[j]), -7 * j);
    }
    const double err = std::fabs(S * back - static_cast<double>(x));
    EXPECT_LE(err, std::ldexp(static_cast<double>(amax), -27)) << x << " in a block of max " << amax;
    if (std::fabs(x) >= amax / 8.0f) {
      EXPECT_EQ(err, 0.0) << x << " in a block of max " << amax;
    }
    (err == 0.0 ? c.exact : c.inexact) += 1;
  }
  return c;
}

TEST(Digits, RecoverEveryValueWithinTheBlockBound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-12.0f, 12.0f);
  Checked total;
  for (int b = 0; b < 2000; ++b) {
    std::vector<float> v(256);
    const float block_scale = std::pow(10.0f, decade(rng) * 2.5f);  // blocks from ~1e-30 to ~1e30
    const int spread = b % 4;                                        // decades within the block: 0, 2, 4, 6
    for (float& x : v) x = nd(rng) * block_scale * std::pow(10.0f, spread * (decade(rng) / 12.0f));
    const Checked c = check_block(v);
    total.exact += c.exact, total.inexact += c.inexact;
  }
  EXPECT_GT(total.exact, 0);
  EXPECT_GT(total.inexact, 0);  // the bound, not only exactness, was exercised
}

TEST(Digits, ZerosSubnormalsAndOutliers) {
  std::vector<float> zeros(256, 0.0f);
  EXPECT_EQ(check_block(zeros).exact, 256);
  std::vector<float> tiny(256);
  for (int i = 0; i < 256; ++i) tiny[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i - 128);
  EXPECT_EQ(check_block(tiny).exact, 256);  // subnormals scale up exactly
  std::vector<float> outlier(256, 1e-3f);
  outlier[17] = -3.0e4f;
  outlier[200] = std::numeric_limits<float>::max();
  check_block(outlier);  // 1e-3 is 41 decades below the largest: its digits vanish, within amax 2^-27
  std::vector<float> mixed(256);
  for (int i = 0; i < 256; ++i) mixed[i] = std::ldexp(1.0f + static_cast<float>(i) / 256.0f, (i % 40) - 20);
  check_block(mixed);
}

// The split rounds v / S to the nearest multiple of 128^-3 as rounding it digit by digit (rint,
// subtract, times 128, four times) does, ties included: the represented values are equal.
TEST(Digits, SameValueAsDigitByDigitRounding) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-64.0f, 64.0f);
  std::uniform_int_distribution<int> code(-(1 << 22), (1 << 22) - 1);  // code + 0.5 exact in fp32
  for (int i = 0; i < 200000; ++i) {
    const int e = (i % 61) - 30;
    // A value in [-64, 64) S, or (every other one) an exact tie between two multiples of 128^-3.
    const float r = i % 2 == 0 ? u(rng) : std::ldexp(static_cast<float>(code(rng)) + 0.5f, -21);
    const float v = std::ldexp(r, e - 5);
    float rest = std::ldexp(v, 5 - e);
    int64_t want = 0;
    for (int j = 0; j < digits::kDigits; ++j) {
      const float d = std::rint(rest);
      rest = (rest - d) * 128.0f;
      want = want * 128 + static_cast<int64_t>(d);
    }
    int q[digits::kDigits];
    digits::split(v, e, q);
    int64_t got = 0;
    for (int j = 0; j < digits::kDigits; ++j) got = got * 128 + q[j];
    ASSERT_EQ(got, want) << "v = " << v << ", e = " << e;
  }
}

// The packed form the CUDA kernel uses (biased n, 7-bit fields, four values a word) holds the
// same digits as split(), byte for byte, and sum_bytes their sum, on the blocks of the first
// test (subnormals and 1e-30 blocks included: the two-factor scaling) and on exact ties.
TEST(Digits, PackedDigitsEqualTheSplit) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-12.0f, 12.0f);
  std::uniform_int_distribution<int> code(-(1 << 22), (1 << 22) - 1);
  for (int b = 0; b < 4000; ++b) {
    std::vector<float> v(256);
    const float d = decade(rng);
    const float block_scale = std::pow(10.0f, b % 2 == 0 ? d * 2.5f : -std::fabs(d) * 3.6f);  // 1e-43 .. 1e30
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = i % 5 == 4 ? std::ldexp(static_cast<float>(code(rng)) + 0.5f, -27) * block_scale
                        : nd(rng) * block_scale * std::pow(10.0f, (b % 4) * (decade(rng) / 12.0f));
    }
    if (b % 7 == 0) v[3] = std::numeric_limits<float>::denorm_min();
    float amax = 0.0f;
    for (float x : v) amax = std::fmax(amax, std::fabs(x));
    const int e = digits::scale_exponent(amax);
    const digits::Scale sc = digits::scale_of(e);
    for (size_t i0 = 0; i0 < v.size(); i0 += 4) {
      int nb[4], q[4][digits::kDigits];
      for (int i = 0; i < 4; ++i) nb[i] = digits::biased(v[i0 + i], sc), digits::split(v[i0 + i], e, q[i]);
      for (int j = 0; j < digits::kDigits; ++j) {
        const unsigned w = digits::pack_digit(nb, j);
        int sum = 0;
        for (int i = 0; i < 4; ++i) {
          ASSERT_EQ(static_cast<int>(static_cast<signed char>(static_cast<unsigned char>(w >> (8 * i)))), q[i][j])
              << "value " << v[i0 + i] << " digit " << j << " block max " << amax;
          sum += q[i][j];
        }
        ASSERT_EQ(digits::sum_bytes(w), sum);
      }
    }
  }
}

}  // namespace
}  // namespace dsflash::kernels
