// CUDA attention, MoE, Engram and hyper-connection split ops against the CPU backend (label
// gpu; skipped without a GPU): fresh random inputs at odd and released sizes, the golden
// model's tables for the row gather, outputs poisoned with NaN. Selections (top-k, candidate
// masks, routing) must be identical; values must agree bit for bit or within one bf16 ulp, with
// the share beyond that and the NMSE bounded (dot products reduce in a tree on the GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/quant/numeric.h"
#include "common/quant/quant.h"
#include "gtest/gtest.h"
#include "kernels/attn/attn.h"
#include "kernels/attn/attn_cuda.h"
#include "kernels/dequant/dequant.h"
#include "kernels/engram/engram.h"
#include "kernels/engram/engram_cuda.h"
#include "kernels/hc/hc.h"
#include "kernels/hc/hc_cuda.h"
#include "kernels/linear/linear.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/norm/norm_cuda.h"
#include "kernels/qdq/qdq_cuda.h"
#include "kernels/rope/rope_cuda.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/test_util.h"

namespace dsflash::kernels {
namespace {

using testing::to_device;
using testing::to_host;

// Agreement of GPU values with the CPU's: bit-exact, within one bf16 ulp, beyond; NMSE.
struct Agreement {
  size_t n = 0, exact = 0, one_ulp = 0, beyond = 0;
  double err2 = 0, ref2 = 0;

  void add(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
    ASSERT_EQ(want.size(), got.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << what << " [" << i << "] not written";
      ++n;
      if (quant::f32_bits(want[i]) == quant::f32_bits(got[i]) || want[i] == got[i]) {
        ++exact;
        if (std::isfinite(want[i])) ref2 += static_cast<double>(want[i]) * want[i];
        continue;
      }
      const double d = static_cast<double>(want[i]) - got[i];
      ref2 += static_cast<double>(want[i]) * want[i];
      err2 += d * d;
      const float m = std::max(std::fabs(want[i]), std::fabs(got[i]));
      (std::fabs(d) <= std::ldexp(1.0f, std::ilogb(m) - 7) ? one_ulp : beyond) += 1;
    }
  }
  double nmse() const { return ref2 > 0 ? err2 / ref2 : err2; }
  void check(const char* name, double max_beyond_share = 1e-3, double max_nmse = 1e-5) const {
    std::printf("%s: %zu values, %zu bit-exact, %zu within 1 bf16 ulp, %zu beyond; NMSE %.2e\n", name, n, exact, one_ulp,
                beyond, nmse());
    EXPECT_LE(static_cast<double>(beyond), max_beyond_share * static_cast<double>(n)) << name;
    EXPECT_LE(nmse(), max_nmse) << name;
  }
};

std::vector<float> bf16_normal(std::mt19937& rng, size_t n, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = quant::round_bf16(nd(rng));
  return v;
}

std::vector<float> nan_vec(size_t n) { return std::vector<float>(n, std::nanf("")); }

template <typename T>
std::vector<T> copy_back(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

struct AttnShape {
  int64_t S;
  int H;
  int64_t Dh, n_rows, width;
};

class ModelOpsCuda : public testing::CudaStreamTest {
 protected:
  // Sparse attention of random bf16 q, kv rows and sinks over lists whose entries entry(t, e,
  // rng, pick) makes (-1: none), rows split between two sources at n_rows / div (window rows ;
  // compressed cache): the GPU's output against the CPU's, into agree.
  template <typename Entry>
  void sparse_attn_case(const AttnShape& sh, std::mt19937& rng, int64_t div, const Entry& entry, Agreement* agree) {
    const std::vector<float> q = bf16_normal(rng, sh.S * sh.H * sh.Dh, 0.3f), kv = bf16_normal(rng, sh.n_rows * sh.Dh);
    const std::vector<float> sink = bf16_normal(rng, sh.H);
    std::vector<int32_t> idx(static_cast<size_t>(sh.S * sh.width));
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(sh.n_rows - 1));
    for (int64_t t = 0; t < sh.S; ++t) {
      for (int64_t e = 0; e < sh.width; ++e) idx[t * sh.width + e] = entry(t, e, rng, pick);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.Dh));
    std::vector<float> want(q.size());
    for (int64_t t = 0; t < sh.S; ++t) {
      attn::sparse_attn(&q[t * sh.H * sh.Dh], sh.H, sh.Dh, kv.data(), &idx[t * sh.width], sh.width, sink.data(), scale,
                        &want[t * sh.H * sh.Dh]);
    }
    float* d_o = dev(nan_vec(q.size()));
    const int64_t n_a = sh.n_rows / div;
    const float* d_kv = dev(kv);
    ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), dev(q), sh.S, sh.H, sh.Dh, d_kv, n_a, d_kv + n_a * sh.Dh, dev(idx), sh.width,
                                       dev(sink), scale, d_o).ok());
    sync();
    agree->add(want, to_host(d_o, want.size()), "sparse_attn Dh=" + std::to_string(sh.Dh));
  }
};

TEST_F(ModelOpsCuda, SparseAttentionMatchesCpu) {
  std::mt19937 rng(1);
  Agreement agree;
  for (const AttnShape& sh : {AttnShape{1, 1, 17, 5, 1}, AttnShape{3, 2, 31, 40, 17}, AttnShape{2, 3, 64, 300, 65},
                              AttnShape{1, 64, 512, 700, 640}, AttnShape{1, 64, 512, 700, 160},
                              AttnShape{1, 64, 512, 700, 300}, AttnShape{5, 4, 512, 257, 257},
                              AttnShape{17, 2, 128, 100, 200},
                              AttnShape{40, 64, 512, 700, 640},  // 40 rows: two passes of the split's scratch
                              AttnShape{1, 16, 512, 100, 64}, AttnShape{1, 32, 512, 700, 512},
                              AttnShape{1, 64, 512, 700, 65}, AttnShape{1, 16, 512, 1100, 1024},
                              AttnShape{1, 32, 512, 1100, 576},  // one row: 1, 8, 2, 16 and 9 chunks (sparse_tc)
                              AttnShape{1, 4, 64, 300, 200}, AttnShape{1, 20, 64, 100, 64}}) {  // heads not in sixteens
    sparse_attn_case(sh, rng, 3, [](int64_t, int64_t, std::mt19937& r, auto& pick) { return r() % 7 == 0 ? -1 : pick(r); },
                     &agree);
  }
  agree.check("sparse_attn");
}

