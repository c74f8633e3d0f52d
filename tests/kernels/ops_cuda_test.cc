// CUDA element-wise ops against the CPU backend (label gpu; skipped without a GPU): RMSNorm
// and RoPE on fresh random inputs at odd and released sizes and on the golden model's norm
// weights and rope table, outputs poisoned with NaN before each run. Summation order (norm)
// and sincosf (rope) may move a result by one bf16 ulp; the test reports how many values
// agree bit for bit and fails on anything further apart.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/quant/numeric.h"
#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"
#include "common/quant/quant.h"
#include "kernels/norm/norm.h"
#include "kernels/engram/engram_cuda.h"
#include "kernels/hc/hc.h"
#include "kernels/hc/hc_cuda.h"
#include "kernels/norm/norm_cuda.h"
#include "kernels/qdq/qdq.h"
#include "kernels/qdq/qdq_cuda.h"
#include "kernels/rope/rope.h"
#include "kernels/rope/rope_cuda.h"
#include "tests/test_util.h"

namespace dsflash::kernels {
namespace {

using testing::to_device;
using testing::to_host;

// Within one bf16 ulp; counts exact matches into *exact.
void expect_close(const std::vector<float>& want, const std::vector<float>& got, size_t* exact, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " [" << i << "] not written";
    if (want[i] == got[i]) {
      ++*exact;
      continue;
    }
    const float m = std::max(std::fabs(want[i]), std::fabs(got[i]));
    const float ulp = std::ldexp(1.0f, std::ilogb(m) - 7);
    ASSERT_LE(std::fabs(want[i] - got[i]), ulp) << what << " [" << i << "]: " << want[i] << " vs " << got[i];
  }
}

using OpsCuda = testing::CudaStreamTest;

void check_norm(const ExecCtx& ctx, const std::vector<float>& x, const std::vector<float>& w, int64_t rows, float eps,
                size_t* exact, size_t* total, const std::string& what) {
  const int64_t n = static_cast<int64_t>(w.size());
  std::vector<float> want(x.size());
  rms_norm(x.data(), w.data(), rows, n, eps, want.data());
  float *dx = to_device(x), *dw = to_device(w), *dy = to_device(std::vector<float>(x.size(), std::nanf("")));
  ASSERT_TRUE(rms_norm_cuda(ctx, dx, dw, rows, n, eps, dy).ok());
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.cuda_stream)), cudaSuccess);
  expect_close(want, to_host(dy, x.size()), exact, what);
  *total += x.size();
  cudaFree(dx), cudaFree(dw), cudaFree(dy);
}

TEST_F(OpsCuda, RmsNormMatchesCpuOnRandomInputs) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  size_t exact = 0, total = 0;
  for (int64_t n : {1, 17, 31, 257, 4096, 7168}) {
    for (int64_t rows : {1, 5}) {
      for (float scale : {1e-3f, 1.0f, 300.0f}) {
        std::vector<float> x(static_cast<size_t>(rows * n)), w(static_cast<size_t>(n));
        for (float& v : x) v = quant::round_bf16(nd(rng) * scale);
        for (float& v : w) v = 1.0f + 0.1f * nd(rng);
        check_norm(ctx(), x, w, rows, 1e-6f, &exact, &total, "n=" + std::to_string(n));
      }
    }
  }
  std::printf("rms_norm: %zu of %zu values bit-exact, the rest within one bf16 ulp\n", exact, total);
}

