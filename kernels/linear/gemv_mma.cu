// Decode GEMVs (one token) on the integer tensor cores, without rounding x to 8 bits.
//
// Each CTA first splits x, per block of 256 columns, into a power-of-two scale S and four signed
// radix-128 digits (digits.h): x = S (q0 + q1 / 128 + q2 / 128^2 + q3 / 128^3) + e, |q| <= 64,
// every step exact in fp32, |e| <= max|x| 2^-27 (zero for |x| >= max|x| / 8), held in its shared
// memory (inputs of up to kMaxMmaBlocks blocks). The weight codes are exact small integers, so
// `mma.m16n8k32.s8` multiplies 16 rows by the four digits (the B operand's columns 0..3) and
// sums in int32 without rounding; the sub-block scales are applied in int32 too (Q4_K, Q6_K and
// Q3_K after each sub-block's mma, Q2_K folded into the codes), and the mins (Q3_K: its codes'
// offset) take one more mma a block, on the B columns 4..7 the digits leave empty
// (mins_table). Per block and row only the integer sums' conversion and the d / dmin products
// round (fp32), so a product is as close to the
// CPU's fp32 one as fp32 summation order allows (NMSE ~2e-13 in linear_cuda_test).
// What it saves against the fp32 kernels of gemv.cu: x is read once per 16 rows as 8-bit
// digits instead of once per row as floats (the fp32 Q4_K GEMV of a 1-row-per-warp shape had
// its L1 pipe 92 % busy), and a code costs a mask instead of a permute, a subtraction and an FMA.
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/linear/digits.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/linear_params.cuh"
#include "kernels/linear/mma_common.cuh"

