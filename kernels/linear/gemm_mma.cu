// Prefill GEMMs (a call of 4 tokens or more) on the integer tensor cores, at fp32 accuracy: the
// decode GEMVs' scheme (gemv_mma.cu) with tokens in pairs on the mma's eight B columns.
//
// x is split once a call (split_tokens_kernel, a warp per (token, 256-column block)) into four
// exact radix-128 digits and a power-of-two scale S (digits.h), with the words of the mins'
// operand made from the digits' sub-block sums (mma_common.cuh). A CTA then takes 128 rows (a
// warp per 16) and 16 tokens; per block of columns it stages the 16 tokens' digits in shared
// memory, and each warp reads its rows' block once and runs the mma per pair of tokens: B's
// columns 0..3 are the first token's digits, 4..7 the second's, so lane t of the result holds
// token 2p + t / 2, digits 2 (t % 2) and 2 (t % 2) + 1. The K-quant sub-block scales are applied
// in int32 (Q4_K, Q6_K) or folded into the codes (Q2_K, Q3_K) as in the GEMVs; the mins (Q3_K: the
// scale offset) take two more mmas a pair, the low and the high radix-128 digits of the sub-block
// sums, whose int32 results add to the exact sums. Only the per-block conversion to float, the
// d / dmin / S products and the fp32 sum over blocks round.
#include <cuda_bf16.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/linear/linear_params.cuh"
#include "kernels/linear/mma_common.cuh"