// A decode row's list of 9 to 16 chunks takes a CTA a chunk where the device grants clusters of
// 16 (sparse_tc.cu; the H200 does) and two chunks a CTA in the portable cluster of 8
// (DSF_ATTN_TC_CLUSTER=8, as on a device without): each chunk's sums are the same either way,
// so the outputs are equal bit for bit.
TEST_F(ModelOpsCuda, WideClusterAttentionEqualsThePortableOne) {
  std::mt19937 rng(11);
  const int H = 64;
  const int64_t Dh = 512, n_rows = 1100;
  for (int64_t width : {513, 576, 640, 1000, 1024}) {
    const std::vector<float> q = bf16_normal(rng, H * Dh, 0.3f), kv = bf16_normal(rng, n_rows * Dh);
    const std::vector<float> sink = bf16_normal(rng, H);
    std::vector<int32_t> idx(static_cast<size_t>(width));
    for (int32_t& e : idx) e = rng() % 9 == 0 ? -1 : static_cast<int32_t>(rng() % n_rows);
    const float* d_q = dev(q);
    const float* d_kv = dev(kv);
    float* wide = dev(nan_vec(q.size()));
    float* portable = dev(nan_vec(q.size()));
    const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
    ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), d_q, 1, H, Dh, d_kv, 300, d_kv + 300 * Dh, dev(idx), width, dev(sink), scale, wide).ok());
    setenv("DSF_ATTN_TC_CLUSTER", "8", 1);
    const bool ok =
        attn::sparse_attn_cuda(ctx(), d_q, 1, H, Dh, d_kv, 300, d_kv + 300 * Dh, dev(idx), width, dev(sink), scale, portable).ok();
    unsetenv("DSF_ATTN_TC_CLUSTER");
    ASSERT_TRUE(ok);
    sync();
    const std::vector<float> a = to_host(wide, q.size()), b = to_host(portable, q.size());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "width " << width;
    for (float v : a) ASSERT_TRUE(std::isfinite(v)) << "width " << width;
  }
}

// The rows of a prefill chunk on the tensor-core kernel (sparse_tc.cu) each give what a call of
// that row alone gives, bit for bit: row t's q, list and RoPE position pos0 + t (lists of 1 to 16
// chunks, whole chunks of no entry, a row with none at all; heads in sixteens and not). The
// property is the tensor-core kernel's: skipped where a switch keeps rows off it.
TEST_F(ModelOpsCuda, AttentionRowsOnTheTensorCoresEqualOneRowCalls) {
  for (const char* off : {"DSF_ATTN_TC", "DSF_ATTN_TC_ROWS"}) {
    const char* v = std::getenv(off);
    if (v != nullptr && std::string(v) == "0") GTEST_SKIP() << off << "=0";
  }
  std::mt19937 rng(41);
  const int dims = 64;
  std::vector<float> freqs(dims / 2);
  for (int i = 0; i < dims / 2; ++i) freqs[i] = std::pow(10000.0f, -2.0f * i / dims);
  const float* df = dev(freqs);
  struct Case {
    int64_t S;
    int H;
    int64_t Dh, width;
  };
  for (const Case c : {Case{5, 64, 512, 640}, Case{3, 64, 512, 64}, Case{4, 32, 512, 1024}, Case{2, 16, 512, 300},
                       Case{6, 20, 64, 200}, Case{7, 4, 64, 65}}) {
    const int64_t n_rows = 1100, pos0 = 777;
    const std::vector<float> q = bf16_normal(rng, c.S * c.H * c.Dh, 0.3f), kv = bf16_normal(rng, n_rows * c.Dh);
    const std::vector<float> sink = bf16_normal(rng, c.H);
    std::vector<int32_t> idx(static_cast<size_t>(c.S * c.width));
    for (int64_t t = 0; t < c.S; ++t) {
      for (int64_t e = 0; e < c.width; ++e) {
        const bool none = t == 1 || (e >= 64 && e < 128) || rng() % 7 == 0;
        idx[t * c.width + e] = none ? -1 : static_cast<int32_t>(rng() % n_rows);
      }
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.Dh));
    const float *d_q = dev(q), *d_kv = dev(kv), *d_sink = dev(sink);
    const int32_t* d_idx = dev(idx);
    const int64_t n_a = 300, per_row = c.H * c.Dh;
    float *rows = dev(nan_vec(q.size())), *alone = dev(nan_vec(q.size()));
    const attn::AttnRope rope{df, dims, kernels::DevScalar(pos0)};
    ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), d_q, c.S, c.H, c.Dh, d_kv, n_a, d_kv + n_a * c.Dh, d_idx, c.width, d_sink,
                                       scale, rows, &rope)
                    .ok());
    for (int64_t t = 0; t < c.S; ++t) {
      const attn::AttnRope at{df, dims, kernels::DevScalar(pos0 + t)};
      ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), d_q + t * per_row, 1, c.H, c.Dh, d_kv, n_a, d_kv + n_a * c.Dh,
                                         d_idx + t * c.width, c.width, d_sink, scale, alone + t * per_row, &at)
                      .ok());
    }
    sync();
    const std::vector<float> a = to_host(rows, q.size()), b = to_host(alone, q.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(quant::f32_bits(a[i]), quant::f32_bits(b[i]))
          << "S=" << c.S << " H=" << c.H << " Dh=" << c.Dh << " width=" << c.width << " [" << i << "]";
      ASSERT_TRUE(std::isfinite(a[i])) << "[" << i << "]";
    }
  }
}