namespace dsflash::kernels {
namespace {

using namespace dsflash::kernels::cuda;

using namespace dsflash::kernels::mma;

// x as digits in a CTA's shared memory, per 256-column block: four digit rows of 256 bytes,
// each padded to kQRow (a warp's 16 digit loads then hit distinct banks; the padding holds the
// mins' operand), the digits' sums per 16 columns (what that operand is made of) and S.
constexpr int kBlockSmem = kDigits * kQRow + kDigits * 16 * 4 + 4;
// The largest input: its digits, beside mma_rows' partial sums, in the 48 KB a CTA may take
// without opting in (8,704 columns; the released model's largest Q4_K input is 8,192).
constexpr int64_t kMaxMmaBlocks = (48 * 1024 - 2 * 1024) / kBlockSmem;

struct XDigits {
  int8_t* q;        // [block][digit][kQRow]
  int32_t* dsum16;  // [block][digit][16]
  float* scale;     // [block]
  __device__ __forceinline__ const int8_t* digit(int64_t blk, int g) const { return q + (blk * kDigits + g) * kQRow; }
  __device__ __forceinline__ const int32_t* sums(int64_t blk, int g) const { return dsum16 + (blk * kDigits + g) * 16; }
  // Word w (0..31) of a block's mins operand (mins_table), kept in the padding of the digit
  // rows (bytes 256 .. 287 of row w / 8, which no digit load reads).
  __device__ __forceinline__ uint32_t* mins_slot(int64_t blk, int w) const {
    return reinterpret_cast<uint32_t*>(q + (blk * kDigits + (w >> 3)) * kQRow + 256) + (w & 7);
  }
};

// The B operand of the mins' mma (Block::add) for every block, from the digits' 16-column
// sums. kSub: the type's sub-block columns (32: Q4_K, 8 sub-blocks; 16: Q2_K and Q3_K, 16).
// Lane (g, t) of the mma supplies k = 4t .. 4t + 3 of column g: word 2g + t (t < 2, kSub 32) or
// 4g + t (kSub 16) holds, for the sub-blocks s = 4t .. 4t + 3, byte by byte the low (g < 4) or
// high (g >= 4) radix-128 digit of digit g % 4's sum over sub-block s (|sum| <= 2048: low in
// [-64, 63], high in [-16, 16]).
template <int kSub>
__device__ __forceinline__ void mins_table(const XDigits& d, int64_t n_blocks) {
  constexpr int kT = kSub == 32 ? 2 : 4, kWords = 8 * kT;
  for (int64_t i = threadIdx.x; i < n_blocks * kWords; i += blockDim.x) {
    const int64_t blk = i / kWords;
    const int w = static_cast<int>(i % kWords), g = w / kT, t = w % kT;
    *d.mins_slot(blk, w) = mins_word<kSub>(d.sums(blk, g & 3), g, t);
  }
  __syncthreads();
}

// Splits x ([n_blocks][256], 16-byte aligned) into the CTA's shared memory, one warp per block
// (lane l: columns 8l .. 8l + 7), and returns where it lies once every warp has written it
// (and the mins' operand of kSub-column sub-blocks, mins_table; none for kSub 0).
template <int kSub>
__device__ __forceinline__ XDigits split_x(const float* x, int64_t n_blocks) {
  extern __shared__ __align__(16) uint8_t smem[];
  const XDigits d{reinterpret_cast<int8_t*>(smem), reinterpret_cast<int32_t*>(smem + n_blocks * kDigits * kQRow),
                  reinterpret_cast<float*>(smem + n_blocks * kDigits * (kQRow + 16 * 4))};
  const int lane = threadIdx.x & 31;
  for (int64_t blk = threadIdx.x >> 5; blk < n_blocks; blk += blockDim.x >> 5) {
    const float S = split_block(x + blk * 256, lane, d.q + blk * kDigits * kQRow, kQRow, d.dsum16 + blk * kDigits * 16);
    if (lane == 0) d.scale[blk] = S;
  }
  __syncthreads();
  if constexpr (kSub != 0) mins_table<kSub>(d, n_blocks);
  return d;
}

// Where a lane works. A warp takes 16 rows (lane (g, t): rows g and g + 8, the mma's A rows)
// and every kSlices-th block of them; a CTA holds kCtaWarps / kSlices such row groups. B's
// column g is digit g of x (lanes g >= 4: digit g - 4 again, lane_digits), so the int32
// result's columns 2t, 2t + 1 are digits 2t, 2t + 1 (lanes t >= 2: those copies); w0, w1 weigh
// them (128^-digit; 0 for t >= 2).
struct Lane {
  int g, t;
  float w0, w1;
  __device__ __forceinline__ float digits(int v0, int v1) const {
    return static_cast<float>(v0) * w0 + static_cast<float>(v1) * w1;
  }
  // The mins' results (columns 2t, 2t + 1 of mins_table's operand): the low radix-128
  // digit of digits 2t, 2t + 1 (t < 2) or the high one of digits 2t - 4, 2t - 3 (t >= 2).
  __device__ __forceinline__ float mins(int m0, int m1) const {
    const int e = t < 2 ? -14 * t : 7 - 14 * (t - 2);
    return static_cast<float>(m0) * exp2f_exact(e) + static_cast<float>(m1) * exp2f_exact(e - 7);
  }
  __device__ __forceinline__ static float exp2f_exact(int e) { return __int_as_float((e + 127) << 23); }
};

// Where lane (g, t) reads B, x's digit g, in block blk: at column kStride t of digit row g % 4.
// Lanes g >= 4 give B's columns 4..7, whose results land in lanes t >= 2 and are weighed by 0
// (Lane::digits), so they read a digit row too rather than zeros: no predicate on the loads.
template <int kStride>
__device__ __forceinline__ const int8_t* lane_digits(const XDigits& x, int64_t blk, const Lane& ln) {
  return x.digit(blk, ln.g & (kDigits - 1)) + kStride * ln.t;
}

// The rows of one tile (kCtaWarps / kSlices row groups of 16): each lane's partial sums (rows
// g, g + 8) of each block from Block::add; the slices are summed in slice order (shared memory),
// so the result does not depend on timing. Ends with the CTA in step, so the next tile may
// reuse the partial sums' memory.
template <class Block, int kSlices, int kCtaWarps>
__device__ __forceinline__ void mma_rows(const LinearParams& p, const XDigits& x, int64_t n_blocks, int64_t tile) {
  constexpr int kGroups = kCtaWarps / kSlices;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = warp % kSlices;
  const int t = lane & 3;
  const Lane ln{lane >> 2, t, t == 0 ? 1.0f : t == 1 ? 0x1p-14f : 0.0f, t == 0 ? 0x1p-7f : t == 1 ? 0x1p-21f : 0.0f};
  const int64_t r0 = (tile * kGroups + warp / kSlices) * 16;
  const uint8_t* row_a = p.w + min(r0 + ln.g, p.rows - 1) * p.row_bytes;
  const uint8_t* row_b = p.w + min(r0 + ln.g + 8, p.rows - 1) * p.row_bytes;
  float acc_a = 0.0f, acc_b = 0.0f;
  // Tiles (Block::kTiled): the (tile, block)s of rows r0 .. r0 + 15 start where row r0 does.
  const uint8_t* ba = (Block::kTiled ? p.w + r0 * p.row_bytes : row_a) + slice * Block::kBytes;
  const uint8_t* bb = (Block::kTiled ? ba : row_b + slice * Block::kBytes);
  for (int64_t blk = slice; r0 < p.rows && blk < n_blocks; blk += kSlices) {
    Block::add(ba, bb, x, blk, ln, &acc_a, &acc_b);
    ba += kSlices * Block::kBytes, bb += kSlices * Block::kBytes;
  }
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 1);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 1);
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 2);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 2);
  __shared__ float part[kCtaWarps][16];
  if (ln.t == 0) part[warp][ln.g] = acc_a, part[warp][ln.g + 8] = acc_b;
  __syncthreads();
  if (slice == 0 && lane < 16) {
    float y = part[warp][lane];
    for (int s = 1; s < kSlices; ++s) y += part[warp + s][lane];
    const int64_t row = r0 + lane;
    if (row < p.rows) p.y[row] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(y)) : y;
  }
  __syncthreads();
}

// A CTA's tiles: tiles_per_cta consecutive ones from blockIdx.x's first, on the digits split
// once (the split costs about as much as a tile of Q2_K rows).
template <class Block, int kSlices, int kCtaWarps>
__device__ __forceinline__ void mma_tiles(const LinearParams& p, const XDigits& x, int64_t n_blocks, int tiles_per_cta) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * tiles_per_cta;
  constexpr int64_t kTileRows = kCtaWarps / kSlices * 16;
  for (int64_t tile = first; tile < first + tiles_per_cta && tile * kTileRows < p.rows; ++tile) {
    mma_rows<Block, kSlices, kCtaWarps>(p, x, n_blocks, tile);
  }
}