namespace dsflash::kernels {
namespace {

using namespace dsflash::kernels::mma;
using quant::GgmlType;

constexpr int kWarpsG = 8;             // a CTA: 8 row groups of 16 rows
constexpr int kRowsG = 16 * kWarpsG;   // 128 rows
constexpr int kToksG = 16;             // tokens a CTA
constexpr int kPairs = kToksG / 2;
constexpr int kTokPitch = kDigits * kQRow;
constexpr int kMinsWords = 32;         // a (token, block)'s mins words (16 used for Q4_K)
constexpr int64_t kMaxSplitToks = 1024;  // tokens split at once (the split's scratch: ~1.2 KB a token and block)

// x split: per (token, block) item = token x n_blocks + block, its digits [4][256], its mins
// words [32] and S (at [item][0] of four floats: 16 bytes an item, one copy to a stage).
struct XSplit {
  int8_t* q;
  uint32_t* mins;
  float* scale;
  int64_t n_blocks;
};

template <int kSub>
__global__ void __launch_bounds__(256) split_tokens_kernel(const float* __restrict__ x, int64_t items, XSplit xs) {
  cuda::await_inputs();
  __shared__ __align__(16) int32_t sums[8][kDigits * 16];
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (item >= items) return;  // whole warps
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float S = split_block(x + item * 256, lane, xs.q + item * (kDigits * 256), 256, sums[warp]);
  __syncwarp();
  constexpr int kT = kSub == 32 ? 2 : 4;
  if (lane < 8 * kT) {
    const int g = lane / kT;
    xs.mins[item * kMinsWords + lane] = mins_word<kSub>(sums[warp] + 16 * (g & 3), g, lane % kT);
  }
  if (lane == 0) xs.scale[item * 4] = S;
}

// A lane's view of one pair of tokens: its token's digits weigh w0, w1 (lane t: digits
// 2 (t % 2), 2 (t % 2) + 1), and the mins' low and high words its B column takes (column g:
// the pair's token g / 4, digit g % 4; word (digit, part) of mins_word at kT words a digit).
struct PairLane {
  int g, t;
  float w0, w1;
  __device__ __forceinline__ float digits(int v0, int v1) const {
    return static_cast<float>(v0) * w0 + static_cast<float>(v1) * w1;
  }
  template <int kT>
  __device__ __forceinline__ uint2 mins_b(const uint32_t (*bm)[kMinsWords], int pair) const {
    if (t >= kT) return make_uint2(0u, 0u);
    const uint32_t* w = bm[2 * pair + (g >> 2)];
    return make_uint2(w[(g & 3) * kT + t], w[(4 + (g & 3)) * kT + t]);
  }
  // The low and high mins' results of columns 2t, 2t + 1: the exact sums, weighed as digits.
  __device__ __forceinline__ float mins(const int (&lo)[4], const int (&hi)[4], int r) const {
    return digits(lo[2 * r] + 128 * hi[2 * r], lo[2 * r + 1] + 128 * hi[2 * r + 1]);
  }
};

__device__ __forceinline__ uint2 b_digits(const int8_t* bq, const PairLane& ln, int pair, int col) {
  return *reinterpret_cast<const uint2*>(bq + (2 * pair + (ln.g >> 2)) * kTokPitch + (ln.g & 3) * kQRow + col +
                                         8 * ln.t);
}

// The mins' two mmas of one pair: A (k = sub-block) against the low and the high words.
template <int kT>
__device__ __forceinline__ void mins_mma(int (&lo)[4], int (&hi)[4], uint32_t am_a, uint32_t am_b,
                                         const uint32_t (*bm)[kMinsWords], const PairLane& ln, int pair) {
  const uint2 b = ln.mins_b<kT>(bm, pair);
  mma_s8(lo, am_a, am_b, 0u, 0u, make_uint2(b.x, 0u));
  mma_s8(hi, am_a, am_b, 0u, 0u, make_uint2(b.y, 0u));
}

// Q4_K: lane t takes columns 32s + 8t .. 8t + 7 of sub-block s (as Q4KBlock in gemv_mma.cu).
struct Q4KGemm {
  static constexpr int kBytes = 144, kSub = 32;
  static constexpr bool kTiled = false;
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const int8_t* bq,
                                             const uint32_t (*bm)[kMinsWords], const float (*bs)[4], const PairLane& ln,
                                             float (&acc)[kPairs][2]) {
    const Q4KHeader ha(ba), hb(bb);
    uint2 qa[4], qb[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      qa[c] = *reinterpret_cast<const uint2*>(ba + 16 + 32 * c + 8 * ln.t);
      qb[c] = *reinterpret_cast<const uint2*>(bb + 16 + 32 * c + 8 * ln.t);
    }
    const uint32_t am_a = ln.t == 0 ? ha.m_lo : ln.t == 1 ? ha.m_hi : 0u;
    const uint32_t am_b = ln.t == 0 ? hb.m_lo : ln.t == 1 ? hb.m_hi : 0u;
#pragma unroll
    for (int pr = 0; pr < kPairs; ++pr) {
      int v[4] = {0, 0, 0, 0};
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int c = s / 2, h = s % 2;
        int d[4] = {0, 0, 0, 0};
        mma_s8(d, nibbles(qa[c].x, h), nibbles(qb[c].x, h), nibbles(qa[c].y, h), nibbles(qb[c].y, h),
               b_digits(bq, ln, pr, 32 * s));
        v[0] += ha.sc(s) * d[0], v[1] += ha.sc(s) * d[1];
        v[2] += hb.sc(s) * d[2], v[3] += hb.sc(s) * d[3];
      }
      int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
      mins_mma<2>(lo, hi, am_a, am_b, bm, ln, pr);
      const float S = bs[2 * pr + (ln.t >> 1)][0];
      acc[pr][0] = acc_fma(acc[pr][0], S, scaled_diff(ha.d, ln.digits(v[0], v[1]), ha.dmin, ln.mins(lo, hi, 0)));
      acc[pr][1] = acc_fma(acc[pr][1], S, scaled_diff(hb.d, ln.digits(v[2], v[3]), hb.dmin, ln.mins(lo, hi, 1)));
    }
  }
};

