// The tensor-core decode GEMVs' shared parts (gemv_mma.cu, gemv_preload.cu; device code and
// the launch helpers): x split into digits in a CTA's shared memory, a tile's rows multiplied
// on the integer tensor cores, the Q4_K block, and the launch's batch of products.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/linear/digits.h"
#include "kernels/linear/linear_params.cuh"
#include "kernels/linear/mma_common.cuh"

namespace dsflash::kernels::gemv_mma {

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

// The warp's row group: r0 (its first row), ba and bb where lane (g, t) reads rows g and g + 8
// at the warp's first block (mma_rows_at).
struct RowGroup {
  int64_t r0;
  const uint8_t *ba, *bb;
};

// The rows of the warp's group of one tile from the weights p.w (every row p.row_bytes long).
// dense_preload_kernel reads the same rows from shared memory (its own three lines: a shared
// helper here moved instructions in the streaming kernels, which could not be measured then).
template <class Block, int kSlices, int kCtaWarps>
__device__ __forceinline__ RowGroup global_rows(const LinearParams& p, int64_t tile) {
  constexpr int kGroups = kCtaWarps / kSlices;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, slice = warp % kSlices;
  const int64_t r0 = (tile * kGroups + warp / kSlices) * 16;
  const uint8_t* row_a = p.w + min(r0 + g, p.rows - 1) * p.row_bytes;
  const uint8_t* row_b = p.w + min(r0 + g + 8, p.rows - 1) * p.row_bytes;
  // Tiles (Block::kTiled): the (tile, block)s of rows r0 .. r0 + 15 start where row r0 does.
  const uint8_t* ba = (Block::kTiled ? p.w + r0 * p.row_bytes : row_a) + slice * Block::kBytes;
  const uint8_t* bb = (Block::kTiled ? ba : row_b + slice * Block::kBytes);
  return RowGroup{r0, ba, bb};
}

// The rows of one tile (kCtaWarps / kSlices row groups of 16): each lane's partial sums (rows
// g, g + 8) of each block from Block::add; the slices are summed in slice order (shared memory),
// so the result does not depend on timing. Ends with the CTA in step, so the next tile may
// reuse the partial sums' memory.
template <class Block, int kSlices, int kCtaWarps>
__device__ __forceinline__ void mma_rows_at(const LinearParams& p, const XDigits& x, int64_t n_blocks, RowGroup rg) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = warp % kSlices;
  const int t = lane & 3;
  const Lane ln{lane >> 2, t, t == 0 ? 1.0f : t == 1 ? 0x1p-14f : 0.0f, t == 0 ? 0x1p-7f : t == 1 ? 0x1p-21f : 0.0f};
  const int64_t r0 = rg.r0;
  const uint8_t *ba = rg.ba, *bb = rg.bb;
  float acc_a = 0.0f, acc_b = 0.0f;
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

template <class Block, int kSlices, int kCtaWarps>
__device__ __forceinline__ void mma_rows(const LinearParams& p, const XDigits& x, int64_t n_blocks, int64_t tile) {
  mma_rows_at<Block, kSlices, kCtaWarps>(p, x, n_blocks, global_rows<Block, kSlices, kCtaWarps>(p, tile));
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

template <int kSlices>
__host__ __device__ constexpr int cta_warps() {
  return kSlices > kWarps ? kSlices : kWarps;
}

// Products of one shape, each its own weights and x (blockIdx.y picks one).
struct MmaBatch {
  LinearParams p[kMaxGemvBatch];
  int64_t n_blocks;
  int tiles_per_cta;
  // dense_preload_kernel: its first `pre` tiles come into shared memory at w_offset, each row
  // `pitch` bytes apart.
  int pre;
  uint32_t pitch, w_offset;
};

// f.template operator()<s>() for a slice count s of slices_for (16, 8, 4, 2 or 1): the
// kernels' template argument from the launch's choice.
template <class F>
decltype(auto) with_slices(int s, F&& f) {
  switch (s) {
    case 16: return f.template operator()<16>();
    case 8: return f.template operator()<8>();
    case 4: return f.template operator()<4>();
    case 2: return f.template operator()<2>();
    default: return f.template operator()<1>();
  }
}

// Launch helpers (gemv_mma.cu).
// Warps per row group of a launch over n_blocks blocks and group_products (16-row group,
// product) pairs, at most max_slices.
int slices_for(int64_t n_blocks, int64_t group_products, int max_slices);
// The power of two in [1, 16] at most the variable `name` (16 where unset).
int slices_cap(const char* name);
// The most slices a dense Q4_K launch takes (DSF_MMA_Q4K_SLICES, 16 where unset).
int q4k_max_slices();
// Whether n products of rows x cols take the tensor cores (DSF_GEMV_MMA).
bool mma_pays(int64_t rows, int64_t cols, int n);

// The dense Q4_K GEMV whose CTAs preload their weight tiles (gemv_preload.cu): DSF_GEMV_PRELOAD's
// mode (0: off), and the launch of b's n products, false (nothing launched) where it preloads
// nothing or the weights are not 16-byte aligned.
int preload_mode();
StatusOr<bool> launch_preload(const MmaBatch& b, int n, cudaStream_t st);

}  // namespace dsflash::kernels::gemv_mma
