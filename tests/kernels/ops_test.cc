// CPU reference ops on hand-computed cases and fresh random inputs: QDQ formats, RoPE tables,
// hyper-connection split, sparse attention against a naive softmax, top-k ties, candidate
// blocks, MoE routing and SwiGLU clamps, Engram hashing, and the threaded linear.
#include <cmath>
#include <random>

#include "common/quant/numeric.h"
#include "common/quant/quant.h"
#include "gtest/gtest.h"
#include "kernels/attn/attn.h"
#include "kernels/engram/engram.h"
#include "kernels/hc/hc.h"
#include "kernels/linear/linear.h"
#include "kernels/moe/moe.h"
#include "kernels/norm/norm.h"
#include "kernels/qdq/qdq.h"
#include "kernels/rope/rope.h"

namespace dsflash::kernels {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = quant::round_bf16(d(rng));
  return v;
}

TEST(Qdq, PowerOfTwoScales) {
  EXPECT_EQ(qdq::pow2_scale(448.0f, 1.0f / 448.0f), 1.0f);
  EXPECT_EQ(qdq::pow2_scale(449.0f, 1.0f / 448.0f), 2.0f);
  EXPECT_EQ(qdq::pow2_scale(6.0f, 1.0f / 6.0f), 1.0f);
  EXPECT_EQ(qdq::pow2_scale(1e-4f, 1.0f / 448.0f), std::ldexp(1.0f, -22));
}

TEST(Qdq, Fp8HandBlockAndIdempotence) {
  std::vector<float> v(32, 0.0f);
  v[0] = 448.0f;  // scale 1: values land on the E4M3 grid
  v[1] = 1.0625f; // tie between 1.0 and 1.125 -> even (1.0)
  v[2] = -300.0f; // E4M3 neighbours 288 and 320 -> 288
  qdq::fp8_e8m0_32(v.data(), 32);
  EXPECT_EQ(v[0], 448.0f);
  EXPECT_EQ(v[1], 1.0f);
  EXPECT_EQ(v[2], -288.0f);
  auto r = randn(512, 1, 3.0f);
  qdq::fp8_e8m0_32(r.data(), 512);
  auto again = r;
  qdq::fp8_e8m0_32(again.data(), 512);
  EXPECT_EQ(again, r);
}

TEST(Qdq, Fp4E4m3ScaleBlock) {
  std::vector<float> v(16, 0.0f);
  v[0] = 6.0f;    // amax 6 -> scale e4m3(1.0) = 1
  v[1] = 1.25f;   // tie -> 1.0 (even code)
  v[2] = 1.75f;   // tie -> 2.0
  v[3] = -0.0f;   // sign kept
  v[4] = 100.0f;  // never: amax is 100 in another block
  v[4] = 5.0f;    // tie between 4 and 6 -> 4
  qdq::fp4_e4m3_16(v.data(), 16);
  EXPECT_EQ(v[0], 6.0f);
  EXPECT_EQ(v[1], 1.0f);
  EXPECT_EQ(v[2], 2.0f);
  EXPECT_TRUE(std::signbit(v[3]));
  EXPECT_EQ(v[4], 4.0f);
  // An all-zero block keeps the smallest scale and stays zero.
  std::vector<float> z(16, 0.0f);
  qdq::fp4_e4m3_16(z.data(), 16);
  for (float x : z) EXPECT_EQ(x, 0.0f);
}

// The QDQ'd rows sparse attention reads (window rows: FP8 with E8M0 scales; compressed rows: FP4
// with E4M3 scales) are bf16 values whatever the input's magnitude, so their products with bf16
// q and p are exact on bf16 tensor cores (docs/cuda-backend.md, Next item 5).
TEST(Qdq, AttentionRowsAreBf16Values) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> decade(-30.0f, 30.0f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int block = 0; block < 200; ++block) {
    const float scale = std::pow(2.0f, decade(rng));
    std::vector<float> a(32), b(32);
    for (int i = 0; i < 32; ++i) a[i] = b[i] = nd(rng) * scale * (i % 7 == 0 ? 50.0f : 1.0f);
    qdq::fp8_e8m0_32(a.data(), 32);
    qdq::fp4_e4m3_16(b.data(), 32);
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(quant::round_bf16(a[i]), a[i]) << "fp8 block " << block << " [" << i << "] scale " << scale;
      ASSERT_EQ(quant::round_bf16(b[i]), b[i]) << "fp4 block " << block << " [" << i << "] scale " << scale;
    }
  }
}