// Q2_K: lane t takes columns 128n + 32j + 8t .. 8t + 7 (one sub-block's codes, its 4-bit scale
// folded in; as Q2KBlock in gemv_mma.cu). kTiled: ba is a (tile, block) of the tile layout.
template <bool kTiled_>
struct Q2KGemm {
  static constexpr bool kTiled = kTiled_;
  static constexpr int kBytes = kTiled ? tiles::kQ2KTile : tiles::kQ2KBlock, kSub = 16;
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const int8_t* bq,
                                             const uint32_t (*bm)[kMinsWords], const float (*bs)[4], const PairLane& ln,
                                             float (&acc)[kPairs][2]) {
    const Q2KRows rows = Q2KRows::load<kTiled>(ba, bb, ln.g, ln.t);
    uint32_t sca[4], scb[4];
    if constexpr (kTiled) {  // from the quad's lanes
#pragma unroll
      for (int k = 0; k < 4; ++k) sca[k] = rows.scale_word(0, k), scb[k] = rows.scale_word(1, k);
    } else {
      Q2KRows::scale_words(ba, sca);
      Q2KRows::scale_words(bb, scb);
    }
    uint32_t a[8][4];  // A of mma (n, j)
#pragma unroll
    for (int i = 0; i < 8; ++i) rows.a(i / 4, i % 4, sca, scb, a[i]);
    const uint32_t am_a = rows.mins_a(0), am_b = rows.mins_a(1);
    const uint32_t da = rows.d_dmin(0), db = rows.d_dmin(1);
#pragma unroll
    for (int pr = 0; pr < kPairs; ++pr) {
      int v[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        mma_s8(v, a[i][0], a[i][1], a[i][2], a[i][3], b_digits(bq, ln, pr, 128 * (i / 4) + 32 * (i % 4)));
      }
      int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
      mins_mma<4>(lo, hi, am_a, am_b, bm, ln, pr);
      const float S = bs[2 * pr + (ln.t >> 1)][0];
      acc[pr][0] = acc_fma(acc[pr][0], S, scaled_diff(half_lo(da), ln.digits(v[0], v[1]), half_hi(da), ln.mins(lo, hi, 0)));
      acc[pr][1] = acc_fma(acc[pr][1], S, scaled_diff(half_lo(db), ln.digits(v[2], v[3]), half_hi(db), ln.mins(lo, hi, 1)));
    }
  }
};

// Q3_K: the unsigned scale u = 8 uh + ul folded into the codes in two parts and the codes alone
// for the -32 (three mmas a 32-column step), the -4 from the sub-block sums (as Q3KBlock in
// gemv_mma.cu). kTiled: ba is a (tile, block) of the tile layout.
template <bool kTiled_>
struct Q3KGemm {
  static constexpr bool kTiled = kTiled_;
  static constexpr int kBytes = kTiled ? tiles::kQ3KTile : tiles::kQ3KBlock, kSub = 16;
  __device__ __forceinline__ static Q3KRow row(const uint8_t* blk, int r, int t) {
    if constexpr (kTiled) {
      return Q3KRow(Q3KTileView{blk, r}, t);
    } else {
      return Q3KRow(GgufBlockView{blk}, t);
    }
  }
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const int8_t* bq,
                                             const uint32_t (*bm)[kMinsWords], const float (*bs)[4], const PairLane& ln,
                                             float (&acc)[kPairs][2]) {
    const Q3KRow ra = row(ba, ln.g, ln.t), rb = row(bb, ln.g + 8, ln.t);
    uint32_t c[8][4];  // codes of step (n, j): row a k = 4t.., row b, row a k = 16 + 4t.., row b
    uint32_t sh[8], sl[8];  // the step's scale parts, rows a (bytes 0) and b (byte 1)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int s = 8 * n + 2 * j + (ln.t >> 1), i = 4 * n + j;
        c[i][0] = ra.codes(n, j, 0), c[i][1] = rb.codes(n, j, 0), c[i][2] = ra.codes(n, j, 1), c[i][3] = rb.codes(n, j, 1);
        sh[i] = static_cast<uint32_t>(ra.scale(s) >> 3) | static_cast<uint32_t>(rb.scale(s) >> 3) << 8;
        sl[i] = static_cast<uint32_t>(ra.scale(s) & 7) | static_cast<uint32_t>(rb.scale(s) & 7) << 8;
      }
    }
    const uint32_t ao_a = __vsub4(word_at(ra.u, ln.t), 0x20202020u), ao_b = __vsub4(word_at(rb.u, ln.t), 0x20202020u);
