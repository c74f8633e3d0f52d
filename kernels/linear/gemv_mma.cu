// Decode GEMVs (one token) on the integer tensor cores, without rounding x to 8 bits.
//
// x is first split, per block of 256 columns, into a power-of-two scale S and four signed
// radix-128 digits: x = S (q0 + q1 / 128 + q2 / 128^2 + q3 / 128^3) + e, |q| <= 64, with every
// step exact in fp32 and |e| <= S 2^-22 <= max|x| 2^-27 (zero for values within 2^9 of the
// block's largest: their 24 bits are all taken). The weight codes are exact small integers, so
// `mma.m16n8k32.s8` multiplies 16 rows by the four digits (the B operand's columns 0..3) and
// sums in int32 without rounding; the sub-block scales are applied in int32 too. Per block and
// row only the digit sums' conversion and the d / dmin products round (fp32), so a product is
// as close to the CPU's fp32 one as fp32 summation order allows (linear_cuda_test's bound).
// What it saves against the fp32 kernels of gemv.cu: x is read once per 16 rows as 8-bit
// digits instead of once per row as floats (the fp32 Q4_K GEMV of a 1-row-per-warp shape had
// its L1 pipe 92 % busy), and a code costs a mask instead of a permute, a subtraction and an FMA.
#include <cuda_bf16.h>

#include <cstdlib>
#include <string_view>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/ggml_blocks.cuh"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/linear_params.cuh"

namespace dsflash::kernels {
namespace {

using namespace dsflash::kernels::cuda;

constexpr int kDigits = 4;
constexpr int kBlockBytesQ4K = 144;

// x of each distinct input as digits: per 256-column block (product-major), 4 x 256 digit
// bytes, the digits' sums per 32-column sub-block, and S.
struct XDigits {
  int8_t* q;      // [block][digit][256]
  int32_t* dsum;  // [block][digit][8]
  float* scale;   // [block]
};

struct XInputs {
  const float* x[kMaxGemvBatch];
};

// One warp per 256-column block: lane l holds columns 8l .. 8l + 7.
__global__ void __launch_bounds__(kWarps * 32) xdigits_kernel(const __grid_constant__ XInputs in, int64_t n_blocks,
                                                              XDigits out) {
  const int lane = threadIdx.x & 31;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (blk >= n_blocks) return;
  const float4* x4 = reinterpret_cast<const float4*>(in.x[blockIdx.y] + blk * 256 + 8 * lane);
  const float4 u = x4[0], w = x4[1];
  const float v[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
  float amax = 0.0f;
  bool lane_finite = true;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i])), lane_finite = lane_finite && isfinite(v[i]);
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  // S = 2^(e - 5) puts max|x| / S in [32, 64): q0 within [-64, 64]. A NaN or infinity in the
  // block makes S NaN (fmaxf skips NaN, hence the vote), so every row's product is NaN.
  const bool finite = __all_sync(0xffffffffu, lane_finite);
  const int e = amax > 0.0f && finite ? ilogbf(amax) : 0;
  uint32_t words[kDigits][2] = {};
  int sums[kDigits] = {};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float r = finite ? ldexpf(v[i], 5 - e) : 0.0f;
#pragma unroll
    for (int j = 0; j < kDigits; ++j) {
      const float q = rintf(r);
      r = (r - q) * 128.0f;
      const int qi = static_cast<int>(q);
      words[j][i / 4] |= (static_cast<uint32_t>(qi) & 0xffu) << (8 * (i % 4));
      sums[j] += qi;
    }
  }
  const int64_t base = (static_cast<int64_t>(blockIdx.y) * n_blocks + blk);
#pragma unroll
  for (int j = 0; j < kDigits; ++j) {
    *reinterpret_cast<uint2*>(out.q + (base * kDigits + j) * 256 + 8 * lane) = make_uint2(words[j][0], words[j][1]);
    int s = sums[j];  // the sub-block's four lanes
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if ((lane & 3) == 0) out.dsum[(base * kDigits + j) * 8 + lane / 4] = s;
  }
  if (lane == 0) out.scale[base] = finite ? ldexpf(1.0f, e - 5) : __int_as_float(0x7fc00000);
}

struct MmaBatch {
  LinearParams p[kMaxGemvBatch];
  int xi[kMaxGemvBatch];  // product -> its input's index in x
  XDigits x;
  int64_t n_blocks;
};

__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

__device__ __forceinline__ uint32_t nibbles(uint32_t w, int hi) { return (hi ? w >> 4 : w) & 0x0f0f0f0fu; }
__device__ __forceinline__ int byte_of(uint32_t w, int k) { return static_cast<int>((w >> (8 * k)) & 0xffu); }