TEST_F(OpsCuda, RmsNormMatchesCpuOnTheGoldenWeights) {
  auto file = gguf::Model::open(testing::golden_dir() + "/tiny_a.gguf");
  ASSERT_TRUE(file.ok());
  auto cfg = config::from_gguf(**file);
  ASSERT_TRUE(cfg.ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  size_t exact = 0, total = 0;
  for (uint32_t l = 0; l < cfg->n_layer; ++l) {
    const gguf::TensorInfo* t = (*file)->find_tensor("blk." + std::to_string(l) + ".attn_norm.weight");
    ASSERT_NE(t, nullptr);
    std::vector<uint8_t> raw(t->n_bytes);
    ASSERT_TRUE((*file)->read(*t, 0, raw.data(), raw.size()).ok());
    std::vector<float> w(t->n_elems);
    ASSERT_TRUE(quant::decode_row(t->type, raw.data(), w.data(), static_cast<int64_t>(t->n_elems)).ok());
    std::vector<float> x(w.size() * 7);
    for (float& v : x) v = quant::round_bf16(nd(rng));
    check_norm(ctx(), x, w, 7, cfg->norm_eps, &exact, &total, "layer " + std::to_string(l));
  }
  std::printf("rms_norm (golden weights, eps %g): %zu of %zu values bit-exact\n", cfg->norm_eps, exact, total);
}

TEST_F(OpsCuda, RopeMatchesCpu) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  size_t exact = 0, total = 0;
  for (auto [dims, yarn] : {std::pair{2, false}, {64, false}, {64, true}, {128, true}}) {
    const rope::Table t = yarn ? rope::make_table(dims, 160000.0f, 65536, 16.0f, 32.0f, 1.0f)
                               : rope::make_table(dims, 10000.0f, 0, 1.0f, 32.0f, 1.0f);
    float* df = to_device(t.freqs);
    for (int64_t len : {int64_t{dims}, int64_t{512}}) {
      for (auto [rows, per] : {std::pair<int64_t, int64_t>{1, 1}, {17, 1}, {16, 4}}) {
        for (int64_t pos0 : {0, 1000, 65535}) {
          for (bool inverse : {false, true}) {
            std::vector<float> v(static_cast<size_t>(rows * len));
            for (float& x : v) x = quant::round_bf16(nd(rng));
            std::vector<float> want = v;
            for (int64_t r = 0; r < rows; ++r) rope::apply(t, want.data() + r * len, len, pos0 + r / per, inverse);
            float* dv = to_device(v);
            ASSERT_TRUE(rope::apply_cuda(ctx(), df, dims, dv, rows, len, pos0, per, inverse).ok());
            ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
            expect_close(want, to_host(dv, v.size()), &exact, "rope dims " + std::to_string(dims));
            total += v.size();
            cudaFree(dv);
          }
        }
      }
    }
    cudaFree(df);
  }
  std::printf("rope: %zu of %zu values bit-exact, the rest within one bf16 ulp\n", exact, total);
  EXPECT_FALSE(rope::apply_cuda(ctx(), nullptr, 3, nullptr, 1, 8, 0, 1).ok());  // odd dims refused
}