#pragma unroll
    for (int pr = 0; pr < kPairs; ++pr) {
      int vh[4] = {0, 0, 0, 0}, vl[4] = {0, 0, 0, 0}, vc[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint2 xv = b_digits(bq, ln, pr, 128 * (i / 4) + 32 * (i % 4));
        const uint32_t ha = sh[i] & 0xff, hb = sh[i] >> 8, la = sl[i] & 0xff, lb = sl[i] >> 8;
        mma_s8(vh, c[i][0] * ha, c[i][1] * hb, c[i][2] * ha, c[i][3] * hb, xv);
        mma_s8(vl, c[i][0] * la, c[i][1] * lb, c[i][2] * la, c[i][3] * lb, xv);
        mma_s8(vc, c[i][0], c[i][1], c[i][2], c[i][3], xv);
      }
      int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
      mins_mma<4>(lo, hi, ao_a, ao_b, bm, ln, pr);
      const float S = bs[2 * pr + (ln.t >> 1)][0];
      const auto total = [&](int k) { return 8 * vh[k] + vl[k] - 32 * vc[k]; };
      acc[pr][0] = acc_fma(acc[pr][0], S * ra.d, ln.digits(total(0), total(1)) - 4.0f * ln.mins(lo, hi, 0));
      acc[pr][1] = acc_fma(acc[pr][1], S * rb.d, ln.digits(total(2), total(3)) - 4.0f * ln.mins(lo, hi, 1));
    }
  }
};

// Q6_K (Q6KRow, mma_common.cuh): one mma.m16n8k16 a sub-block on the codes minus 32, its int32
// result scaled by the signed scale in int32 (as Q6KBlock in gemv_mma.cu); no mins. kTiled: ba
// is a (tile, block) of the tile layout, else the GGUF order's half-word pairs.
template <bool kTiled_>
struct Q6KGemm {
  static constexpr bool kTiled = kTiled_;
  static constexpr int kBytes = kTiled ? tiles::kQ6KTile : tiles::kQ6KBlock, kSub = 16;  // kSub: the split's form
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const int8_t* bq,
                                             const uint32_t (*)[kMinsWords], const float (*bs)[4], const PairLane& ln,
                                             float (&acc)[kPairs][2]) {
    Q6KRow ra, rb;
    if constexpr (kTiled) {
      Q6KRow::from_tile(ba, ln.g, ln.t, ra, rb);
    } else {
      ra = Q6KRow::load<false>(ba, ln.t), rb = Q6KRow::load<false>(bb, ln.t);
    }
    uint32_t ca[16], cb[16];  // A of sub-block s = 8n + 2j + h, rows a and b
    int sa[16], sb[16];
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      const int n = s / 8, j = (s % 8) / 2, h = s % 2;
      ca[s] = ra.codes(n, h, j), cb[s] = rb.codes(n, h, j), sa[s] = ra.scale(s), sb[s] = rb.scale(s);
    }
#pragma unroll
    for (int pr = 0; pr < kPairs; ++pr) {
      const int8_t* xq = bq + (2 * pr + (ln.g >> 2)) * kTokPitch + (ln.g & 3) * kQRow + 4 * ln.t;
      int v[4] = {0, 0, 0, 0};
#pragma unroll
      for (int s = 0; s < 16; ++s) {
        int d[4] = {0, 0, 0, 0};
        mma_s8_k16(d, ca[s], cb[s], *reinterpret_cast<const uint32_t*>(xq + 16 * s));
        v[0] += sa[s] * d[0], v[1] += sa[s] * d[1], v[2] += sb[s] * d[2], v[3] += sb[s] * d[3];
      }
      const float S = bs[2 * pr + (ln.t >> 1)][0];
      acc[pr][0] = acc_fma(acc[pr][0], S * ra.d, ln.digits(v[0], v[1]));
      acc[pr][1] = acc_fma(acc[pr][1], S * rb.d, ln.digits(v[2], v[3]));
    }
  }
};

// 16 bytes from global to shared memory without a register stop (zeros where !valid), and the
// waits for such copies: all but the latest group, or all.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// One block of columns for the CTA's tokens in shared memory: digits, mins words and S.
struct Stage {
  int8_t q[kToksG * kTokPitch];
  uint32_t mins[kToksG][kMinsWords];
  float scale[kToksG][4];  // S at [token][0]
};