// Q4_K (144-byte blocks: d, dmin, 12 bytes of 6-bit scales and mins, qs[128]). Sub-block
// s = 2c + h holds columns 32s + i with codes in nibble h of qs[32c + i]; lane t takes
// i = 8t .. 8t + 7 (one 8-byte load per row and c) as A's k = 4t.. and 16 + 4t.., and the
// same columns' digit g as B. The 6-bit scales are applied to each sub-block's int32 result.
struct Q4KBlock {
  static constexpr int kBytes = 144, kSub = 32;
  static constexpr bool kTiled = false;
  using Header = Q4KHeader;
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const XDigits& x, int64_t xblk,
                                             const Lane& ln, float* acc_a, float* acc_b) {
    const Header ha(ba), hb(bb);
    int va0 = 0, va1 = 0, vb0 = 0, vb1 = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint2 qa = *reinterpret_cast<const uint2*>(ba + 16 + 32 * c + 8 * ln.t);
      const uint2 qb = *reinterpret_cast<const uint2*>(bb + 16 + 32 * c + 8 * ln.t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * c + h;
        const uint2 xv = *reinterpret_cast<const uint2*>(lane_digits<8>(x, xblk, ln) + 32 * s);
        int d[4] = {0, 0, 0, 0};
        mma_s8(d, nibbles(qa.x, h), nibbles(qb.x, h), nibbles(qa.y, h), nibbles(qb.y, h), xv);
        va0 += ha.sc(s) * d[0], va1 += ha.sc(s) * d[1];
        vb0 += hb.sc(s) * d[2], vb1 += hb.sc(s) * d[3];
      }
    }
    // The mins, sum over sub-blocks of m_s times the digits' 32-column sums, on one more mma:
    // A row r holds its eight 6-bit mins at k = 0..7 (lane t's k = 4t..: t = 0 the first four,
    // t = 1 the last), B is mins_table's operand.
    const uint32_t bm = ln.t < 2 ? *x.mins_slot(xblk, 2 * ln.g + ln.t) : 0u;  // mins_table<32>
    const uint32_t am_a = ln.t == 0 ? ha.m_lo : ln.t == 1 ? ha.m_hi : 0u;
    const uint32_t am_b = ln.t == 0 ? hb.m_lo : ln.t == 1 ? hb.m_hi : 0u;
    int m[4] = {0, 0, 0, 0};
    mma_s8(m, am_a, am_b, 0u, 0u, make_uint2(bm, 0u));
    const float S = x.scale[xblk];
    *acc_a = acc_fma(*acc_a, S, scaled_diff(ha.d, ln.digits(va0, va1), ha.dmin, ln.mins(m[0], m[1])));
    *acc_b = acc_fma(*acc_b, S, scaled_diff(hb.d, ln.digits(vb0, vb1), hb.dmin, ln.mins(m[2], m[3])));
  }
};

// Q2_K (84-byte blocks, 4-byte aligned: scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin).
// Column 128n + 32j + l has code (qs[32n + l] >> 2j) & 3 in sub-block 8n + 2j + l / 16; lane t
// takes l = 8t .. 8t + 7 (two word loads per row and n, for all four j): one sub-block's codes,
// so its 4-bit scale is folded into A (a packed multiply: code x scale <= 45, no byte carries)
// and one int32 result gathers the whole block. The odd bit pairs' codes stay where they lie
// in their bytes (4 x, up to 180: unsigned A), a shift fewer a word, into a second sum
// (Q2KRows::a_pair). kTiled: the weight in the tile layout (tiles.h), ba a (tile, block).
template <bool kTiled_>
struct Q2KBlock {
  static constexpr bool kTiled = kTiled_;
  static constexpr int kBytes = kTiled ? tiles::kQ2KTile : tiles::kQ2KBlock, kSub = 16;
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const XDigits& x, int64_t xblk,
                                             const Lane& ln, float* acc_a, float* acc_b) {
    const Q2KRows rows = Q2KRows::load<kTiled>(ba, bb, ln.g, ln.t);
    int v[4] = {0, 0, 0, 0}, v4[4] = {0, 0, 0, 0};  // v4: the odd bit pairs' sums, 4 x theirs
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        uint32_t even[4], odd4[4];
        rows.a_pair(n, p, even, odd4);
        const int8_t* xd = lane_digits<8>(x, xblk, ln) + 128 * n + 64 * p;
        mma_u8s8(v, even[0], even[1], even[2], even[3], *reinterpret_cast<const uint2*>(xd));
        mma_u8s8(v4, odd4[0], odd4[1], odd4[2], odd4[3], *reinterpret_cast<const uint2*>(xd + 32));
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] += v4[i] >> 2;  // exact: v4 is 4 x an integer
    // The mins (m_s: the high nibble of scale byte s) on one more mma, A row r's k = s, B
    // mins_table<16>'s operand.
    int m[4] = {0, 0, 0, 0};
    mma_s8(m, rows.mins_a(0), rows.mins_a(1), 0u, 0u, make_uint2(*x.mins_slot(xblk, 4 * ln.g + ln.t), 0u));
    const uint32_t da = rows.d_dmin(0), db = rows.d_dmin(1);
    const float S = x.scale[xblk];
    *acc_a = acc_fma(*acc_a, S, scaled_diff(half_lo(da), ln.digits(v[0], v[1]), half_hi(da), ln.mins(m[0], m[1])));
    *acc_b = acc_fma(*acc_b, S, scaled_diff(half_lo(db), ln.digits(v[2], v[3]), half_hi(db), ln.mins(m[2], m[3])));
  }
};