// Hyper-connections: pre and post bit-exact; the mixes (fp32 dot products) to rounding,
// bounded by the magnitudes involved; the split of the GPU mixes gives the CPU's pre/post
// weights to the same order.
TEST_F(OpsCuda, HyperConnectionsMatchCpu) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int C = 4, M = (2 + C) * C;
  size_t exact = 0, total = 0;
  for (int64_t D : {1, 17, 257, 4096, 5120}) {
    for (int64_t S : {1, 3}) {
      std::vector<float> h(static_cast<size_t>(S * C * D)), fn(static_cast<size_t>(M * C * D)), x(static_cast<size_t>(S * D));
      for (float& v : h) v = quant::round_bf16(nd(rng));
      for (float& v : fn) v = nd(rng) / std::sqrt(static_cast<float>(C * D));
      for (float& v : x) v = quant::round_bf16(nd(rng));
      float *dh = to_device(h), *dfn = to_device(fn), *dx = to_device(x);
      float* dm = to_device(std::vector<float>(static_cast<size_t>(S * M), std::nanf("")));
      ASSERT_TRUE(hc::mixes_cuda(ctx(), dh, dfn, C, D, S, 1e-6f, dm).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const std::vector<float> gm = to_host(dm, static_cast<size_t>(S * M));
      std::vector<float> w(static_cast<size_t>(S * C)), post(static_cast<size_t>(S * C)), comb(static_cast<size_t>(S * C * C));
      for (int64_t t = 0; t < S; ++t) {
        std::vector<float> want(M);
        const float* ht = h.data() + t * C * D;
        hc::mixes(ht, fn.data(), C, D, 1e-6f, want.data());
        float ss = 0;
        for (int64_t i = 0; i < C * D; ++i) ss += ht[i] * ht[i];
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(C * D) + 1e-6f);
        for (int k = 0; k < M; ++k) {
          float mag = 0;
          for (int64_t i = 0; i < C * D; ++i) mag += std::fabs(ht[i] * fn[k * C * D + i]);
          ASSERT_NEAR(gm[t * M + k], want[k], 1e-5f * mag * r + 1e-30f) << "D=" << D << " mix " << k;
        }
        const float scale[3] = {1.0f, 1.0f, 1.0f};
        std::vector<float> base(M, 0.1f);
        const hc::Split sp = hc::split(want.data(), scale, base.data(), C, 20, 1e-6f);
        for (int c = 0; c < C; ++c) {
          w[t * C + c] = sp.pre[c];
          post[t * C + c] = sp.post[c];
          for (int j = 0; j < C; ++j) comb[(t * C + c) * C + j] = sp.comb[c][j];
        }
      }
      // pre and post from the same weights: bit-exact.
      std::vector<float> want_pre(static_cast<size_t>(S * D)), want_post(static_cast<size_t>(S * C * D));
      for (int64_t t = 0; t < S; ++t) {
        hc::Split sp{};
        for (int c = 0; c < C; ++c) {
          sp.post[c] = post[t * C + c];
          for (int j = 0; j < C; ++j) sp.comb[c][j] = comb[(t * C + c) * C + j];
        }
        hc::pre(h.data() + t * C * D, w.data() + t * C, C, D, want_pre.data() + t * D);
        hc::post(x.data() + t * D, h.data() + t * C * D, sp, C, D, want_post.data() + t * C * D);
      }
      float *dw = to_device(w), *dpost = to_device(post), *dcomb = to_device(comb);
      float* dy = to_device(std::vector<float>(want_pre.size(), std::nanf("")));
      float* dz = to_device(std::vector<float>(want_post.size(), std::nanf("")));
      ASSERT_TRUE(hc::pre_cuda(ctx(), dh, dw, C, D, S, dy).ok());
      ASSERT_TRUE(hc::post_cuda(ctx(), dx, dh, dpost, dcomb, C, D, S, dz).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const std::vector<float> gy = to_host(dy, want_pre.size()), gz = to_host(dz, want_post.size());
      for (size_t i = 0; i < gy.size(); ++i) ASSERT_EQ(quant::f32_bits(gy[i]), quant::f32_bits(want_pre[i])) << "pre " << i;
      for (size_t i = 0; i < gz.size(); ++i) ASSERT_EQ(quant::f32_bits(gz[i]), quant::f32_bits(want_post[i])) << "post " << i;
      exact += gy.size() + gz.size();
      total += gy.size() + gz.size();
      for (float* p : {dh, dfn, dx, dm, dw, dpost, dcomb, dy, dz}) cudaFree(p);
    }
  }
  std::printf("hc pre/post: %zu of %zu values bit-exact; mixes within fp32 rounding bounds\n", exact, total);
}