// Starts the copies of block blk of tokens tok0 .. tok0 + n_t - 1 into st (tokens past n_t:
// zeros).
__device__ __forceinline__ void stage_block(Stage& st, const XSplit& xs, int64_t tok0, int n_t, int64_t blk) {
  for (int i = threadIdx.x; i < kToksG * 64; i += blockDim.x) {
    const int tk = i >> 6, piece = i & 63;
    const int64_t item = (tok0 + min(tk, n_t - 1)) * xs.n_blocks + blk;
    copy16(st.q + tk * kTokPitch + (piece >> 4) * kQRow + (piece & 15) * 16,
           xs.q + item * (kDigits * 256) + piece * 16, tk < n_t);
  }
  for (int i = threadIdx.x; i < kToksG * (kMinsWords / 4); i += blockDim.x) {
    const int tk = i / (kMinsWords / 4), piece = i % (kMinsWords / 4);
    const int64_t item = (tok0 + min(tk, n_t - 1)) * xs.n_blocks + blk;
    copy16(&st.mins[tk][4 * piece], xs.mins + item * kMinsWords + 4 * piece, tk < n_t);
  }
  if (threadIdx.x < kToksG) {
    const int tk = threadIdx.x;
    copy16(st.scale[tk], xs.scale + ((tok0 + min(tk, n_t - 1)) * xs.n_blocks + blk) * 4, tk < n_t);
  }
}

// y[tok0 + token][row] for 128 rows (blockIdx.y) and 16 tokens (blockIdx.x: the CTAs that share
// a weight tile run together, so its later reads hit L2) of the tokens split in xs. The next
// block's stage is copied while the warps multiply this one's (two stages).
template <class Blk>
__global__ void __launch_bounds__(kWarpsG * 32) gemm_mma_kernel(const LinearParams p, const XSplit xs, int64_t n_tok) {
  cuda::await_inputs();
  __shared__ __align__(16) Stage stages[2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
  const PairLane ln{lane >> 2, t, (t & 1) ? 0x1p-14f : 1.0f, (t & 1) ? 0x1p-21f : 0x1p-7f};
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsG + warp * 16, tok0 = static_cast<int64_t>(blockIdx.x) * kToksG;
  const int n_t = static_cast<int>(min(static_cast<int64_t>(kToksG), n_tok - tok0));
  // Tiles: rows r0 .. r0 + 15's (tile, block)s start where row r0 does (both pointers).
  const uint8_t* row_a = p.w + (Blk::kTiled ? r0 : min(r0 + ln.g, p.rows - 1)) * p.row_bytes;
  const uint8_t* row_b = Blk::kTiled ? row_a : p.w + min(r0 + ln.g + 8, p.rows - 1) * p.row_bytes;
  float acc[kPairs][2] = {};
  stage_block(stages[0], xs, tok0, n_t, 0);
  copies_commit();
  for (int64_t blk = 0; blk < xs.n_blocks; ++blk) {
    const int cur = static_cast<int>(blk & 1);
    if (blk + 1 < xs.n_blocks) {
      stage_block(stages[cur ^ 1], xs, tok0, n_t, blk + 1);
      copies_commit();
      copies_wait<1>();
    } else {
      copies_wait<0>();
    }
    __syncthreads();
    if (r0 < p.rows) {
      Blk::add(row_a + blk * Blk::kBytes, row_b + blk * Blk::kBytes, stages[cur].q, stages[cur].mins, stages[cur].scale,
               ln, acc);
    }
    __syncthreads();
  }
  // Lanes t and t ^ 1 hold the two halves of one token's digits.
#pragma unroll
  for (int pr = 0; pr < kPairs; ++pr) {
    acc[pr][0] += __shfl_xor_sync(0xffffffffu, acc[pr][0], 1);
    acc[pr][1] += __shfl_xor_sync(0xffffffffu, acc[pr][1], 1);
  }
  if ((t & 1) != 0 || r0 >= p.rows) return;
#pragma unroll
  for (int pr = 0; pr < kPairs; ++pr) {
    const int tk = 2 * pr + (t >> 1);
    if (tk >= n_t) continue;
    float* y = p.y + (tok0 + tk) * p.rows;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = r0 + ln.g + 8 * r;
      if (row < p.rows) y[row] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(acc[pr][r])) : acc[pr][r];
    }
  }
}

// DSF_GEMM_MMA=0, for measurement: the SIMT GEMM for every prefill linear.
bool gemm_mma_on() {
  static const bool on = cuda::env_int("DSF_GEMM_MMA", 1) != 0;
  return on;
}