// The 16 sub-blocks (16 columns each) of two rows' 256-column blocks on mma.m16n8k16, one a
// sub-block s = 8n + 2j + h: lane t's A is rows a and b's codes(n, h, j) at columns 16h + 4t ..
// 4t + 3 of (n, j)'s 32 (k = 4t..), B x's digits there; each int32 result is scaled by the
// row's scale(s) in int32. v: row a's sums for digits 2t, 2t + 1, then row b's (Lane::digits).
template <class Row>
__device__ __forceinline__ void k16_subblocks(const Row& ra, const Row& rb, const XDigits& x, int64_t xblk,
                                              const Lane& ln, int (&v)[4]) {
  v[0] = v[1] = v[2] = v[3] = 0;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int s = 8 * n + 2 * j + h;
        const uint32_t xv = *reinterpret_cast<const uint32_t*>(lane_digits<4>(x, xblk, ln) + 128 * n + 32 * j + 16 * h);
        int d[4] = {0, 0, 0, 0};
        mma_s8_k16(d, ra.codes(n, h, j), rb.codes(n, h, j), xv);
        const int ca = ra.scale(s), cb = rb.scale(s);
        v[0] += ca * d[0], v[1] += ca * d[1], v[2] += cb * d[2], v[3] += cb * d[3];
      }
    }
  }
}

// Block::add_rows<true> (word loads) where every lane's two blocks are 4-byte aligned, else
// add_rows<false> (half-word pairs) for the 2-byte aligned Q3_K and Q6_K blocks. A block's
// words share its alignment, so in rows of a length a multiple of 4 the even blocks take words.
// The choice is the warp's (a vote): the mma instructions need the whole warp on one path.
template <class Block>
__device__ __forceinline__ void add_by_alignment(const uint8_t* ba, const uint8_t* bb, const XDigits& x, int64_t xblk,
                                                 const Lane& ln, float* acc_a, float* acc_b) {
  const bool aligned = ((reinterpret_cast<uintptr_t>(ba) | reinterpret_cast<uintptr_t>(bb)) & 2) == 0;
  if (__all_sync(0xffffffffu, aligned)) {
    Block::template add_rows<true>(ba, bb, x, xblk, ln, acc_a, acc_b);
  } else {
    Block::template add_rows<false>(ba, bb, x, xblk, ln, acc_a, acc_b);
  }
}