// The three QDQ points are bit-exact: random blocks at many scales, including all-zero
// blocks, tiny and saturating values, and the released window/compressed/indexer sizes.
TEST_F(OpsCuda, QdqIsBitExact) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-30.0f, 12.0f);
  using CpuFn = void (*)(float*, int64_t);
  using GpuFn = Status (*)(const ExecCtx&, float*, int64_t);
  const std::tuple<const char*, CpuFn, GpuFn, int64_t> kinds[] = {
      {"fp8_e8m0_32", qdq::fp8_e8m0_32, qdq::fp8_e8m0_32_cuda, 32},
      {"fp4_e4m3_16", qdq::fp4_e4m3_16, qdq::fp4_e4m3_16_cuda, 16},
      {"fp4_e8m0_32", qdq::fp4_e8m0_32, qdq::fp4_e8m0_32_cuda, 32}};
  for (const auto& [name, cpu, gpu, block] : kinds) {
    size_t total = 0;
    for (int64_t n : {block, block * 17, int64_t{512}, int64_t{128 * 64}, int64_t{7168}}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t b = 0; b < n; b += block) {
        const float scale = std::exp2(ex(rng));
        const bool zero = rng() % 11 == 0;
        for (int64_t i = b; i < b + block; ++i) v[i] = zero ? 0.0f : quant::round_bf16(nd(rng) * scale);
      }
      std::vector<float> want = v;
      cpu(want.data(), n);
      float* dv = to_device(v);
      ASSERT_TRUE(gpu(ctx(), dv, n).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const std::vector<float> got = to_host(dv, v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(quant::f32_bits(want[i]), quant::f32_bits(got[i])) << name << " n=" << n << " [" << i << "] input " << v[i];
      }
      total += v.size();
      cudaFree(dv);
    }
    EXPECT_FALSE(gpu(ctx(), nullptr, block + 1).ok());  // not whole blocks
    std::printf("%s: %zu of %zu values bit-exact\n", name, total, total);
  }
}