template <class Blk>
Status run_gemm_mma(const LinearParams& p, cudaStream_t st) {
  const int64_t n_blocks = p.cols / 256;
  const int64_t chunk = std::min(p.n_tok, kMaxSplitToks);
  const size_t q_bytes = static_cast<size_t>(chunk * n_blocks) * kDigits * 256;
  const size_t m_bytes = static_cast<size_t>(chunk * n_blocks) * kMinsWords * 4;
  const size_t s_bytes = static_cast<size_t>(chunk * n_blocks) * 16;
  uint8_t* scratch = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(reinterpret_cast<void**>(&scratch), q_bytes + m_bytes + s_bytes, st));
  const XSplit xs{reinterpret_cast<int8_t*>(scratch), reinterpret_cast<uint32_t*>(scratch + q_bytes),
                  reinterpret_cast<float*>(scratch + q_bytes + m_bytes), n_blocks};
  const Status s = [&]() -> Status {
    for (int64_t t0 = 0; t0 < p.n_tok; t0 += chunk) {
      const int64_t n = std::min(chunk, p.n_tok - t0), items = n * n_blocks;
      RETURN_IF_ERROR(cuda::launch(split_tokens_kernel<Blk::kSub>,
                                   cuda::LaunchParams{dim3(static_cast<unsigned>((items + 7) / 8)), dim3(256), 0, st},
                                   p.x + t0 * p.cols, items, xs));
      LinearParams q = p;
      q.y = p.y + t0 * p.rows;
      const dim3 grid(static_cast<unsigned>((n + kToksG - 1) / kToksG),
                      static_cast<unsigned>((p.rows + kRowsG - 1) / kRowsG));
      RETURN_IF_ERROR(cuda::launch(gemm_mma_kernel<Blk>, cuda::LaunchParams{grid, dim3(kWarpsG * 32), 0, st}, q, xs, n));
    }
    return absl::OkStatus();
  }();
  (void)cudaFreeAsync(scratch, st);
  return s;
}

}  // namespace

bool gemm_mma_applies(GgmlType type, const LinearParams& p) {
  if (!gemm_mma_on() || p.cols % 256 != 0 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0) return false;
  if ((p.rows + kRowsG - 1) / kRowsG > 65535) return false;
  const uintptr_t w = reinterpret_cast<uintptr_t>(p.w);
  if (p.tiles) {
    return (type == GgmlType::kQ2_K || type == GgmlType::kQ3_K || type == GgmlType::kQ6_K) && w % 16 == 0 &&
           p.rows % tiles::kRows == 0;
  }
  switch (type) {
    case GgmlType::kQ4_K: return w % 16 == 0 && p.row_bytes % 16 == 0;
    case GgmlType::kQ2_K: return w % 4 == 0 && p.row_bytes % 4 == 0;
    case GgmlType::kQ3_K:
    case GgmlType::kQ6_K: return w % 2 == 0 && p.row_bytes % 2 == 0;
    default: return false;
  }
}

Status launch_gemm_mma(const ExecCtx& ctx, GgmlType type, const LinearParams& p) {
  if (!gemm_mma_applies(type, p)) {
    return absl::UnimplementedError(absl::StrCat("tensor-core GEMM: no kernel for ", quant::traits(type).name, " at ",
                                                 p.cols, " columns or this alignment"));
  }
  const cudaStream_t st = cuda::stream_of(ctx);
  switch (type) {
    case GgmlType::kQ4_K: return run_gemm_mma<Q4KGemm>(p, st);
    case GgmlType::kQ2_K: return p.tiles ? run_gemm_mma<Q2KGemm<true>>(p, st) : run_gemm_mma<Q2KGemm<false>>(p, st);
    case GgmlType::kQ6_K: return p.tiles ? run_gemm_mma<Q6KGemm<true>>(p, st) : run_gemm_mma<Q6KGemm<false>>(p, st);
    default: return p.tiles ? run_gemm_mma<Q3KGemm<true>>(p, st) : run_gemm_mma<Q3KGemm<false>>(p, st);
  }
}

}  // namespace dsflash::kernels