// A Q4_K block's header (one 16-byte load): d, dmin, and the eight 6-bit scales and mins
// (sub-blocks 0..3 in lo, 4..7 in hi) as bytes.
struct Q4KHeader {
  __device__ __forceinline__ explicit Q4KHeader(const uint8_t* blk) {
    const uint4 h = *reinterpret_cast<const uint4*>(blk);
    d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xffffu)));
    dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x >> 16)));
    sc_lo = h.y & 0x3f3f3f3fu;
    m_lo = h.z & 0x3f3f3f3fu;
    sc_hi = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);
    m_hi = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);
  }
  __device__ __forceinline__ int sc(int s) const { return byte_of(s < 4 ? sc_lo : sc_hi, s % 4); }
  __device__ __forceinline__ int m(int s) const { return byte_of(s < 4 ? m_lo : m_hi, s % 4); }
  float d, dmin;
  uint32_t sc_lo, m_lo, sc_hi, m_hi;
};

// Q4_K. A warp takes 16 rows (lane (g, t): rows g and g + 8) and every kSlices-th block; a
// CTA holds kCtaWarps / kSlices such row groups. Per block and sub-block s = 2c + h (columns
// 32s + i, codes in nibble h of qs[32c + i]), lane t holds codes i = 8t .. 8t + 7 of its rows
// (one 8-byte load per row and c) as A's k = 4t.. and 16 + 4t.., and digit g of the same x
// columns as B's column g (lanes g >= 4: zero). The int32 result's columns 2t, 2t + 1 are
// digits 2t, 2t + 1 (t < 2).
template <int kSlices, int kCtaWarps = (kSlices > kWarps ? kSlices : kWarps)>
__global__ void __launch_bounds__(kCtaWarps * 32) q4k_mma_kernel(const __grid_constant__ MmaBatch b) {
  constexpr int kGroups = kCtaWarps / kSlices;
  const LinearParams& p = b.p[blockIdx.y];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int slice = warp % kSlices;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kGroups + warp / kSlices) * 16;
  const int64_t xb = static_cast<int64_t>(b.xi[blockIdx.y]) * b.n_blocks;
  const uint8_t* row_a = p.w + min(r0 + g, p.rows - 1) * p.row_bytes;
  const uint8_t* row_b = p.w + min(r0 + g + 8, p.rows - 1) * p.row_bytes;
  // Weights of digit columns 2t, 2t + 1 (128^-digit; lanes t >= 2 hold zero columns).
  const float w0 = t == 0 ? 1.0f : t == 1 ? 0x1p-14f : 0.0f, w1 = t == 0 ? 0x1p-7f : t == 1 ? 0x1p-21f : 0.0f;
  float acc_a = 0.0f, acc_b = 0.0f;
  for (int64_t blk = slice; r0 < p.rows && blk < b.n_blocks; blk += kSlices) {
    const uint8_t* ba = row_a + blk * kBlockBytesQ4K;
    const uint8_t* bb = row_b + blk * kBlockBytesQ4K;
    const int8_t* xq = b.x.q + (xb + blk) * kDigits * 256;
    const Q4KHeader sa(ba), sb(bb);
    int va0 = 0, va1 = 0, vb0 = 0, vb1 = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint2 qa = *reinterpret_cast<const uint2*>(ba + 16 + 32 * c + 8 * t);
      const uint2 qb = *reinterpret_cast<const uint2*>(bb + 16 + 32 * c + 8 * t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * c + h;
        const uint2 xv = g < kDigits ? __ldg(reinterpret_cast<const uint2*>(xq + g * 256 + 32 * s + 8 * t)) : make_uint2(0, 0);
        int d[4] = {0, 0, 0, 0};
        mma_s8(d, nibbles(qa.x, h), nibbles(qb.x, h), nibbles(qa.y, h), nibbles(qb.y, h), xv);
        va0 += sa.sc(s) * d[0];
        va1 += sa.sc(s) * d[1];
        vb0 += sb.sc(s) * d[2];
        vb1 += sb.sc(s) * d[3];
      }
    }
    // The mins: sum over sub-blocks of m_s times the digit sums of columns 2t, 2t + 1.
    int ma0 = 0, ma1 = 0, mb0 = 0, mb1 = 0;
    if (t < 2) {
      const int4* ds = reinterpret_cast<const int4*>(b.x.dsum + ((xb + blk) * kDigits + 2 * t) * 8);
      const int4 e0 = __ldg(ds), e1 = __ldg(ds + 1), f0 = __ldg(ds + 2), f1 = __ldg(ds + 3);
      const int d0[8] = {e0.x, e0.y, e0.z, e0.w, e1.x, e1.y, e1.z, e1.w};
      const int d1[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        ma0 += sa.m(s) * d0[s];
        ma1 += sa.m(s) * d1[s];
        mb0 += sb.m(s) * d0[s];
        mb1 += sb.m(s) * d1[s];
      }
    }
    const float S = __ldg(b.x.scale + xb + blk);
    const float fa = static_cast<float>(va0) * w0 + static_cast<float>(va1) * w1;
    const float fb = static_cast<float>(vb0) * w0 + static_cast<float>(vb1) * w1;
    const float ga = static_cast<float>(ma0) * w0 + static_cast<float>(ma1) * w1;
    const float gb = static_cast<float>(mb0) * w0 + static_cast<float>(mb1) * w1;
    acc_a += S * (sa.d * fa - sa.dmin * ga);
    acc_b += S * (sb.d * fb - sb.dmin * gb);
  }
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 1);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 1);
  acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 2);
  acc_b += __shfl_xor_sync(0xffffffffu, acc_b, 2);
  // The slices of a row group, summed in slice order.
  __shared__ float part[kCtaWarps][16];
  if (t == 0) part[warp][g] = acc_a, part[warp][g + 8] = acc_b;
  __syncthreads();
  if (slice != 0 || lane >= 16) return;
  float y = part[warp][lane];
  for (int s = 1; s < kSlices; ++s) y += part[warp + s][lane];
  const int64_t row = r0 + lane;
  if (row < p.rows) p.y[row] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(y)) : y;
}