// The fused sub-layer forms equal the ops they join (checked against the CPU above), bit for
// bit: mixes + split (a warp per token for C = 4; the two ops for C = 6) and hc pre + RMSNorm
// (256 and 1024 threads per row), the sub-layer entry joining both, and the exit joining hc post
// to the next sub-layer's pre + RMSNorm (one block a token, or a cluster of CTAs for C <= 4 at
// 1,024 threads a row; its C = 4 form with the coefficients in registers, C = 3 the general one).
TEST_F(OpsCuda, FusedHyperConnectionOpsEqualTheOpsTheyJoin) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const int C : {3, 4, 6}) {
    const int M = (2 + C) * C;
    for (int64_t D : {17, 257, 2049, 5120, 8192}) {  // 1024 threads a row from 2,048: a cluster of 8 CTAs for C <= 4
      for (int64_t S : {1, 3}) {
        std::vector<float> h(static_cast<size_t>(S * C * D)), fn(static_cast<size_t>(M * C * D)), base(M), nw(D);
        for (float& v : h) v = quant::round_bf16(nd(rng));
        for (float& v : fn) v = nd(rng) / std::sqrt(static_cast<float>(C * D));
        for (float& v : base) v = 0.3f * nd(rng);
        for (float& v : nw) v = 1.0f + 0.1f * nd(rng);
        const std::vector<float> scale = {0.8f, 1.1f, 0.9f};
        std::vector<float> w(static_cast<size_t>(S * C));
        for (float& v : w) v = 0.5f + 0.2f * nd(rng);
        const std::vector<float> nan_c(static_cast<size_t>(S * C), std::nanf("")), nan_cc(S * C * C, std::nanf(""));
        const std::vector<float> nan_m(static_cast<size_t>(S * M), std::nanf("")), nan_d(S * D, std::nanf(""));
        float *dh = dev(h), *dfn = dev(fn), *dbase = dev(base), *dscale = dev(scale), *dnw = dev(nw), *dw = dev(w);
        float *m = dev(nan_m), *pre1 = dev(nan_c), *post1 = dev(nan_c), *comb1 = dev(nan_cc);
        float *pre2 = dev(nan_c), *post2 = dev(nan_c), *comb2 = dev(nan_cc), *y1 = dev(nan_d), *y2 = dev(nan_d);
        ASSERT_TRUE(hc::mixes_cuda(ctx(), dh, dfn, C, D, S, 1e-6f, m).ok());
        ASSERT_TRUE(hc::split_cuda(ctx(), m, dscale, dbase, C, S, 20, 1e-6f, pre1, post1, comb1).ok());
        ASSERT_TRUE(hc::mixes_split_cuda(ctx(), dh, dfn, dscale, dbase, C, D, S, 1e-6f, 20, 1e-6f, pre2, post2, comb2).ok());
        ASSERT_TRUE(hc::pre_cuda(ctx(), dh, dw, C, D, S, y1).ok());
        ASSERT_TRUE(rms_norm_cuda(ctx(), y1, dnw, S, D, 1e-6f, y1).ok());
        ASSERT_TRUE(hc::pre_norm_cuda(ctx(), dh, dw, C, D, S, dnw, 1e-6f, y2).ok());
        float *pre3 = dev(nan_c), *post3 = dev(nan_c), *comb3 = dev(nan_cc), *y3 = dev(nan_d);
        ASSERT_TRUE(hc::sublayer_in_cuda(ctx(), dh, dfn, dscale, dbase, C, D, S, 1e-6f, 20, 1e-6f, dw, dnw, pre3, post3,
                                         comb3, y3)
                        .ok());
        sync();
        const std::string at = "C=" + std::to_string(C) + " D=" + std::to_string(D) + " S=" + std::to_string(S);
        auto same = [&](const float* a, const float* b, size_t n, const char* what) {
          const std::vector<float> x = to_host(a, n), y = to_host(b, n);
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(quant::f32_bits(x[i]), quant::f32_bits(y[i])) << what << " " << at << " [" << i << "]";
        };
        same(pre1, pre2, S * C, "pre");
        same(post1, post2, S * C, "post");
        same(comb1, comb2, S * C * C, "comb");
        same(y1, y2, S * D, "pre + norm");
        same(pre1, pre3, S * C, "sub-layer entry: pre");
        same(post1, post3, S * C, "sub-layer entry: post");
        same(comb1, comb3, S * C * C, "sub-layer entry: comb");
        same(y1, y3, S * D, "sub-layer entry: pre + norm");
        // A sub-layer's exit joined to the next norm: post (output x, residual h, post1,
        // comb1), then pre + norm of the new streams with the weights w.
        std::vector<float> xo(static_cast<size_t>(S * D));
        for (float& v : xo) v = quant::round_bf16(nd(rng));
        const std::vector<float> nan_h(h.size(), std::nanf(""));
        float *dxo = dev(xo), *h4 = dev(nan_h), *h5 = dev(nan_h), *y4 = dev(nan_d), *y5 = dev(nan_d);
        ASSERT_TRUE(hc::post_cuda(ctx(), dxo, dh, post1, comb1, C, D, S, h4).ok());
        ASSERT_TRUE(hc::pre_norm_cuda(ctx(), h4, dw, C, D, S, dnw, 1e-6f, y4).ok());
        ASSERT_TRUE(hc::post_pre_norm_cuda(ctx(), dxo, dh, post1, comb1, C, D, S, dw, dnw, 1e-6f, h5, y5).ok());
        sync();
        same(h4, h5, h.size(), "sub-layer exit: post");
        same(y4, y5, S * D, "sub-layer exit: pre + norm");
      }
    }
  }
}