// Lists with whole chunks of no entry, a row with none at all and a single-chunk list, on
// shapes the split over chunks takes (heads in fours, Dh a multiple of 4): the chunks' partial
// results merged must agree with the CPU's running sum as the single-launch kernel does. On the
// H200 (132 SMs) the split's CTAs take 4 heads at 640 entries and 64 heads, 2 at 300 and 1 at
// fewer (heads_a_cta), so every form is covered.
TEST_F(ModelOpsCuda, SplitSparseAttentionHandlesEmptyChunks) {
  std::mt19937 rng(7);
  Agreement agree;
  for (const AttnShape& sh : {AttnShape{3, 8, 128, 90, 200}, AttnShape{2, 4, 64, 40, 64}, AttnShape{1, 64, 512, 300, 640},
                              AttnShape{1, 64, 512, 300, 300}}) {
    sparse_attn_case(sh, rng, 2,
                     [&](int64_t t, int64_t e, std::mt19937& r, auto& pick) {
                       const bool none = t == 1 || (e >= 64 && e < 128) || (sh.width > 128 && e >= sh.width - 70);
                       return none ? -1 : pick(r);
                     },
                     &agree);
  }
  agree.check("split sparse_attn");
}

// The window rows' finish in one launch (kv_rows_cuda) equals RMSNorm, RoPE and FP8 QDQ as
// separate launches bit for bit (rows of 64, 512 and 1056 values: the registers' and the
// loop's norm, 256 and 1024 threads; position from the host and from device memory), and a
// decode row lands in its ring slot with the other slots untouched. Bad shapes are refused.
TEST_F(ModelOpsCuda, FusedWindowRowsEqualTheOps) {
  std::mt19937 rng(29);
  for (const int64_t Dh : {64, 512, 1056}) {
    for (const int64_t S : {1, 3}) {
      const int dims = 64;
      const int64_t W = 5, pos0 = 13;
      const std::vector<float> kv = bf16_normal(rng, S * Dh, 3.0f), nw = bf16_normal(rng, Dh, 0.5f);
      std::vector<float> freqs(dims / 2);
      for (int i = 0; i < dims / 2; ++i) freqs[i] = std::pow(10000.0f, -2.0f * i / dims);
      float *a = dev(kv), *b = dev(kv), *dnw = dev(nw), *df = dev(freqs);
      const int64_t* dpos = dev(std::vector<int64_t>{pos0});
      const kernels::DevScalar pos = S == 1 ? kernels::DevScalar(0, dpos) : kernels::DevScalar(pos0);
      ASSERT_TRUE(rms_norm_cuda(ctx(), a, dnw, S, Dh, 1e-6f, a).ok());
      ASSERT_TRUE(rope::apply_cuda(ctx(), df, dims, a, S, Dh, pos, 1).ok());
      ASSERT_TRUE(qdq::fp8_e8m0_32_cuda(ctx(), a, S * Dh).ok());
      const std::vector<float> ring0 = bf16_normal(rng, W * Dh);
      float* ring = dev(ring0);
      ASSERT_TRUE(attn::kv_rows_cuda(ctx(), b, S, Dh, dnw, 1e-6f, df, dims, pos, S == 1 ? ring : nullptr, W).ok());
      sync();
      const std::vector<float> want = to_host(a, S * Dh), got = to_host(b, S * Dh), ring1 = to_host(ring, W * Dh);
      for (int64_t i = 0; i < S * Dh; ++i) {
        ASSERT_EQ(quant::f32_bits(got[i]), quant::f32_bits(want[i])) << "Dh=" << Dh << " S=" << S << " [" << i << "]";
      }
      for (int64_t r = 0; r < W; ++r) {
        for (int64_t d = 0; d < Dh; ++d) {
          const float expect = S == 1 && r == pos0 % W ? want[d] : ring0[r * Dh + d];
          ASSERT_EQ(quant::f32_bits(ring1[r * Dh + d]), quant::f32_bits(expect)) << "ring row " << r << " [" << d << "]";
        }
      }
    }
  }
  const std::vector<float> one(48, 1.0f);
  float* d = dev(one);
  EXPECT_EQ(attn::kv_rows_cuda(ctx(), d, 1, 48, d, 1e-6f, d, 16, 0, nullptr, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(attn::kv_rows_cuda(ctx(), d, 2, 32, d, 1e-6f, d, 16, 0, d, 1).code(), absl::StatusCode::kInvalidArgument);
}

// Sparse attention with its RoPE fused (AttnRope) equals RoPE of q, sparse attention and the
// inverse RoPE of o as separate launches bit for bit (heads of 64 and 512 values, 1 and 3
// query rows, position from the host and from device memory); q is left as it was. Bad RoPE
// dims are refused.
TEST_F(ModelOpsCuda, FusedRopeAttentionEqualsTheOps) {
  std::mt19937 rng(31);
  const int dims = 64;
  std::vector<float> freqs(dims / 2);
  for (int i = 0; i < dims / 2; ++i) freqs[i] = std::pow(10000.0f, -2.0f * i / dims);
  const float* df = dev(freqs);
  for (const int64_t Dh : {64, 512}) {
    for (const int64_t S : {1, 3}) {
      const int H = 4;
      const int64_t n_rows = 70, width = 50, pos0 = 1000;
      const std::vector<float> q = bf16_normal(rng, S * H * Dh, 0.3f), kv = bf16_normal(rng, n_rows * Dh);
      const std::vector<float> sink = bf16_normal(rng, H);
      std::vector<int32_t> idx(static_cast<size_t>(S * width));
      for (int32_t& j : idx) j = rng() % 9 == 0 ? -1 : static_cast<int32_t>(rng() % n_rows);
      const int64_t* dpos = dev(std::vector<int64_t>{pos0});
      const kernels::DevScalar pos = S == 1 ? kernels::DevScalar(0, dpos) : kernels::DevScalar(pos0);
      const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
      const float *d_kv = dev(kv), *d_sink = dev(sink);
      const int32_t* d_idx = dev(idx);
      float *qa = dev(q), *qb = dev(q), *oa = dev(nan_vec(q.size())), *ob = dev(nan_vec(q.size()));
      ASSERT_TRUE(rope::apply_cuda(ctx(), df, dims, qa, S * H, Dh, pos, H).ok());
      ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), qa, S, H, Dh, d_kv, 30, d_kv + 30 * Dh, d_idx, width, d_sink, scale, oa).ok());
      ASSERT_TRUE(rope::apply_cuda(ctx(), df, dims, oa, S * H, Dh, pos, H, true).ok());
      const attn::AttnRope fused{df, dims, pos};
      ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), qb, S, H, Dh, d_kv, 30, d_kv + 30 * Dh, d_idx, width, d_sink, scale, ob,
                                         &fused)
                      .ok());
      sync();
      const std::vector<float> want = to_host(oa, q.size()), got = to_host(ob, q.size()), q_after = to_host(qb, q.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(quant::f32_bits(got[i]), quant::f32_bits(want[i])) << "Dh=" << Dh << " S=" << S << " [" << i << "]";
        ASSERT_EQ(quant::f32_bits(q_after[i]), quant::f32_bits(q[i])) << "q written [" << i << "]";
      }
    }
  }
  const std::vector<float> one(64, 1.0f);
  const std::vector<int32_t> zero(1, 0);
  float* d = dev(one);
  const attn::AttnRope odd{df, 15, 0}, wide{df, 96, 0};
  EXPECT_EQ(attn::sparse_attn_cuda(ctx(), d, 1, 1, 64, d, 1, d, dev(zero), 1, d, 1.0f, d, &odd).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(attn::sparse_attn_cuda(ctx(), d, 1, 1, 64, d, 1, d, dev(zero), 1, d, 1.0f, d, &wide).code(),
            absl::StatusCode::kInvalidArgument);
}