TEST(Qdq, Fp4E8m0ValuesAreOnTheGrid) {
  const auto orig = randn(128, 2);
  auto r = orig;
  qdq::fp4_e8m0_32(r.data(), 128);
  const float mags[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int b = 0; b < 4; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(orig[b * 32 + i]));
    const float s = qdq::pow2_scale(amax, 1.0f / 6.0f);
    for (int i = 0; i < 32; ++i) {
      const float q = r[b * 32 + i] / s;
      bool on_grid = false;
      for (float m : mags) on_grid |= std::fabs(q) == m;
      EXPECT_TRUE(on_grid) << q;
      EXPECT_LE(std::fabs(r[b * 32 + i] - orig[b * 32 + i]), s * 1.0f);  // at most half the widest gap (2)
    }
  }
}

TEST(Rope, YarnTableAndInverse) {
  const auto t = rope::make_table(64, 160000.0f, 65536, 16.0f, 32.0f, 1.0f);
  const auto plain = rope::make_table(64, 160000.0f, 0, 1.0f, 0, 0);
  for (int i = 0; i <= 15; ++i) EXPECT_EQ(t.freqs[i], plain.freqs[i]) << i;  // below lo = 15: untouched
  for (int i = 25; i < 32; ++i) EXPECT_EQ(t.freqs[i], plain.freqs[i] / 16.0f) << i;  // from hi = 25: divided
  auto v = randn(512, 3);
  auto w = v;
  rope::apply(t, w.data(), 512, 12345);
  EXPECT_NE(w, v);
  rope::apply(t, w.data(), 512, 12345, true);
  for (int i = 0; i < 448; ++i) EXPECT_EQ(w[i], v[i]);  // only the tail rotates
  for (int i = 448; i < 512; ++i) EXPECT_NEAR(w[i], v[i], 0.02f * std::fabs(v[i]) + 1e-2f);
  auto p0 = v;
  rope::apply(t, p0.data(), 512, 0);
  EXPECT_EQ(p0, v);  // position 0 is the identity
}

TEST(Hc, SinkhornIsDoublyStochastic) {
  auto m = randn(24, 4, 2.0f);
  const std::vector<float> scale = {0.7f, 1.1f, 0.9f};
  auto base = randn(24, 5);
  const auto s = hc::split(m.data(), scale.data(), base.data(), 4, 20, 1e-6f);
  for (int i = 0; i < 4; ++i) {
    float row = 0, col = 0;
    for (int j = 0; j < 4; ++j) {
      row += s.comb[i][j];
      col += s.comb[j][i];
    }
    EXPECT_NEAR(row, 1.0f, 1e-3f);
    EXPECT_NEAR(col, 1.0f, 1e-5f);  // the last pass normalises columns
    EXPECT_GT(s.pre[i], 1e-6f);
    EXPECT_LT(s.post[i], 2.0f);
  }
}

TEST(SparseAttn, MatchesNaiveSoftmaxWithSink) {
  const int H = 3;
  const int64_t Dh = 64, N = 150;
  const auto q = randn(H * Dh, 6, 0.3f);
  const auto kv = randn(N * Dh, 7);
  std::vector<int32_t> idx;
  for (int32_t j = 0; j < N; ++j) idx.push_back(j % 7 == 3 ? -1 : j);  // holes, >2 chunks
  const std::vector<float> sink = {0.5f, -1.0f, 2.0f};
  const float scale = 0.125f;
  std::vector<float> o(H * Dh);
  attn::sparse_attn(q.data(), H, Dh, kv.data(), idx.data(), static_cast<int64_t>(idx.size()), sink.data(), scale, o.data());
  for (int h = 0; h < H; ++h) {
    std::vector<double> logit;
    double mx = sink[h];
    for (int32_t j : idx) {
      if (j < 0) continue;
      double d = 0;
      for (int64_t k = 0; k < Dh; ++k) d += static_cast<double>(q[h * Dh + k]) * kv[j * Dh + k];
      logit.push_back(d * scale);
      mx = std::max(mx, logit.back());
    }
    double den = std::exp(sink[h] - mx);
    for (double l : logit) den += std::exp(l - mx);
    for (int64_t d = 0; d < Dh; ++d) {
      double acc = 0;
      size_t n = 0;
      for (int32_t j : idx) {
        if (j < 0) continue;
        acc += std::exp(logit[n++] - mx) / den * kv[j * Dh + d];
      }
      EXPECT_NEAR(o[h * Dh + d], acc, 0.01 * std::fabs(acc) + 2e-3) << h << " " << d;
    }
  }
  // A row with no valid index gives zeros, not NaN.
  std::vector<int32_t> none(70, -1);
  attn::sparse_attn(q.data(), H, Dh, kv.data(), none.data(), 70, sink.data(), scale, o.data());
  for (float v : o) EXPECT_EQ(v, 0.0f);
}