// A sub-layer's exit with an Engram layer's gate before the next norm (post_gate_pre_norm_cuda)
// against its three launches: the gate's row sums reduce in another tree, so a stream value
// may move by one bf16 ulp where the gate differs in its last bits (and the norm's output by
// two); nearly all are bit for bit.
TEST_F(OpsCuda, EngramExitEqualsTheOpsItJoins) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int C = 4;
  size_t exact_h = 0, exact_y = 0, total_h = 0, total_y = 0;
  for (int64_t D : {17, 257, 2049, 5120, 8192}) {
    for (int64_t S : {1, 3}) {
      const std::string at = "D=" + std::to_string(D) + " S=" + std::to_string(S);
      std::vector<float> res(static_cast<size_t>(S * C * D)), xo(static_cast<size_t>(S * D)), nw(D);
      std::vector<float> kv(static_cast<size_t>(S * (C + 1) * D)), qk(static_cast<size_t>(C * D));
      std::vector<float> post(static_cast<size_t>(S * C)), comb(static_cast<size_t>(S * C * C)), pre(post.size());
      for (float& v : res) v = quant::round_bf16(nd(rng));
      for (float& v : xo) v = quant::round_bf16(nd(rng));
      for (float& v : kv) v = quant::round_bf16(nd(rng));
      for (float& v : qk) v = 1.0f + 0.2f * nd(rng);
      for (float& v : nw) v = 1.0f + 0.1f * nd(rng);
      for (float& v : post) v = 0.5f + 0.2f * nd(rng);
      for (float& v : comb) v = 0.25f + 0.1f * nd(rng);
      for (float& v : pre) v = 0.5f + 0.2f * nd(rng);
      const std::vector<float> nan_h(res.size(), std::nanf("")), nan_d(xo.size(), std::nanf(""));
      float *dres = dev(res), *dxo = dev(xo), *dkv = dev(kv), *dqk = dev(qk), *dnw = dev(nw);
      float *dpost = dev(post), *dcomb = dev(comb), *dpre = dev(pre);
      float *h1 = dev(nan_h), *h2 = dev(nan_h), *y1 = dev(nan_d), *y2 = dev(nan_d);
      ASSERT_TRUE(hc::post_cuda(ctx(), dxo, dres, dpost, dcomb, C, D, S, h1).ok());
      ASSERT_TRUE(engram::gate_update_cuda(ctx(), h1, dkv, dqk, C, D, S, 1e-6f, nullptr).ok());
      ASSERT_TRUE(hc::pre_norm_cuda(ctx(), h1, dpre, C, D, S, dnw, 1e-6f, y1).ok());
      ASSERT_TRUE(hc::post_gate_pre_norm_applies(C, D)) << at;
      ASSERT_TRUE(hc::post_gate_pre_norm_cuda(ctx(), dxo, dres, dpost, dcomb, C, D, S, dkv, dqk, dpre, dnw, 1e-6f, h2, y2)
                      .ok());
      sync();
      expect_close(to_host(h1, res.size()), to_host(h2, res.size()), &exact_h, "streams " + at);
      total_h += res.size();
      const std::vector<float> want = to_host(y1, xo.size()), got = to_host(y2, xo.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << "normed " << at << " [" << i << "] not written";
        const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(want[i]), std::fabs(got[i]))) - 7);
        ASSERT_LE(std::fabs(want[i] - got[i]), 2 * ulp) << "normed " << at << " [" << i << "]";
        exact_y += want[i] == got[i];
      }
      total_y += want.size();
    }
  }
  std::printf("engram exit: %zu of %zu stream values and %zu of %zu normed values bit for bit\n", exact_h, total_h,
              exact_y, total_y);
  EXPECT_GE(exact_h, total_h * 99 / 100);
  EXPECT_GE(exact_y, total_y * 98 / 100);
  EXPECT_FALSE(hc::post_gate_pre_norm_applies(3, 5120));
  const Status s3 = hc::post_gate_pre_norm_cuda(ctx(), nullptr, nullptr, nullptr, nullptr, 3, 5120, 1, nullptr, nullptr,
                                                nullptr, nullptr, 1e-6f, nullptr, nullptr);
  EXPECT_EQ(s3.code(), absl::StatusCode::kUnimplemented) << s3;
}

}  // namespace
}  // namespace dsflash::kernels