// Sparse attention with its window entries made in the kernel (AttnWindow) equals the lists
// window_index_cuda and a copy of the top-k make, bit for bit: a prefill at 0, a decode step
// (position from device memory, early and wrapped rings), a later chunk; with and without a
// top-k part. A window wider than the lists is refused.
TEST_F(ModelOpsCuda, WindowListsInAttentionEqualTheIndexOp) {
  std::mt19937 rng(37);
  struct Case {
    int64_t S, pos0;
  };
  const int64_t W = 8, Dh = 64, n_comp = 40;
  const int H = 3;
  for (const Case c : {Case{3, 0}, Case{12, 0}, Case{1, 3}, Case{1, 29}, Case{4, 21}}) {
    for (const int64_t tw : {0, 7}) {
      const int64_t ww = c.pos0 == 0 ? std::min(c.S, W) : W, width = ww + tw;
      const int64_t n_a = c.pos0 == 0 ? c.S : (c.S == 1 ? W : W + c.S);
      const std::vector<float> q = bf16_normal(rng, c.S * H * Dh, 0.3f), kv = bf16_normal(rng, (n_a + n_comp) * Dh);
      const std::vector<float> sink = bf16_normal(rng, H);
      std::vector<int32_t> top(static_cast<size_t>(std::max<int64_t>(1, c.S * tw)));
      for (int32_t& j : top) j = rng() % 5 == 0 ? -1 : static_cast<int32_t>(n_a + rng() % n_comp);
      const int64_t* dpos = dev(std::vector<int64_t>{c.pos0});
      const kernels::DevScalar pos = c.S == 1 ? kernels::DevScalar(c.pos0, dpos) : kernels::DevScalar(c.pos0);
      const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
      const float *d_q = dev(q), *d_kv = dev(kv), *d_sink = dev(sink);
      const int32_t* d_top = dev(top);
      int32_t* idx = dev(std::vector<int32_t>(static_cast<size_t>(c.S * width), 123));
      ASSERT_TRUE(attn::window_index_cuda(ctx(), pos, c.S, W, idx, width).ok());
      if (tw > 0) {
        ASSERT_TRUE(kernels::copy_2d(ctx(), idx + ww, width * 4, d_top, tw * 4, tw * 4, c.S).ok());
      }
      float *oa = dev(nan_vec(q.size())), *ob = dev(nan_vec(q.size()));
      ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), d_q, c.S, H, Dh, d_kv, n_a, d_kv + n_a * Dh, idx, width, d_sink, scale, oa)
                      .ok());
      const attn::AttnWindow win{pos, W};
      ASSERT_TRUE(attn::sparse_attn_cuda(ctx(), d_q, c.S, H, Dh, d_kv, n_a, d_kv + n_a * Dh, tw > 0 ? d_top : nullptr,
                                         width, d_sink, scale, ob, nullptr, &win)
                      .ok());
      sync();
      const std::vector<float> want = to_host(oa, q.size()), got = to_host(ob, q.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(quant::f32_bits(got[i]), quant::f32_bits(want[i]))
            << "S=" << c.S << " pos0=" << c.pos0 << " tw=" << tw << " [" << i << "]";
      }
    }
  }
  const std::vector<float> one(64, 1.0f);
  float* d = dev(one);
  const attn::AttnWindow wide{kernels::DevScalar(5), 8};
  EXPECT_EQ(attn::sparse_attn_cuda(ctx(), d, 1, 1, 64, d, 1, d, nullptr, 4, d, 1.0f, d, nullptr, &wide).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelOpsCuda, PoolAndIndexScoresMatchCpu) {
  std::mt19937 rng(2);
  Agreement pool, scores;
  for (int64_t n : {1, 17, 512}) {
    const int64_t groups = 9;
    const std::vector<float> k = bf16_normal(rng, groups * 2 * n), s = bf16_normal(rng, groups * 2 * n, 2.0f);
    std::vector<float> want(static_cast<size_t>(groups * n));
    for (int64_t g = 0; g < groups; ++g) attn::pool_group(&k[g * 2 * n], &s[g * 2 * n], 2, n, &want[g * n]);
    float* d = dev(nan_vec(want.size()));
    ASSERT_TRUE(attn::pool_cuda(ctx(), dev(k), dev(s), groups, 2, n, d).ok());
    sync();
    pool.add(want, to_host(d, want.size()), "pool");
  }
  pool.check("pool_group");
  struct Shape {
    int64_t S;
    int Hi;
    int64_t Di, n_keys, pos0;
    int ratio;
  };
  size_t folded = 0;
  for (const Shape& sh : {Shape{1, 1, 17, 1, 0, 1}, Shape{3, 4, 31, 40, 37, 1}, Shape{5, 32, 128, 257, 510, 2},
                          Shape{1, 32, 128, 4096, 4095, 1}, Shape{17, 8, 64, 33, 16, 1}, Shape{2, 64, 128, 1000, 1500, 2},
                          Shape{3, 4, 64, 70, 100, 1}, Shape{1, 12, 32, 9, 20, 1}, Shape{2, 8, 256, 50, 60, 1}}) {
    const std::vector<float> q = bf16_normal(rng, sh.S * sh.Hi * sh.Di), keys = bf16_normal(rng, sh.n_keys * sh.Di);
    const std::vector<float> w = bf16_normal(rng, sh.S * sh.Hi, 0.1f);
    std::vector<float> want(static_cast<size_t>(sh.S * sh.n_keys)), ws(w.size());
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(sh.Di * sh.Hi));
    for (size_t i = 0; i < w.size(); ++i) ws[i] = quant::round_bf16(w[i] * w_scale);  // as the model scales them
    for (int64_t t = 0; t < sh.S; ++t) {
      attn::index_scores(&q[t * sh.Hi * sh.Di], sh.Hi, sh.Di, keys.data(), sh.n_keys, &ws[t * sh.Hi], &want[t * sh.n_keys]);
      for (int64_t j = (sh.pos0 + t + 1) / sh.ratio; j < sh.n_keys; ++j) want[t * sh.n_keys + j] = -INFINITY;
    }
    float* d = dev(nan_vec(want.size()));
    ASSERT_TRUE(attn::index_scores_cuda(ctx(), dev(q), sh.S, sh.Hi, sh.Di, dev(keys), sh.n_keys, dev(w), w_scale, sh.pos0, sh.ratio, d).ok());
    sync();
    const std::vector<float> got = to_host(d, want.size());
    scores.add(want, got, "index_scores");
    // Di a multiple of 32 up to 256 takes the four-keys kernel, whose dots fold across the warp
    // by warp_sum's xor tree: the same scores bit for bit as the one-key kernel.
    setenv("DSF_INDEX_FOLD", "0", 1);
    float* d1 = dev(nan_vec(want.size()));
    const bool ok = attn::index_scores_cuda(ctx(), dev(q), sh.S, sh.Hi, sh.Di, dev(keys), sh.n_keys, dev(w), w_scale, sh.pos0, sh.ratio, d1).ok();
    unsetenv("DSF_INDEX_FOLD");
    ASSERT_TRUE(ok);
    sync();
    const std::vector<float> one_key = to_host(d1, want.size());
    ASSERT_EQ(0, std::memcmp(got.data(), one_key.data(), got.size() * sizeof(float))) << "Hi " << sh.Hi << " Di " << sh.Di;
    folded += sh.Di % 32 == 0 && sh.Di <= 256;
  }
  EXPECT_EQ(folded, 7u);
  scores.check("index_scores");
}