template <int kSlices>
Status launch_q4k_slices(const MmaBatch& b, int n, cudaStream_t st) {
  constexpr int kCtaWarps = kSlices > kWarps ? kSlices : kWarps;
  const int64_t groups = (b.p[0].rows + 15) / 16, per_cta = kCtaWarps / kSlices;
  return cuda::launch(q4k_mma_kernel<kSlices>,
                      cuda::LaunchParams{dim3(static_cast<unsigned>((groups + per_cta - 1) / per_cta), static_cast<unsigned>(n)),
                                         dim3(kCtaWarps * 32), 0, st},
                      b);
}

// Warps per row group: the largest power of two up to 16 that leaves each a block or more
// (a row's blocks are summed over them in one CTA).
Status launch_q4k(const MmaBatch& b, int n, cudaStream_t st) {
  if (b.n_blocks >= 16) return launch_q4k_slices<16>(b, n, st);
  if (b.n_blocks >= 8) return launch_q4k_slices<8>(b, n, st);
  if (b.n_blocks >= 4) return launch_q4k_slices<4>(b, n, st);
  if (b.n_blocks >= 2) return launch_q4k_slices<2>(b, n, st);
  return launch_q4k_slices<1>(b, n, st);
}

int mma_mode() {
  static const int mode = [] {
    const char* e = std::getenv("DSF_GEMV_MMA");
    return e == nullptr ? 1 : std::atoi(e);
  }();
  return mode;
}

}  // namespace

bool gemv_mma_on() { return mma_mode() != 0; }

// Below ~4k (16-row group, block) pairs a launch the fp32 kernels finish first: the digits'
// extra launch and a GPU not yet full (H200: q_a 5120 -> 1280, kv 5120 -> 512, 2304 -> 5120).
bool gemv_mma_applies(const LinearParams* p, int n) {
  if (mma_mode() == 0) return false;
  return mma_mode() == 2 || (p[0].rows + 15) / 16 * (p[0].cols / 256) * n >= 4096;
}

Status launch_q4k_mma(const ExecCtx& ctx, const LinearParams* p, int n) {
  const cudaStream_t st = static_cast<cudaStream_t>(ctx.cuda_stream);
  const int64_t n_blocks = p[0].cols / 256;
  MmaBatch b{};
  XInputs in{};
  int n_x = 0;
  for (int i = 0; i < n; ++i) {
    b.p[i] = p[i];
    int k = 0;
    while (k < n_x && in.x[k] != p[i].x) ++k;
    if (k == n_x) in.x[n_x++] = p[i].x;
    b.xi[i] = k;
  }
  const int64_t blocks = n_x * n_blocks;
  const size_t q_bytes = static_cast<size_t>(blocks) * kDigits * 256, sum_bytes = static_cast<size_t>(blocks) * kDigits * 8 * 4;
  ASSIGN_OR_RETURN(void* mem, device_alloc(ctx, q_bytes + sum_bytes + static_cast<size_t>(blocks) * 4));
  b.x = XDigits{static_cast<int8_t*>(mem), reinterpret_cast<int32_t*>(static_cast<char*>(mem) + q_bytes),
                reinterpret_cast<float*>(static_cast<char*>(mem) + q_bytes + sum_bytes)};
  b.n_blocks = n_blocks;
  const Status prep =
      cuda::launch(xdigits_kernel,
                   cuda::LaunchParams{dim3(static_cast<unsigned>((n_blocks + kWarps - 1) / kWarps), static_cast<unsigned>(n_x)),
                                      dim3(kWarps * 32), 0, st},
                   in, n_blocks, b.x);
  const Status gemv = prep.ok() ? launch_q4k(b, n, st) : prep;
  device_free(ctx, mem);  // stream-ordered: after the GEMV
  return gemv;
}

}  // namespace dsflash::kernels