// Q3_K (110-byte blocks, 2-byte aligned: hmask[32], qs[64], 12 bytes of 6-bit scales, d).
// Column 128n + 32j + l has code c = ((qs[32n + l] >> 2j) & 3) | (bit 4n + j of hmask[l]) << 2
// in sub-block s = 8n + 2j + l / 16 and value d (u_s - 32)(c - 4), u_s the unsigned 6-bit
// scale. As Q6KBlock multiplies: one mma.m16n8k16 a sub-block, lane t taking l = 16h + 4t ..
// 4t + 3 of (n, j)'s 32 columns (A: the codes c, 0..7, times 4^min(j, 2): their bits stay in
// place, a shift fewer a word), its int32 result scaled by (u_s - 32) 4^(2 - min(j, 2)) in
// int32 (so 16 x the sum, |16 x| < 2^30); the -4 comes from the digits' 16-column sums on one
// more mma. 16 + 1 mmas a block (the earlier form folded u_s into the codes in two parts on
// three m16n8k32 a 32 columns, 24 + 1; the same int32 sums, so bit for bit the same products):
// H200, perf preset pooled, graph step 6.94 / 6.99 against 7.00 / 7.01 ms (two interleaved
// rounds).
template <bool kTiled_>
struct Q3KBlock {
  static constexpr bool kTiled = kTiled_;
  static constexpr int kBytes = kTiled ? tiles::kQ3KTile : tiles::kQ3KBlock, kSub = 16;
  struct Row {
    // From the GGUF order (kAligned: word loads, else half-word pairs).
    template <bool kAligned>
    __device__ __forceinline__ static Row load(const uint8_t* blk, int t) {
      Row r;
      r.share_scales(Q3KRow::word_at<kAligned>(blk + 96 + 4 * (t & 1)), Q3KRow::word_at<kAligned>(blk + 104), t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        r.hm[h] = Q3KRow::word_at<kAligned>(blk + 16 * h + 4 * t);
#pragma unroll
        for (int n = 0; n < 2; ++n) r.qs[n][h] = Q3KRow::word_at<kAligned>(blk + 32 + 32 * n + 16 * h + 4 * t);
      }
      r.d = __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(blk + 108)));
      return r;
    }
    // Rows g (a) and g + 8 (b) from a (tile, block) (tiles.h): five loads a lane for both.
    __device__ __forceinline__ static void from_tile(const uint8_t* tile, int g, int t, Row& a, Row& b) {
      const int lane = 4 * g + t;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint4 c = *reinterpret_cast<const uint4*>(tile + 512 * n + 16 * lane);
        a.qs[n][0] = c.x, b.qs[n][0] = c.y, a.qs[n][1] = c.z, b.qs[n][1] = c.w;
      }
      const uint4 h = *reinterpret_cast<const uint4*>(tile + 1024 + 16 * lane);
      a.hm[0] = h.x, b.hm[0] = h.y, a.hm[1] = h.z, b.hm[1] = h.w;
      const uint2 lo = *reinterpret_cast<const uint2*>(tile + 1536 + 64 * (t & 1) + 8 * g);
      const uint2 hi = *reinterpret_cast<const uint2*>(tile + 1664 + 8 * g);
      const uint32_t dd = *reinterpret_cast<const uint32_t*>(tile + 1728 + 4 * g);
      a.share_scales(lo.x, hi.x, t);
      b.share_scales(lo.y, hi.y, t);
      a.d = half_lo(dd), b.d = half_hi(dd);
    }
    // Lane t forms scale word t from the scale bytes' words lo (96 + 4 (t & 1)) and hi (104);
    // the quad shares them.
    __device__ __forceinline__ void share_scales(uint32_t lo, uint32_t hi, int t) {
      const uint32_t own = Q3KRow::scale_of(lo, hi, t);
#pragma unroll
      for (int k = 0; k < 4; ++k) u[k] = __shfl_sync(0xffffffffu, own, k, 4);
    }
    // The codes of bit pair j, 4^e times (e = min(j, 2)): the qs bits masked where they lie
    // (j = 3: shifted down once), the hmask bit moved to just above them; at most 7 x 16.
    __device__ __forceinline__ uint32_t codes(int n, int h, int j) const {
      const int e = j < 2 ? j : 2, to = 2 * e + 2, from = 4 * n + j;
      const uint32_t lo = (j == 3 ? qs[n][h] >> 2 : qs[n][h]) & (0x03030303u << (2 * e));
      const uint32_t hi = to >= from ? hm[h] << (to - from) : hm[h] >> (from - to);
      return lo | (hi & (0x04040404u << (2 * e)));
    }
    // u_s - 32 times 4^(2 - e) of sub-block s's bit pair j (codes()): every sub-block's sum
    // comes out 16 x its own.
    __device__ __forceinline__ int scale(int s) const {
      const int j = (s % 8) / 2, m = 1 << (2 * (2 - (j < 2 ? j : 2)));
      return byte_of(u[s / 4], s % 4) * m - 32 * m;
    }
    uint32_t u[4], qs[2][2], hm[2];
    float d;
  };
  __device__ __forceinline__ static void add_pair(const Row& ra, const Row& rb, const XDigits& x, int64_t xblk,
                                                  const Lane& ln, float* acc_a, float* acc_b) {
    int v[4];
    k16_subblocks(ra, rb, x, xblk, ln, v);
    // The -4 offset: (u_s - 32) times the digits' sub-block sums, on one more mma (A row r's
    // k = s: its signed scales, bytewise; B mins_table<16>'s operand).
    int g[4] = {0, 0, 0, 0};
    mma_s8(g, __vsub4(word_at(ra.u, ln.t), 0x20202020u), __vsub4(word_at(rb.u, ln.t), 0x20202020u), 0u, 0u,
           make_uint2(*x.mins_slot(xblk, 4 * ln.g + ln.t), 0u));
    const float S = x.scale[xblk];
    // v: 16 x (Row::scale)
    *acc_a = acc_fma(*acc_a, S * ra.d, 0.0625f * ln.digits(v[0], v[1]) - 4.0f * ln.mins(g[0], g[1]));
    *acc_b = acc_fma(*acc_b, S * rb.d, 0.0625f * ln.digits(v[2], v[3]) - 4.0f * ln.mins(g[2], g[3]));
  }
  template <bool kAligned>
  __device__ __forceinline__ static void add_rows(const uint8_t* ba, const uint8_t* bb, const XDigits& x, int64_t xblk,
                                                  const Lane& ln, float* acc_a, float* acc_b) {
    add_pair(Row::template load<kAligned>(ba, ln.t), Row::template load<kAligned>(bb, ln.t), x, xblk, ln, acc_a, acc_b);
  }
  // Tiles: ba is the (tile, block). GGUF order: word loads on 4-byte aligned blocks (even ones,
  // in rows of 4-byte aligned length), else half-word pairs (add_by_alignment).
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const XDigits& x, int64_t xblk,
                                             const Lane& ln, float* acc_a, float* acc_b) {
    if constexpr (kTiled) {
      Row ra, rb;
      Row::from_tile(ba, ln.g, ln.t, ra, rb);
      add_pair(ra, rb, x, xblk, ln, acc_a, acc_b);
    } else {
      add_by_alignment<Q3KBlock>(ba, bb, x, xblk, ln, acc_a, acc_b);
    }
  }
};