// Selections are compared on identical inputs: they must be identical, ties included.
TEST_F(ModelOpsCuda, TopkAndCandidateMasksAreIdentical) {
  std::mt19937 rng(3);
  size_t rows_checked = 0;
  for (int64_t n : {1, 17, 31, 257, 4096, 70000}) {
    for (int64_t k : {int64_t{1}, std::min<int64_t>(n, 512), n}) {
      const int64_t rows = 3;
      std::vector<float> v(static_cast<size_t>(rows * n));
      for (size_t i = 0; i < v.size(); ++i) {
        const uint32_t r = rng() % 10;  // many exact ties, -inf, signed zeros
        v[i] = r == 0 ? -INFINITY : r == 1 ? -0.0f : r == 2 ? 0.0f : static_cast<float>(static_cast<int>(rng() % 50) - 25) / 4;
      }
      int32_t* d = dev(std::vector<int32_t>(static_cast<size_t>(rows * k), -7));
      ASSERT_TRUE(attn::topk_cuda(ctx(), dev(v), rows, n, k, d).ok());
      sync();
      const std::vector<int32_t> got = copy_back(d, static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<int32_t> want = attn::topk_ascending(&v[r * n], n, k);
        ASSERT_EQ(want, std::vector<int32_t>(got.begin() + r * k, got.begin() + (r + 1) * k)) << "n=" << n << " k=" << k;
        ++rows_checked;
      }
    }
  }
  // A graph's scores: the keys beyond the position are -inf (every one in the same radix bin),
  // the k-th largest inside the visible keys, on the boundary, or among the -inf keys.
  for (int64_t visible : {int64_t{0}, int64_t{3}, int64_t{700}, int64_t{2048}, int64_t{5000}}) {
    const int64_t n = 8192;
    std::vector<float> v = bf16_normal(rng, n);
    for (int64_t i = visible; i < n; ++i) v[i] = -INFINITY;
    for (int64_t i = 0; i < visible; i += 7) v[i] = 0.0f;  // ties, as relu'd scores give
    for (int64_t k : {int64_t{1}, int64_t{512}, int64_t{2048}, int64_t{6000}}) {
      int32_t* d = dev(std::vector<int32_t>(static_cast<size_t>(k), -7));
      ASSERT_TRUE(attn::topk_cuda(ctx(), dev(v), 1, n, k, d).ok());
      sync();
      ASSERT_EQ(attn::topk_ascending(v.data(), n, k), copy_back(d, static_cast<size_t>(k))) << "visible " << visible << " k " << k;
      ++rows_checked;
    }
  }
  // Rows whose keys past (pos0 + t + 1) / ratio count as -inf unread (topk_visible_cuda): the
  // values there are poison, the lists those of -inf written in their place.
  for (int ratio : {1, 2, 4}) {
    for (int64_t pos0 : {int64_t{0}, int64_t{5}, int64_t{3000}, int64_t{9000}}) {
      const int64_t S = 3, n = 2048;
      for (int64_t k : {int64_t{1}, int64_t{512}, int64_t{2000}}) {
        std::vector<float> v = bf16_normal(rng, S * n), ref = v;
        for (int64_t t = 0; t < S; ++t) {
          for (int64_t i = 0; i < n; i += 5) v[t * n + i] = ref[t * n + i] = 0.0f;  // ties
          for (int64_t i = std::min(n, (pos0 + t + 1) / ratio); i < n; ++i) {
            v[t * n + i] = i % 2 ? 1e30f : std::nanf("");  // not to be read
            ref[t * n + i] = -INFINITY;
          }
        }
        int32_t* d = dev(std::vector<int32_t>(static_cast<size_t>(S * k), -7));
        ASSERT_TRUE(attn::topk_visible_cuda(ctx(), dev(v), S, n, k, pos0, ratio, d).ok());
        sync();
        const std::vector<int32_t> got = copy_back(d, static_cast<size_t>(S * k));
        for (int64_t t = 0; t < S; ++t) {
          ASSERT_EQ(attn::topk_ascending(&ref[t * n], n, k), std::vector<int32_t>(got.begin() + t * k, got.begin() + (t + 1) * k))
              << "ratio " << ratio << " pos0 " << pos0 << " k " << k << " row " << t;
          ++rows_checked;
        }
      }
    }
  }
  EXPECT_FALSE(attn::topk_visible_cuda(ctx(), nullptr, 1, 4, 2, 0, -1, nullptr).ok());
  EXPECT_FALSE(attn::topk_cuda(ctx(), nullptr, 1, 4, 5, nullptr).ok());
  // The top-k of every key is every key in index order, whatever the scores: publish_topk with
  // no list (the model's shortcut where index_topk covers the keys) gives what it gives on
  // topk_cuda's list.
  for (int64_t n : {1, 31, 257}) {
    const int64_t S = 3, pos0 = std::max<int64_t>(0, 2 * n - 3), n_win = 5, ld = n + 2;  // the last key not yet visible to t = 0
    std::vector<float> v = bf16_normal(rng, S * n);
    v[0] = -INFINITY;
    int32_t* top = dev(std::vector<int32_t>(static_cast<size_t>(S * n), -7));
    ASSERT_TRUE(attn::topk_cuda(ctx(), dev(v), S, n, n, top).ok());
    int32_t* a = dev(std::vector<int32_t>(static_cast<size_t>(S * ld), -9));
    int32_t* b = dev(std::vector<int32_t>(static_cast<size_t>(S * ld), -9));
    ASSERT_TRUE(attn::publish_topk_cuda(ctx(), top, S, n, pos0, 2, n_win, a, ld).ok());
    ASSERT_TRUE(attn::publish_topk_cuda(ctx(), nullptr, S, n, pos0, 2, n_win, b, ld).ok());
    sync();
    const std::vector<int32_t> with_list = copy_back(a, static_cast<size_t>(S * ld));
    EXPECT_EQ(with_list, copy_back(b, static_cast<size_t>(S * ld))) << "n=" << n;
    if (n > 1) {
      EXPECT_EQ(with_list[0], n_win) << "n=" << n;  // key 0 (-inf) is still listed
    }
  }
  struct Shape {
    int64_t S, n, pos0;
    int ratio;
    int64_t top_blocks, block;
  };
  size_t masks = 0;
  for (const Shape& sh : {Shape{1, 1, 0, 1, 1, 8}, Shape{4, 100, 96, 1, 3, 8}, Shape{3, 4096, 8190, 2, 64, 8},
                          Shape{2, 70000, 69998, 1, 2048, 8}, Shape{5, 37, 30, 1, 5, 4}}) {
    std::vector<float> score = bf16_normal(rng, sh.S * sh.n);
    for (int64_t t = 0; t < sh.S; ++t) {
      for (int64_t j = (sh.pos0 + t + 1) / sh.ratio; j < sh.n; ++j) score[t * sh.n + j] = -INFINITY;
    }
    uint8_t* d = dev(std::vector<uint8_t>(static_cast<size_t>(sh.S * sh.n), 7));
    ASSERT_TRUE(attn::candidate_mask_cuda(ctx(), dev(score), sh.S, sh.n, sh.pos0, sh.ratio, sh.top_blocks, sh.block, d).ok());
    sync();
    const std::vector<uint8_t> got = copy_back(d, static_cast<size_t>(sh.S * sh.n));
    for (int64_t t = 0; t < sh.S; ++t) {
      const std::vector<uint8_t> want =
          attn::candidate_mask(&score[t * sh.n], sh.n, (sh.pos0 + t + 1) / sh.ratio, sh.top_blocks, sh.block);
      ASSERT_EQ(want, std::vector<uint8_t>(got.begin() + t * sh.n, got.begin() + (t + 1) * sh.n)) << "n=" << sh.n;
      ++masks;
    }
  }
  std::printf("topk: %zu rows identical; candidate masks: %zu rows identical\n", rows_checked, masks);
}