TEST(TopK, TiesGoToTheLowerIndex) {
  const std::vector<float> v = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, -INFINITY};
  EXPECT_EQ(attn::topk_ascending(v.data(), 6, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(attn::topk_ascending(v.data(), 6, 4), (std::vector<int32_t>{0, 1, 2, 4}));
  EXPECT_EQ(attn::topk_ascending(v.data(), 6, 10).size(), 6u);
}

TEST(Candidates, BlocksPinnedAndDropped) {
  // 10 positions, blocks of 4: [0..3] max 5, [4..7] max 9, [8..9] max -inf (not visible).
  std::vector<float> s = {1, 5, 2, 0, 9, 1, 1, 1, -INFINITY, -INFINITY};
  // compress_len 8: newest visible position 7 -> block 1 pinned; keep 2 of 3 blocks.
  auto m = attn::candidate_mask(s.data(), 10, 8, 2, 4);
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}));
  // Keep 1: only the pinned block.
  m = attn::candidate_mask(s.data(), 10, 8, 1, 4);
  EXPECT_EQ(m, (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1, 1, 0, 0}));
  // Keep 3: the -inf block is dropped even though it is among the top 3.
  m = attn::candidate_mask(s.data(), 10, 8, 3, 4);
  EXPECT_EQ(m[8], 0);
}

TEST(Moe, RouteAndSwiglu) {
  const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 2.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 5.0f, 0.0f};
  const auto r = moe::route(logits.data(), bias.data(), 4, 2, true, 1.5f);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{2, 1}));  // bias selects 2; tie 1 vs 3 -> 1
  const float s2 = std::sqrt(std::log1p(std::exp(-1.0f))), s1 = std::sqrt(std::log1p(std::exp(2.0f)));
  EXPECT_FLOAT_EQ(r.weights[0], s2 / (s2 + s1) * 1.5f);  // weights from the unbiased scores
  EXPECT_FLOAT_EQ(r.weights[1], s1 / (s2 + s1) * 1.5f);
  std::vector<float> a = {20.0f, -3.0f}, b = {50.0f, -50.0f};
  moe::swiglu(a.data(), b.data(), 2, 10.0f, 0.5f);
  EXPECT_FLOAT_EQ(a[0], quant::round_bf16(0.5f * (10.0f / (1 + std::exp(-10.0f)) * 10.0f)));  // gate <= 10, up <= 10
  EXPECT_FLOAT_EQ(a[1], quant::round_bf16(0.5f * (-3.0f / (1 + std::exp(3.0f)) * -10.0f)));    // up >= -10
}

TEST(Engram, HashUsesPadBeforeTheStart) {
  config::EngramConfig e;
  e.layer_ids = {0};
  e.n_heads = 1;
  e.max_ngram = 3;
  e.multipliers = {3, 5, 7};
  e.primes = {101, 103};
  e.offsets = {0, 101};
  e.pad_id = 2;
  e.compressed_vocab = 50;
  const int64_t hist[] = {10, 20};
  int64_t out[2];
  engram::hash_ids(e, 0, hist, 2, out);
  const int64_t x1 = (20 * 3) ^ (10 * 5), x2 = x1 ^ (2 * 7);  // look-back 2 is before the start: pad
  EXPECT_EQ(out[0], x1 % 101);
  EXPECT_EQ(out[1], x2 % 103 + 101);
}

TEST(Linear, MatchesNaiveDotsForQuantisedWeights) {
  for (auto type : {quant::GgmlType::kQ8_0, quant::GgmlType::kQ2_K, quant::GgmlType::kBF16}) {
    const int64_t K = 512, N = 37, T = 5;
    const auto wf = randn(static_cast<size_t>(K * N), 8);
    std::vector<uint8_t> bytes(*quant::row_bytes(type, K) * N);
    ASSERT_TRUE(quant::encode_row(type, wf.data(), bytes.data(), K * N).ok());
    Weight w{type, K, N, bytes.data(), *quant::row_bytes(type, K)};
    const auto x = randn(static_cast<size_t>(K * T), 9);
    std::vector<float> y(T * N), yf(T * N);
    linear(w, x.data(), T, y.data());
    linear(w, x.data(), T, yf.data(), OutRound::kF32);
    std::vector<float> row(K);
    for (int64_t o = 0; o < N; ++o) {
      decode_weight_row(w, o, row.data());
      for (int64_t t = 0; t < T; ++t) {
        double ref = 0;
        for (int64_t i = 0; i < K; ++i) ref += static_cast<double>(x[t * K + i]) * row[i];
        EXPECT_NEAR(yf[t * N + o], ref, 1e-4 * std::sqrt(K));
        EXPECT_EQ(y[t * N + o], quant::round_bf16(yf[t * N + o]));
      }
    }
  }
}

TEST(Norm, RmsNormRoundsOnce) {
  const auto x = randn(256, 10, 3.0f);
  std::vector<float> w(256, 1.5f), y(256);
  rms_norm(x.data(), w.data(), 1, 256, 1e-20f, y.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / 256);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(y[i], 1.5 * x[i] * inv, std::fabs(1.5 * x[i] * inv) * 0.008 + 1e-6);
}

}  // namespace
}  // namespace dsflash::kernels