// Q6_K (Q6KRow, mma_common.cuh): a scale times a code does not fit int8, so each sub-block
// takes its own mma.m16n8k16 on q - 32 as is and its int32 result is scaled in int32
// (|sum| < 2^27). No mins: the -32 is in the codes. kTiled: ba is a (tile, block) of the tile
// layout (tiles.h): nine loads a lane for both rows against 17 (word loads, even blocks) or 33
// (half-word pairs, the odd blocks of the 2-byte aligned GGUF rows); the same words, so the
// same products bit for bit.
template <bool kTiled_>
struct Q6KBlock {
  static constexpr bool kTiled = kTiled_;
  static constexpr int kBytes = kTiled ? tiles::kQ6KTile : tiles::kQ6KBlock, kSub = 0;
  __device__ __forceinline__ static void add_pair(const Q6KRow& ra, const Q6KRow& rb, const XDigits& x, int64_t xblk,
                                                  const Lane& ln, float* acc_a, float* acc_b) {
    int v[4];
    k16_subblocks(ra, rb, x, xblk, ln, v);
    const float S = x.scale[xblk];
    *acc_a = acc_fma(*acc_a, S * ra.d, ln.digits(v[0], v[1]));
    *acc_b = acc_fma(*acc_b, S * rb.d, ln.digits(v[2], v[3]));
  }
  template <bool kAligned>
  __device__ __forceinline__ static void add_rows(const uint8_t* ba, const uint8_t* bb, const XDigits& x, int64_t xblk,
                                                  const Lane& ln, float* acc_a, float* acc_b) {
    add_pair(Q6KRow::load<kAligned>(ba, ln.t), Q6KRow::load<kAligned>(bb, ln.t), x, xblk, ln, acc_a, acc_b);
  }
  // Tiles: one (tile, block) for both rows. GGUF order: word loads where the blocks are 4-byte
  // aligned, else half-word pairs (add_by_alignment).
  __device__ __forceinline__ static void add(const uint8_t* ba, const uint8_t* bb, const XDigits& x, int64_t xblk,
                                             const Lane& ln, float* acc_a, float* acc_b) {
    if constexpr (kTiled) {
      Q6KRow ra, rb;
      Q6KRow::from_tile(ba, ln.g, ln.t, ra, rb);
      add_pair(ra, rb, x, xblk, ln, acc_a, acc_b);
    } else {
      add_by_alignment<Q6KBlock>(ba, bb, x, xblk, ln, acc_a, acc_b);
    }
  }
};

template <int kSlices>
__host__ __device__ constexpr int cta_warps() {
  return kSlices > kWarps ? kSlices : kWarps;
}

// The CTAs a SM the experts' kernel of kCtaWarps warps is compiled to hold at once: 32
// resident warps a SM, at least 2 CTAs (__launch_bounds__' second argument; ptxas then holds
// the registers to 64: Q2_K 61, Q3_K 64 without spills, 80 and 3 CTAs as ptxas would choose).
// With 1 ptxas may take more (the Q2_K kernel took 79 once, a CTA fewer a SM: 1.52 -> 1.79 ms
// a token). More than 32 warps lost on the H200 (48 registers for 40: Q2_K gate/up 7.00 ->
// 7.43 ms a step, the dense Q4_K / Q6_K GEMVs 7.14, the head alone no change; eleventh
// session).
template <int kCtaWarps>
__host__ __device__ constexpr int min_ctas() {
  constexpr int kMinWarps = 32;
  return kMinWarps / kCtaWarps > 2 ? kMinWarps / kCtaWarps : 2;
}

// Products of one shape, each its own weights and x (blockIdx.y picks one).
struct MmaBatch {
  LinearParams p[kMaxGemvBatch];
  int64_t n_blocks;
  int tiles_per_cta;
};

template <class Block, int kSlices>
__global__ void __launch_bounds__(cta_warps<kSlices>() * 32) dense_mma_kernel(const __grid_constant__ MmaBatch b) {
  cuda::await_inputs();
  const LinearParams& p = b.p[blockIdx.y];
  const XDigits x = split_x<Block::kSub>(p.x, b.n_blocks);
  mma_tiles<Block, kSlices, cta_warps<kSlices>()>(p, x, b.n_blocks, b.tiles_per_cta);
}

// Experts chosen on the device: product k is expert ids[k]'s rows on x + k x_stride. With a
// second weight of the same shape (up beside gate, on one x), products n .. 2n - 1 are its
// experts ids[0 .. n) into y2.
struct ExpertMma {
  LinearParams p;  // expert 0's rows, product 0's x and y
  const int32_t* ids;
  int64_t expert_bytes, x_stride, y_stride;
  int64_t n_blocks;
  int n;              // products per weight
  const uint8_t* w2;  // the second weight's expert 0, or null
  float* y2;
  int64_t expert_bytes2;
  int tiles_per_cta;
};

// kCtaWarps: kExpertWarps (or more for more slices; DSF_EXPERT_WARPS=8, measurement: the
// earlier 8).
template <class Block, int kSlices, int kCtaWarps>
__global__ void __launch_bounds__(kCtaWarps * 32, (min_ctas<kCtaWarps>()))
    experts_mma_kernel(const __grid_constant__ ExpertMma b) {
  cuda::await_inputs();
  LinearParams p = b.p;
  int k = blockIdx.y;
  int64_t stride = b.expert_bytes;
  if (k >= b.n) k -= b.n, p.w = b.w2, p.y = b.y2, stride = b.expert_bytes2;
  p.w += static_cast<int64_t>(b.ids[k]) * stride;
  p.x += k * b.x_stride;
  p.y += k * b.y_stride;
  const XDigits x = split_x<Block::kSub>(p.x, b.n_blocks);
  mma_tiles<Block, kSlices, kCtaWarps>(p, x, b.n_blocks, b.tiles_per_cta);
}

// CTAs of `kernel` (threads each, smem bytes of dynamic shared memory) a SM holds; asked of the
// runtime once per (kernel, smem) and kept (the eager decode step launches ~250 of these).
StatusOr<int> resident_ctas(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find({kernel, smem});
  if (it != known.end()) return it->second;
  int per_sm = 0;
  if (cuda::carveout() >= 0) cuda::prefer_carveout(kernel);  // as the launch will have it
  CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  known[{kernel, smem}] = per_sm;
  return per_sm;
}