TEST_F(ModelOpsCuda, RoutingAndSwigluMatchCpu) {
  std::mt19937 rng(4);
  size_t routes = 0;
  // Up to 32 experts one a lane (route_lanes_kernel), more through shared memory (route_kernel).
  for (const auto& [E, K, S] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {17, 3, 5}, {16, 6, 7}, {32, 6, 9},
                                {32, 32, 2}, {33, 6, 3}, {256, 6, 31}, {384, 8, 4}}) {
    const std::vector<float> logits = bf16_normal(rng, S * E, 2.0f), bias = bf16_normal(rng, E, 0.1f);
    int32_t* de = dev(std::vector<int32_t>(static_cast<size_t>(S * K), -1));
    float* dw = dev(nan_vec(static_cast<size_t>(S * K)));
    ASSERT_TRUE(moe::route_cuda(ctx(), dev(logits), dev(bias), S, E, K, true, 2.5f, de, dw).ok());
    sync();
    const std::vector<int32_t> ge = copy_back(de, static_cast<size_t>(S * K));
    const std::vector<float> gw = to_host(dw, static_cast<size_t>(S * K));
    for (int64_t t = 0; t < S; ++t) {
      const moe::Route r = moe::route(&logits[t * E], bias.data(), E, K, true, 2.5f);
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(ge[t * K + k], r.experts[k]) << "E=" << E << " token " << t << " slot " << k;
        ASSERT_NEAR(gw[t * K + k], r.weights[k], 4e-7f * std::fabs(r.weights[k]) + 1e-30f);
      }
      ++routes;
    }
  }
  EXPECT_FALSE(moe::route_cuda(ctx(), nullptr, nullptr, 1, 4, 5, true, 1.0f, nullptr, nullptr).ok());
  Agreement sw;
  for (const auto& [S, F, limit] : {std::tuple<int64_t, int64_t, float>{1, 17, 0.0f}, {5, 2048, 7.0f}, {3, 257, 1.0f}}) {
    std::vector<float> a = bf16_normal(rng, S * F, 3.0f);
    const std::vector<float> b = bf16_normal(rng, S * F, 3.0f), w = bf16_normal(rng, S, 0.5f);
    float* da = dev(a);
    ASSERT_TRUE(moe::swiglu_cuda(ctx(), da, dev(b), S, F, limit, dev(w)).ok());
    sync();
    for (int64_t t = 0; t < S; ++t) moe::swiglu(&a[t * F], &b[t * F], F, limit, w[t]);
    sw.add(a, to_host(da, a.size()), "swiglu");
  }
  std::printf("route: %zu tokens, identical experts, weights within 4e-7 relative\n", routes);
  // The routed outputs summed per token in ascending expert order, from rows in route order.
  // K = 6 (the released model's) through the kernel compiled for it, K <= 8 loads every row at
  // once, larger K picks rows in turn: all against the definition.
  for (const int64_t K : {1, 6, 8, 9}) {
    const int64_t S = 3, D = 257;
    std::vector<int32_t> experts(static_cast<size_t>(S * K));
    for (int64_t t = 0; t < S; ++t) {
      std::vector<int32_t> ids(40);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::copy(ids.begin(), ids.begin() + K, experts.begin() + t * K);  // distinct ids in route order
    }
    const std::vector<float> y = bf16_normal(rng, S * K * D, 0.2f), shared = bf16_normal(rng, S * D);
    float* d = dev(nan_vec(S * D));
    ASSERT_TRUE(moe::combine_routed_cuda(ctx(), dev(y), dev(experts), dev(shared), S, K, D, d).ok());
    sync();
    std::vector<float> want(S * D);
    for (int64_t t = 0; t < S; ++t) {
      std::vector<int64_t> order(K);
      for (int64_t k = 0; k < K; ++k) order[k] = k;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return experts[t * K + a] < experts[t * K + b]; });
      for (int64_t dd = 0; dd < D; ++dd) {
        float acc = 0.0f;
        for (int64_t k : order) acc += y[(t * K + k) * D + dd];
        want[t * D + dd] = quant::round_bf16(acc + shared[t * D + dd]);
      }
    }
    const std::vector<float> got = to_host(d, want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(quant::f32_bits(got[i]), quant::f32_bits(want[i])) << i;
  }
  sw.check("swiglu");
}

TEST_F(ModelOpsCuda, EngramGateAndSplitMatchCpu) {
  std::mt19937 rng(5);
  Agreement hs;
  double worst_gate = 0;
  for (const auto& [D, S] : {std::pair<int64_t, int64_t>{1, 1}, {17, 3}, {257, 2}, {4096, 5}}) {
    const int C = 4;
    std::vector<float> h = bf16_normal(rng, S * C * D);
    const std::vector<float> kv = bf16_normal(rng, S * (C + 1) * D), qk = bf16_normal(rng, C * D);
    float* dh = dev(h);
    float* dg = dev(nan_vec(static_cast<size_t>(S * C)));
    ASSERT_TRUE(engram::gate_update_cuda(ctx(), dh, dev(kv), dev(qk), C, D, S, 1e-6f, dg).ok());
    sync();
    std::vector<float> gate(static_cast<size_t>(S * C));
    for (int64_t t = 0; t < S; ++t) {
      engram::gate_update(&h[t * C * D], &kv[t * (C + 1) * D], qk.data(), C, D, 1e-6f, &gate[t * C]);
    }
    hs.add(h, to_host(dh, h.size()), "engram h");
    const std::vector<float> gg = to_host(dg, gate.size());
    for (size_t i = 0; i < gate.size(); ++i) worst_gate = std::max(worst_gate, std::fabs(static_cast<double>(gg[i]) - gate[i]));
  }
  hs.check("engram gate_update h");
  std::printf("engram gates: max |gpu - cpu| %.2e\n", worst_gate);
  EXPECT_LT(worst_gate, 1e-5);
  // Sinkhorn split from the same mixes: the same math on both sides, fp32 rounding apart (C = 4:
  // the warp-per-token kernel; C = 6: one thread per token).
  for (const int C : {4, 6}) {
    const int M = (2 + C) * C, S = 33;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> m(static_cast<size_t>(S * M)), base(M);
    for (float& v : m) v = nd(rng);
    for (float& v : base) v = 0.3f * nd(rng);
    const std::vector<float> scale = {0.8f, 1.1f, 0.9f};
    float *dpre = dev(nan_vec(S * C)), *dpost = dev(nan_vec(S * C)), *dcomb = dev(nan_vec(S * C * C));
    ASSERT_TRUE(hc::split_cuda(ctx(), dev(m), dev(scale), dev(base), C, S, 20, 1e-6f, dpre, dpost, dcomb).ok());
    sync();
    const std::vector<float> gpre = to_host(dpre, S * C), gpost = to_host(dpost, S * C), gcomb = to_host(dcomb, S * C * C);
    double worst = 0;
    for (int t = 0; t < S; ++t) {
      const hc::Split sp = hc::split(&m[t * M], scale.data(), base.data(), C, 20, 1e-6f);
      for (int i = 0; i < C; ++i) {
        auto rel = [](float got, float want) { return std::fabs(static_cast<double>(got) - want) / std::fabs(want); };
        worst = std::max({worst, rel(gpre[t * C + i], sp.pre[i]), rel(gpost[t * C + i], sp.post[i])});
        for (int j = 0; j < C; ++j) worst = std::max(worst, rel(gcomb[(t * C + i) * C + j], sp.comb[i][j]));
      }
    }
    std::printf("hc split, C = %d: %d tokens, max relative difference %.2e\n", C, S, worst);
    EXPECT_LT(worst, 1e-5);
  }
}