// The launch of K<kSlices> over n products of `rows`: one wave of resident CTAs, each taking
// as many tiles as that needs (rounded up: more tiles share one digit split, and a second,
// partial wave costs a whole CTA's time; H200, the routed experts' down, 480 tiles on 264
// resident CTAs: 1.23 -> 1.15 ms a token; the step 7.68 -> 7.57 ms). A launch of fewer tiles
// than a wave keeps one a CTA (wo_b at 2 tiles a CTA, 160 CTAs, took 8 % longer than 320 CTAs
// of one).
template <template <int> class K, int kSlices, typename Arg>
Status launch_slices(int64_t rows, int64_t n_blocks, int n, cudaStream_t st, Arg arg) {
  constexpr int kCtaWarps = K<kSlices>::kCtaWarps;
  constexpr int64_t kTileRows = kCtaWarps / kSlices * 16;  // as mma_tiles
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const size_t smem = static_cast<size_t>(n_blocks * kBlockSmem);
  ASSIGN_OR_RETURN(const int per_sm, resident_ctas(reinterpret_cast<const void*>(K<kSlices>::fn), kCtaWarps * 32, smem));
  const int64_t wave = std::max<int64_t>(1, static_cast<int64_t>(per_sm) * sm_count());
  arg.tiles_per_cta = static_cast<int>(std::max<int64_t>(1, (tiles * n + wave - 1) / wave));  // >= 1: rows may be 0
  const int64_t ctas = (tiles + arg.tiles_per_cta - 1) / arg.tiles_per_cta;
  return cuda::launch(K<kSlices>::fn,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(n)),
                                         dim3(kCtaWarps * 32), smem, st},
                      arg);
}

// Warps per row group (each takes every s-th block of the group's rows; a CTA sums them): the
// power of two up to 16 that loses the least, counting both ways to lose. A warp works
// ceil(n_blocks / s) blocks while the group waits for its slowest, so an s that does not divide
// n_blocks idles warps (20 blocks on 16 slices: 62 % busy; 9 on 8: 56 %); and fewer warps than
// ~32 a SM in all leave memory bandwidth unused. The larger s wins a tie. At most max_slices.
int slices_for(int64_t n_blocks, int64_t group_products, int max_slices) {
  static const int forced = [] {  // DSF_MMA_SLICES=s, for measurement: s wherever the blocks allow
    const long long s = env_int("DSF_MMA_SLICES", 0);
    return s == 1 || s == 2 || s == 4 || s == 8 || s == 16 ? static_cast<int>(s) : 0;
  }();
  if (forced > 0 && forced <= n_blocks) return forced;
  int best = 1;
  double best_score = -1.0;
  for (int s = max_slices; s >= 1; s /= 2) {
    if (s > n_blocks) continue;
    const double busy = static_cast<double>(n_blocks) / static_cast<double>(s * ((n_blocks + s - 1) / s));
    const double fill = std::min(1.0, static_cast<double>(group_products * s) / (32.0 * sm_count()));
    if (busy * fill > best_score + 1e-9) best = s, best_score = busy * fill;
  }
  return best;
}

template <template <int> class K, typename Arg>
Status launch_mma(int64_t rows, int64_t n_blocks, int n, cudaStream_t st, const Arg& arg, int max_slices = 16) {
  switch (slices_for(n_blocks, (rows + 15) / 16 * n, max_slices)) {
    case 16: return launch_slices<K, 16>(rows, n_blocks, n, st, arg);
    case 8: return launch_slices<K, 8>(rows, n_blocks, n, st, arg);
    case 4: return launch_slices<K, 4>(rows, n_blocks, n, st, arg);
    case 2: return launch_slices<K, 2>(rows, n_blocks, n, st, arg);
    default: return launch_slices<K, 1>(rows, n_blocks, n, st, arg);
  }
}

template <class Block>
struct DenseMma {
  template <int kSlices>
  struct K {
    static constexpr auto fn = dense_mma_kernel<Block, kSlices>;
    static constexpr int kCtaWarps = cta_warps<kSlices>();
  };
};
// The routed experts' CTAs: 16 warps (at 2 CTAs a SM, the same 32 resident warps), so each
// split of x serves twice the rows of 8 (the split was ~21 % of the Q2_K gate/up's
// instructions). H200, perf preset pooled, two interleaved rounds: graph step 6.74 / 6.78 ms
// against 6.87 / 6.90 with 8 (9ae9da0).
constexpr int kExpertWarps = 16;
template <class Block, int kMinCtaWarps>
struct ExpertsMma {
  template <int kSlices>
  struct K {
    static constexpr int kCtaWarps = cta_warps<kSlices>() > kMinCtaWarps ? cta_warps<kSlices>() : kMinCtaWarps;
    static constexpr auto fn = experts_mma_kernel<Block, kSlices, kCtaWarps>;
  };
};
// DSF_GEMV_MMA, for measurement: 0 the fp32 kernels only, 1 the tensor cores from ~4k (16-row
// group, block) pairs a launch, else (default 2) the tensor cores at every size.
int mma_mode() {
  static const int mode = static_cast<int>(env_int("DSF_GEMV_MMA", 2));
  return mode;
}