// Embedding and Engram rows of the golden model, gathered on the device: bit-exact.
TEST_F(ModelOpsCuda, GatherRowsIsBitExactOnTheGoldenTables) {
  auto file = gguf::Model::open(testing::golden_dir() + "/tiny_a.gguf");
  ASSERT_TRUE(file.ok());
  size_t values = 0;
  for (const std::string name : {"token_embd.weight", "blk.1.engram_embd.weight", "output.weight"}) {
    const gguf::TensorInfo* t = (*file)->find_tensor(name);
    if (t == nullptr) continue;
    auto w = weight_view(**file, *t);
    ASSERT_TRUE(w.ok());
    const std::vector<uint8_t> raw(w->data, w->data + w->rows * w->row_bytes);
    std::mt19937_64 rng(6);
    std::vector<int64_t> ids = {0, w->rows - 1, -1, w->rows};
    for (int i = 0; i < 29; ++i) ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(w->rows)));
    float* d = dev(nan_vec(ids.size() * w->cols));
    ASSERT_TRUE(dequant::gather_rows_cuda(ctx(), w->type, dev(raw), w->cols, w->row_bytes, w->rows, dev(ids),
                                          static_cast<int64_t>(ids.size()), true, d).ok());
    sync();
    const std::vector<float> got = to_host(d, ids.size() * w->cols);
    std::vector<float> row(w->cols);
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool inside = ids[i] >= 0 && ids[i] < w->rows;
      if (inside) decode_weight_row(*w, ids[i], row.data());
      for (int64_t c = 0; c < w->cols; ++c) {
        const float g = got[i * w->cols + c];
        if (!inside) {
          ASSERT_TRUE(std::isnan(g)) << name << " id " << ids[i];
          continue;
        }
        ASSERT_EQ(quant::f32_bits(g), quant::f32_bits(quant::round_bf16(row[c]))) << name << " row " << ids[i] << " col " << c;
        ++values;
      }
    }
  }
  // Quantised tables (the released Engram and embedding rungs): encoded random rows.
  for (quant::GgmlType type : {quant::GgmlType::kQ2_K, quant::GgmlType::kQ4_K, quant::GgmlType::kQ8_0}) {
    const int64_t rows = 37, cols = 512;
    const quant::TypeTraits& tt = quant::traits(type);
    const uint64_t row_bytes = cols / tt.block_elems * tt.block_bytes;
    std::mt19937 rng(7);
    const std::vector<float> src = bf16_normal(rng, rows * cols);
    std::vector<uint8_t> raw(rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) ASSERT_TRUE(quant::encode_row(type, &src[r * cols], &raw[r * row_bytes], cols).ok());
    const std::vector<int64_t> ids = {36, 0, 5, 5, 20};
    float* d = dev(nan_vec(ids.size() * cols));
    ASSERT_TRUE(dequant::gather_rows_cuda(ctx(), type, dev(raw), cols, row_bytes, rows, dev(ids),
                                          static_cast<int64_t>(ids.size()), false, d).ok());
    sync();
    const std::vector<float> got = to_host(d, ids.size() * cols);
    std::vector<float> row(cols);
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(quant::decode_row(type, &raw[ids[i] * row_bytes], row.data(), cols).ok());
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(quant::f32_bits(got[i * cols + c]), quant::f32_bits(row[c])) << tt.name << " row " << ids[i];
        ++values;
      }
    }
  }
  std::printf("gather_rows: %zu golden and quantised values bit-exact\n", values);
  EXPECT_GT(values, 0u);
}

}  // namespace
}  // namespace dsflash::kernels