// Whether n products of rows x cols take the tensor cores: x's digits fit a CTA's shared
// memory (and in mode 1, the launch is large). The threshold of mode 1 was the default while
// the fp32 kernels were faster on the small products (H200: q_a 5120 -> 1280, kv 5120 -> 512,
// the shared expert's 2304 -> 5120); every size on the tensor cores now gives the shorter
// graph step (perf preset pooled: 7.03 against 7.14-7.15 ms at 9a2c817; 7.24-7.27 against
// 7.31-7.32 at 54dc8f7, on another machine).
bool mma_pays(int64_t rows, int64_t cols, int n) {
  // DSF_GEMV_MMA_MIN_PAIRS (measurement): mode 2's threshold, 0 by default.
  static const int64_t min_pairs = mma_mode() == 1 ? 4096 : env_int("DSF_GEMV_MMA_MIN_PAIRS", 0);
  if (cols / 256 > kMaxMmaBlocks || mma_mode() == 0) return false;
  return (rows + 15) / 16 * (cols / 256) * n >= min_pairs;
}

Status check_blocks(int64_t n_blocks) {
  if (n_blocks <= kMaxMmaBlocks) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor-core GEMV: ", n_blocks * 256, " columns exceed its ", kMaxMmaBlocks * 256));
}

// The power of two in [1, 16] at most the variable `name` (16 where unset): a cap on the
// slices slices_for may choose, for measurement.
int slices_cap(const char* name) {
  const long long v = env_int(name, 16);
  int m = 1;
  while (m < 16 && 2 * m <= v) m *= 2;
  return m;
}

// The routed experts' launch on CTAs of at least kMinCtaWarps warps, at most `max_slices`.
template <class Block, int kMinCtaWarps>
Status launch_experts(const ExpertMma& b, int64_t rows, int products, int max_slices, cudaStream_t st) {
  return launch_mma<ExpertsMma<Block, kMinCtaWarps>::template K>(rows, b.n_blocks, products, st, b, max_slices);
}

}  // namespace

bool gemv_mma_applies(const LinearParams* p, int n) { return mma_pays(p[0].rows, p[0].cols, n); }

Status launch_dense_mma(const ExecCtx& ctx, quant::GgmlType type, const LinearParams* p, int n) {
  MmaBatch b{};
  b.n_blocks = p[0].cols / 256;
  RETURN_IF_ERROR(check_blocks(b.n_blocks));
  for (int i = 0; i < n; ++i) b.p[i] = p[i];
  // At most 16 slices (DSF_MMA_Q4K_SLICES, for measurement). At 6cca49b 8 was better (the
  // attention output's products and the shared expert's gate and up 2.14 ms a token against
  // 2.48 at 16, a graph step 8.34 against 8.76 ms); since the chain's small kernels shrank, 16
  // gives the shorter graph step on the H200 (7.21-7.22 against 7.25-7.27 ms, three pairs of
  // runs, 157a826), though each launch alone is slower (wo_b 17.2 against 16.3 us under ncu).
  static const int max_slices = slices_cap("DSF_MMA_Q4K_SLICES");
  const cudaStream_t st = cuda::stream_of(ctx);
  if (type == quant::GgmlType::kQ6_K) {
    if (p[0].tiles) return launch_mma<DenseMma<Q6KBlock<true>>::K>(p[0].rows, b.n_blocks, n, st, b);
    return launch_mma<DenseMma<Q6KBlock<false>>::K>(p[0].rows, b.n_blocks, n, st, b);
  }
  return launch_mma<DenseMma<Q4KBlock>::K>(p[0].rows, b.n_blocks, n, st, b, max_slices);
}

bool mma_columns_fit(int64_t cols) { return cols > 0 && cols % 256 == 0 && cols / 256 <= kMaxMmaBlocks; }

bool experts_mma_applies(quant::GgmlType type, int64_t rows, int64_t cols, int n) {
  return (type == quant::GgmlType::kQ2_K || type == quant::GgmlType::kQ3_K) && mma_pays(rows, cols, n);
}

Status launch_experts_mma(const ExecCtx& ctx, quant::GgmlType type, const LinearParams& p, const int32_t* ids,
                          int64_t expert_bytes, int n, int64_t x_stride, int64_t y_stride, const uint8_t* w2, float* y2,
                          int64_t expert_bytes2) {
  const int products = w2 != nullptr ? 2 * n : n;
  if (n > kMaxGemvBatch) return absl::InvalidArgumentError(absl::StrCat("launch_experts_mma: ", n, " products"));
  if (w2 != nullptr && x_stride != 0) return absl::InvalidArgumentError("launch_experts_mma: two weights need one x");
  const ExpertMma b{p, ids, expert_bytes, x_stride, y_stride, p.cols / 256, n, w2, y2, expert_bytes2, 1};
  RETURN_IF_ERROR(check_blocks(b.n_blocks));
  const cudaStream_t st = cuda::stream_of(ctx);
  static const bool narrow = env_int("DSF_EXPERT_WARPS", kExpertWarps) == kWarps;
  static const int max_slices = slices_cap("DSF_EXPERT_SLICES");
  if (p.tiles && p.rows % tiles::kRows != 0) {
    return absl::InvalidArgumentError(absl::StrCat("launch_experts_mma: tiles of ", p.rows, " rows"));
  }
  const auto run = [&]<class Block>() {
    if (narrow) return launch_experts<Block, kWarps>(b, p.rows, products, max_slices, st);
    return launch_experts<Block, kExpertWarps>(b, p.rows, products, max_slices, st);
  };
  if (type == quant::GgmlType::kQ3_K) {
    return p.tiles ? run.template operator()<Q3KBlock<true>>() : run.template operator()<Q3KBlock<false>>();
  }
  return p.tiles ? run.template operator()<Q2KBlock<true>>() : run.template operator()<Q2KBlock<false>>();
}

}  // namespace dsflash::kernels
