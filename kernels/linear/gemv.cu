// Decode GEMVs (one token): Q4_K, Q6_K, Q2_K and Q3_K rows, several rows per warp so that each
// activation value loaded serves them all, codes turned into floats by a byte permute into
// 2^23's mantissa and one subtraction (no integer conversion). One launch may carry up to
// kMaxGemvBatch products of the same shape (the routed experts of a layer): blockIdx.y picks one.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/ggml_blocks.cuh"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/linear_params.cuh"
#include "kernels/linear/tiles.h"

namespace dsflash::kernels {
namespace {

using quant::GgmlType;
using namespace dsflash::kernels::cuda;

// Rows per warp: 4 when the products have rows enough to fill the GPU (the activations loaded
// serve all four), else 1 or 2 (more warps in flight). Rows past the end are computed on the
// last row and not stored, so the loads of a warp's rows issue together.
constexpr int64_t kRowsFor4 = 16384, kRowsFor2 = 6144;  // rows x products of a launch

struct Batch {
  LinearParams p[kMaxGemvBatch];
};

__device__ __forceinline__ float code_at(uint32_t word, int k) {
  return __int_as_float(static_cast<int>(__byte_perm(word, 0x4B000000u, 0x7540u + k))) - 8388608.0f;
}

// A 32-bit word from two half-word loads (blocks of 210 / 110 bytes are only 2-byte aligned).
__device__ __forceinline__ uint32_t word_at(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return h[0] | (static_cast<uint32_t>(h[1]) << 16);
}

// Two runs of 16 activations, the second kGap floats after the first (16-byte aligned), and
// the sum of each run in order.
template <int kGap>
__device__ __forceinline__ void load_x_pair(const float* x, float (&a)[16], float (&b)[16], float* sa, float* sb) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 u = __ldg(x4 + k), v = __ldg(x4 + kGap / 4 + k);
    a[4 * k] = u.x, a[4 * k + 1] = u.y, a[4 * k + 2] = u.z, a[4 * k + 3] = u.w;
    b[4 * k] = v.x, b[4 * k + 1] = v.y, b[4 * k + 2] = v.z, b[4 * k + 3] = v.w;
  }
  *sa = 0.0f;
  *sb = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) *sa += a[i], *sb += b[i];
}

// Where a warp works: its first row and, with the columns split kSplit ways over the warps of
// a block (few rows: more warps in flight), its slice.
template <int kRows, int kSplit>
struct WarpPlace {
  __device__ WarpPlace() {
    const int warp = threadIdx.x >> 5;
    row0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / kSplit) + warp / kSplit) * kRows;
    slice = warp % kSplit;
  }
  int64_t row0;
  int slice;
};

// Reduces a warp's partial sums and stores its rows; split columns are summed over the slices
// in slice order (shared memory), so the result does not depend on scheduling.
template <int kRows, int kSplit>
__device__ __forceinline__ void store_rows(const LinearParams& p, float (&acc)[kRows], int64_t row0, int lane) {
  __shared__ float part[kWarps][kRows];
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_down_sync(0xffffffffu, acc[r], off);
    if constexpr (kSplit > 1) {
      if (lane == 0) part[warp][r] = acc[r];
    }
  }
  if constexpr (kSplit > 1) {
    __syncthreads();
    if (warp % kSplit != 0) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      acc[r] = part[warp][r];
      for (int s = 1; s < kSplit; ++s) acc[r] += part[warp + s][r];
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (lane == 0 && row0 + r < p.rows) p.y[row0 + r] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(acc[r])) : acc[r];
  }
}

// Q4_K: a warp takes kRows rows. Lane l covers, in blocks l/8, l/8 + 4, ..., the 16 code bytes at 16 (l % 8):
// values 64c + 16h + [0, 16) in the low nibbles and 64c + 32 + 16h + [0, 16) in the high ones
// (c = (l % 8) / 2, h = l % 2; sub-blocks 2c and 2c + 1). One 16-byte load per row and block.
template <int kRows, int kSplit>
__device__ __forceinline__ void q4k_gemv(const LinearParams& p) {
  const int lane = threadIdx.x & 31;
  const WarpPlace<kRows, kSplit> at;
  const int64_t row0 = at.row0;
  if (kSplit == 1 && row0 >= p.rows) return;  // (split warps meet at a barrier: none leaves)
  const int q = lane & 7, c = q >> 1, h = q & 1;
  const int64_t n_blocks = p.cols / 256;
  float acc[kRows] = {};
  for (int64_t b = 4 * at.slice + (lane >> 3); b < n_blocks; b += 4 * kSplit) {
    float xl[16], xh[16], sxl, sxh;  // low nibbles' values, high nibbles' 32 further
    load_x_pair<32>(p.x + b * 256 + 64 * c + 16 * h, xl, xh, &sxl, &sxh);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* blk = p.w + min(row0 + r, p.rows - 1) * p.row_bytes + b * 144;
      const uint4 qv = *reinterpret_cast<const uint4*>(blk + 16 + 16 * q);
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * c, blk + 4, &sc0, &m0);
      scale_min_k4(2 * c + 1, blk + 4, &sc1, &m1);
      const uint32_t words[4] = {qv.x, qv.y, qv.z, qv.w};
      float lo = 0.0f, hi = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t wl = words[k] & 0x0f0f0f0fu, wh = (words[k] >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo = fmaf(xl[4 * k + i], code_at(wl, i), lo);
          hi = fmaf(xh[4 * k + i], code_at(wh, i), hi);
        }
      }
      const float d = half_at(blk), dmin = half_at(blk + 2);
      acc[r] += d * (static_cast<float>(sc0) * lo + static_cast<float>(sc1) * hi) -
                dmin * (static_cast<float>(m0) * sxl + static_cast<float>(m1) * sxh);
    }
  }
  store_rows<kRows, kSplit>(p, acc, row0, lane);
}

// Q6_K, one token: as q4k_gemv_kernel. Lane l covers, in blocks l/8, l/8 + 4, ..., the 16 low-
// code bytes ql[16 (l % 8) + 0..16) of half n = (l % 8) / 4 at l0 = 16 (l % 4) (quarters
// qa = l0 / 32 from the low nibbles and qa + 2 from the high ones) with their high bits
// qh[32n + l0 % 32 + 0..16).
template <int kRows, int kSplit>
__device__ __forceinline__ void q6k_gemv(const LinearParams& p) {
  const int lane = threadIdx.x & 31;
  const WarpPlace<kRows, kSplit> at;
  const int64_t row0 = at.row0;
  if (kSplit == 1 && row0 >= p.rows) return;  // (split warps meet at a barrier: none leaves)
  const int q = lane & 7, n = q >> 2, o = 16 * (q & 3), qa = o >> 5, l0 = o & 31;
  const int64_t n_blocks = p.cols / 256;
  float acc[kRows] = {};
  for (int64_t b = 4 * at.slice + (lane >> 3); b < n_blocks; b += 4 * kSplit) {
    float xa[16], xb[16], sxa, sxb;  // quarter qa, quarter qa + 2 (64 values further)
    load_x_pair<64>(p.x + b * 256 + 128 * n + 32 * qa + l0, xa, xb, &sxa, &sxb);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* blk = p.w + min(row0 + r, p.rows - 1) * p.row_bytes + b * 210;
      const uint8_t* ql = blk + 16 * q;
      const uint8_t* qh = blk + 128 + 32 * n + l0;
      float sa = 0.0f, sb = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t wl = word_at(ql + 4 * k), wh = word_at(qh + 4 * k);
        const uint32_t ca = (wl & 0x0f0f0f0fu) | (((wh >> (2 * qa)) & 0x03030303u) << 4);
        const uint32_t cb = ((wl >> 4) & 0x0f0f0f0fu) | (((wh >> (2 * qa + 4)) & 0x03030303u) << 4);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          sa = fmaf(xa[4 * k + i], code_at(ca, i), sa);
          sb = fmaf(xb[4 * k + i], code_at(cb, i), sb);
        }
      }
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n + l0 / 16);
      acc[r] += half_at(blk + 208) * (static_cast<float>(sc[2 * qa]) * (sa - 32.0f * sxa) +
                                      static_cast<float>(sc[2 * qa + 4]) * (sb - 32.0f * sxb));
    }
  }
  store_rows<kRows, kSplit>(p, acc, row0, lane);
}

// Q2_K / Q3_K, one token (the routed experts): as q4k_gemv_kernel, 4 lanes per block. Lane l
// covers the 16 code bytes qs[32n + l0 + 0..16) (n = (l % 4) / 2, l0 = 16 (l % 2)), i.e. the
// values 128n + 32j + l0 + [0, 16) for the four shifts j (sub-block scales 8n + 2j + l0 / 16);
// Q3_K adds the high bits hmask[l0 + 0..16) bit 4n + j (set: code + 4). Blocks are 84 / 110
// bytes (4 / 2-byte aligned): words from half-word loads (word_at).

// A lane's share of a Q2_K / Q3_K block (layout above): its 16 code bytes (and Q3_K's high
// bits), and shift j's four codes of word k as bytes.
template <bool kQ3>
struct Q23Codes {
  __device__ __forceinline__ Q23Codes(const uint8_t* blk, int n, int l0) : n(n) {
    const uint8_t* qs = blk + (kQ3 ? 32 : 16) + 32 * n + l0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wq[k] = word_at(qs + 4 * k);
      if constexpr (kQ3) wh[k] = word_at(blk + l0 + 4 * k);
    }
  }
  __device__ __forceinline__ uint32_t at(int j, int k) const {
    uint32_t c = (wq[k] >> (2 * j)) & 0x03030303u;
    if constexpr (kQ3) c |= ((wh[k] >> (4 * n + j)) & 0x01010101u) << 2;
    return c;
  }
  uint32_t wq[4], wh[4] = {};
  int n;
};

// Sub-block s's term from sxq (its codes times x, summed) and sx (its x summed): Q2_K's scale
// and min with d and dmin; Q3_K's signed scale and -4 offset (d per block, by the caller).
template <bool kQ3>
__device__ __forceinline__ float q23_term(const uint8_t* blk, int s, float sxq, float sx) {
  if constexpr (kQ3) {
    const uint8_t* sc = blk + 96;
    const int lo4 = s < 8 ? (sc[s] & 0xf) : (sc[s - 8] >> 4);
    const int hi2 = (sc[8 + (s % 4)] >> (2 * (s / 4))) & 3;
    return static_cast<float>((lo4 | (hi2 << 4)) - 32) * (sxq - 4.0f * sx);
  } else {
    const uint8_t sc = blk[s];
    return half_at(blk + 80) * static_cast<float>(sc & 0xf) * sxq - half_at(blk + 82) * static_cast<float>(sc >> 4) * sx;
  }
}

// A lane's x for one block of q23_gemv: runs j = 0..3 of 16 values (128n + 32j + l0 + [0, 16)),
// their sums, and run j's dot product with four words of codes. In fp32 (the reference path):
struct XF32 {
  const float* x;
  struct Runs {
    float v[4][16], sum[4];
  };
  __device__ __forceinline__ Runs load(int64_t b, int n, int l0) const {
    Runs r;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4* x4 = reinterpret_cast<const float4*>(x + b * 256 + 128 * n + 32 * j + l0);
      r.sum[j] = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 a = __ldg(x4 + k);
        r.v[j][4 * k] = a.x, r.v[j][4 * k + 1] = a.y, r.v[j][4 * k + 2] = a.z, r.v[j][4 * k + 3] = a.w;
        r.sum[j] += (a.x + a.y) + (a.z + a.w);
      }
    }
    return r;
  }
  template <class Codes>
  __device__ __forceinline__ static float dot(const Runs& r, int j, const Codes& codes) {
    float sxq = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t c = codes.at(j, k);
#pragma unroll
      for (int i = 0; i < 4; ++i) sxq = fmaf(r.v[j][4 * k + i], code_at(c, i), sxq);
    }
    return sxq;
  }
};

// ... and in 8 bits (ActQ8, quantize_act_q8_cuda; LoadOptions::expert_act_q8): a run's dot
// product is four dp4a (codes 0..3, or Q3_K's 0..7 with its -4 offset carried by the sum, are
// valid signed bytes). Its sum is d times the 8-bit run's sum, so a product is W x' for
// x' = d q exactly (up to rounding) and its error W (x' - x) is that of the 8-bit x alone (with
// the exact float sum the codes' offset would weigh the error: 3-10x the NMSE).
struct XQ8 {
  const int8_t* q;
  const float* d;
  const float* s16;
  struct Runs {
    int4 v[4];
    float d[4], sum[4];
  };
  __device__ __forceinline__ Runs load(int64_t b, int n, int l0) const {
    Runs r;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t v0 = b * 256 + 128 * n + 32 * j + l0;  // the run's first value
      r.v[j] = __ldg(reinterpret_cast<const int4*>(q + v0));
      r.d[j] = __ldg(d + v0 / 32);
      r.sum[j] = __ldg(s16 + v0 / 16);
    }
    return r;
  }
  template <class Codes>
  __device__ __forceinline__ static float dot(const Runs& r, int j, const Codes& codes) {
    const int xw[4] = {r.v[j].x, r.v[j].y, r.v[j].z, r.v[j].w};
    int dot = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) dot = __dp4a(static_cast<int>(codes.at(j, k)), xw[k], dot);
    return r.d[j] * static_cast<float>(dot);
  }
};

template <GgmlType kType, int kRows, int kSplit, class X>
__device__ __forceinline__ void q23_gemv(const LinearParams& p, const X& xs) {
  constexpr bool kQ3 = kType == GgmlType::kQ3_K;
  constexpr int kBytes = kQ3 ? 110 : 84;
  const int lane = threadIdx.x & 31;
  const WarpPlace<kRows, kSplit> at;
  const int64_t row0 = at.row0;
  if (kSplit == 1 && row0 >= p.rows) return;
  const int q = lane & 3, n = q >> 1, l0 = 16 * (q & 1);
  const int64_t n_blocks = p.cols / 256;
  float acc[kRows] = {};
  for (int64_t b = 8 * at.slice + (lane >> 2); b < n_blocks; b += 8 * kSplit) {
    const typename X::Runs x = xs.load(b, n, l0);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* blk = p.w + min(row0 + r, p.rows - 1) * p.row_bytes + b * kBytes;
      const Q23Codes<kQ3> codes(blk, n, l0);
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) part += q23_term<kQ3>(blk, 8 * n + 2 * j + l0 / 16, X::dot(x, j, codes), x.sum[j]);
      acc[r] += kQ3 ? half_at(blk + 108) * part : part;
    }
  }
  store_rows<kRows, kSplit>(p, acc, row0, lane);
}

// 8-bit x, 32 values per warp (one per lane): d = max|x| / 127 and q = rint(x / d) (both IEEE),
// and d times the sum of each 16-value run of q.
__global__ void __launch_bounds__(kWarps * 32) quantize_q8_kernel(const float* x, int64_t cols, int64_t x_stride,
                                                                  ActQ8 out) {
  cuda::await_inputs();
  const int lane = threadIdx.x & 31;
  const int64_t run = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (run * 32 >= cols) return;
  const float v = x[blockIdx.y * x_stride + run * 32 + lane];
  float amax = fabsf(v);
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float d = amax / 127.0f;
  const int64_t o = blockIdx.y * cols + run * 32 + lane;
  const int q = d > 0.0f ? __float2int_rn(v / d) : 0;
  out.q[o] = static_cast<int8_t>(q);
  int sum = q;  // lanes 0 and 16: their run of 16 (exact in int)
  for (int off = 8; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off, 16);
  if (lane == 0) out.d[o / 32] = d;
  if ((lane & 15) == 0) out.s16[o / 16] = d * static_cast<float>(sum);
}

template <GgmlType kType, int kRows, int kSplit>
__device__ __forceinline__ void gemv(const LinearParams& p) {
  if constexpr (kType == GgmlType::kQ4_K) q4k_gemv<kRows, kSplit>(p);
  else if constexpr (kType == GgmlType::kQ6_K) q6k_gemv<kRows, kSplit>(p);
  else q23_gemv<kType, kRows, kSplit>(p, XF32{p.x});
}

template <GgmlType kType, int kRows, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const __grid_constant__ Batch b) {
  cuda::await_inputs();
  gemv<kType, kRows, kSplit>(b.p[blockIdx.y]);
}

// Experts chosen on the device: product k uses expert ids[k]'s rows.
struct ExpertBatch {
  LinearParams p;  // expert 0's rows, product 0's x and y
  const int32_t* ids;
  int64_t expert_bytes, x_stride, y_stride;
};

template <GgmlType kType, int kRows, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) expert_gemv_kernel(const __grid_constant__ ExpertBatch b) {
  cuda::await_inputs();
  LinearParams p = b.p;
  p.w += static_cast<int64_t>(b.ids[blockIdx.y]) * b.expert_bytes;
  p.x += blockIdx.y * b.x_stride;
  p.y += blockIdx.y * b.y_stride;
  gemv<kType, kRows, kSplit>(p);
}

// Experts chosen on the device over 8-bit x: product k reads x run k (q_stride 0: one x).
struct ExpertBatchQ8 {
  LinearParams p;  // expert 0's rows, product 0's y (p.x unused)
  const int32_t* ids;
  int64_t expert_bytes, y_stride, q_stride;
  ActQ8 x;
};

template <GgmlType kType, int kRows, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) expert_gemv_q8_kernel(const __grid_constant__ ExpertBatchQ8 b) {
  cuda::await_inputs();
  LinearParams p = b.p;
  p.w += static_cast<int64_t>(b.ids[blockIdx.y]) * b.expert_bytes;
  p.y += blockIdx.y * b.y_stride;
  const int64_t off = blockIdx.y * b.q_stride;
  q23_gemv<kType, kRows, kSplit>(p, XQ8{b.x.q + off, b.x.d + off / 32, b.x.s16 + off / 16});
}

// Launches K<kType, kRows, kSplit>::fn with the rows per warp and the column split the launch's
// size asks for: enough warps in flight (~8k on an H200) without splitting a row's super-blocks
// into slices of less than one warp step each.
constexpr int64_t kWarpsWanted = 8192;

template <template <GgmlType, int, int> class K, GgmlType kType, int kRows, typename Arg>
Status launch_split(int split, int64_t rows, int n, cudaStream_t stream, const Arg& arg) {
  auto lp = [&](int sp) {
    const int64_t per_block = static_cast<int64_t>(kWarps / sp) * kRows;
    return cuda::LaunchParams{dim3(static_cast<unsigned>((rows + per_block - 1) / per_block), static_cast<unsigned>(n)),
                              dim3(kWarps * 32), 0, stream};
  };
  if constexpr (kType == GgmlType::kQ4_K || kType == GgmlType::kQ6_K) {
    if (split == 8) return cuda::launch(K<kType, kRows, 8>::fn, lp(8), arg);
    if (split == 4) return cuda::launch(K<kType, kRows, 4>::fn, lp(4), arg);
    if (split == 2) return cuda::launch(K<kType, kRows, 2>::fn, lp(2), arg);
  }
  return cuda::launch(K<kType, kRows, 1>::fn, lp(1), arg);
}

template <template <GgmlType, int, int> class K, GgmlType kType, typename Arg>
Status launch_rows(int64_t rows, int64_t cols, int n, cudaStream_t stream, const Arg& arg) {
  const int64_t total = rows * n;
  const int r = total >= kRowsFor4 ? 4 : total >= kRowsFor2 ? 2 : 1;
  // Q2_K / Q3_K (8 super-blocks per warp step) measured slower split (6 experts' gate: 2.97 ->
  // 3.26 ms per token on the H200); Q4_K / Q6_K (4 per step) split.
  constexpr bool kSplits = kType == GgmlType::kQ4_K || kType == GgmlType::kQ6_K;
  int split = 1;
  while (kSplits && split < 8 && (total / r) * split < kWarpsWanted && cols / 256 >= 4 * split * 2) split *= 2;
  if (r == 4) return launch_split<K, kType, 4>(split, rows, n, stream, arg);
  if (r == 2) return launch_split<K, kType, 2>(split, rows, n, stream, arg);
  return launch_split<K, kType, 1>(split, rows, n, stream, arg);
}

template <GgmlType kType, int kRows, int kSplit>
struct GemvK {
  static constexpr auto fn = gemv_kernel<kType, kRows, kSplit>;
};
template <GgmlType kType, int kRows, int kSplit>
struct ExpertK {
  static constexpr auto fn = expert_gemv_kernel<kType, kRows, kSplit>;
};
template <GgmlType kType, int kRows, int kSplit>
struct ExpertQ8K {
  static constexpr auto fn = expert_gemv_q8_kernel<kType, kRows, kSplit>;
};

}  // namespace

// Q4_K reads 16-byte code words (144-byte blocks keep a 16-byte aligned W aligned); the others
// half-words. Every kernel reads x as float4.
bool decode_gemv_applies(GgmlType type, const LinearParams* p, int n) {
  if (n < 1 || n > kMaxGemvBatch) return false;
  if (type != GgmlType::kQ2_K && type != GgmlType::kQ3_K && type != GgmlType::kQ4_K && type != GgmlType::kQ6_K) {
    return false;
  }
  const uintptr_t w_align = type == GgmlType::kQ4_K ? 16 : 2;
  for (int i = 0; i < n; ++i) {
    const LinearParams& q = p[i];
    if (q.tiles) return false;  // the fp32 GEMVs read the GGUF order only
    if (q.n_tok != 1 || q.rows != p[0].rows || q.cols != p[0].cols || q.row_bytes != p[0].row_bytes) return false;
    if (reinterpret_cast<uintptr_t>(q.w) % w_align != 0 || q.row_bytes % static_cast<int64_t>(w_align) != 0) return false;
    if (reinterpret_cast<uintptr_t>(q.x) % 16 != 0) return false;
  }
  return true;
}

Status launch_decode_gemv(const ExecCtx& ctx, GgmlType type, const LinearParams* p, int n) {
  Batch b{};
  for (int i = 0; i < n; ++i) b.p[i] = p[i];
  const cudaStream_t st = cuda::stream_of(ctx);
  if ((type == GgmlType::kQ4_K || type == GgmlType::kQ6_K) && gemv_mma_applies(p, n)) {
    return launch_dense_mma(ctx, type, p, n);
  }
  switch (type) {
    case GgmlType::kQ2_K: return launch_rows<GemvK, GgmlType::kQ2_K>(p[0].rows, p[0].cols, n, st, b);
    case GgmlType::kQ3_K: return launch_rows<GemvK, GgmlType::kQ3_K>(p[0].rows, p[0].cols, n, st, b);
    case GgmlType::kQ4_K: return launch_rows<GemvK, GgmlType::kQ4_K>(p[0].rows, p[0].cols, n, st, b);
    case GgmlType::kQ6_K: return launch_rows<GemvK, GgmlType::kQ6_K>(p[0].rows, p[0].cols, n, st, b);
    default: return absl::InternalError("launch_decode_gemv: unsupported type");
  }
}

namespace {

// The jobs as decode GEMV products (all n when they fit one launch: same type, shape and
// alignment), or 0.
int gemv_params(const LinearJob* jobs, int n, OutRound round, LinearParams (&p)[kMaxGemvBatch]) {
  const int m = n <= kMaxGemvBatch ? n : 0;
  for (int i = 0; i < m; ++i) p[i] = params_of(jobs[i].w, jobs[i].x, jobs[i].y, 1, round);
  bool same_type = true;
  for (int i = 1; i < m; ++i) same_type = same_type && jobs[i].w.type == jobs[0].w.type;
  return m > 0 && same_type && decode_gemv_applies(jobs[0].w.type, p, m) ? m : 0;
}

}  // namespace

Status linear_batch_cuda(const ExecCtx& ctx, const LinearJob* jobs, int n, OutRound round) {
  if (n <= 0) return absl::OkStatus();
  if (ctx.backend != Backend::kCuda) return absl::InvalidArgumentError("linear_batch_cuda needs a CUDA context");
  LinearParams p[kMaxGemvBatch];
  if (gemv_params(jobs, n, round, p) == n) return launch_decode_gemv(ctx, jobs[0].w.type, p, n);
  for (int i = 0; i < n; ++i) RETURN_IF_ERROR(linear_cuda(ctx, jobs[i].w, jobs[i].x, 1, jobs[i].y, round));
  return absl::OkStatus();
}

Status linear_batch_mma_cuda(const ExecCtx& ctx, const LinearJob* jobs, int n, OutRound round) {
  if (n <= 0) return absl::OkStatus();
  if (ctx.backend != Backend::kCuda) return absl::InvalidArgumentError("linear_batch_mma_cuda needs a CUDA context");
  LinearParams p[kMaxGemvBatch];
  const GgmlType type = jobs[0].w.type;
  if ((type != GgmlType::kQ4_K && type != GgmlType::kQ6_K) || gemv_params(jobs, n, round, p) != n) {
    return absl::UnimplementedError("linear_batch_mma_cuda: Q4_K or Q6_K decode products of one shape only");
  }
  return launch_dense_mma(ctx, type, p, n);
}

namespace {

// Whether the tensor-core expert GEMV can take n products of w (whatever their size): Q2_K
// reads words (blocks 4-byte aligned), Q3_K half-words, tiles 16 bytes (and whole tiles of
// rows); one launch holds kMaxGemvBatch.
bool experts_mma_fits(const Weight& w, int64_t expert_bytes, int n) {
  const bool tiled = w.layout == WeightLayout::kTiles16;
  const uintptr_t a = w.type != GgmlType::kQ2_K && w.type != GgmlType::kQ3_K ? 0 : tiled ? 16 : w.type == GgmlType::kQ2_K ? 4 : 2;
  return a != 0 && reinterpret_cast<uintptr_t>(w.data) % a == 0 && expert_bytes % static_cast<int64_t>(a) == 0 &&
         n <= kMaxGemvBatch && (!tiled || w.rows % tiles::kRows == 0);
}

// linear_experts_cuda; mma: 0 the fp32 kernels, 1 the tensor cores where they pay
// (experts_mma_applies), 2 the tensor cores (Q2_K, Q3_K).
Status experts_gemv(const ExecCtx& ctx, const Weight& w, int64_t expert_bytes, const int32_t* ids, int n, const float* x,
                    int64_t x_stride, float* y, int64_t y_stride, OutRound round, int mma) {
  if (n <= 0) return absl::OkStatus();
  const quant::TypeTraits& t = quant::traits(w.type);
  ExpertBatch b{params_of(w, x, y, 1, round), ids, expert_bytes, x_stride, y_stride};
  if (w.layout == WeightLayout::kTiles16) {  // the tensor-core GEMV is the one reader of tiles
    if (!experts_mma_fits(w, expert_bytes, n) || !mma_columns_fit(w.cols) || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
        x_stride % 4 != 0) {
      return absl::UnimplementedError(absl::StrCat("linear_experts_cuda: no GEMV reads ", t.name, " tiles of ", w.rows,
                                                   " x ", w.cols, " at this alignment"));
    }
    return launch_experts_mma(ctx, w.type, b.p, ids, expert_bytes, n, x_stride, y_stride);
  }
  const uintptr_t w_align = w.type == GgmlType::kQ4_K ? 16 : 2;
  if (!decode_gemv_applies(w.type, &b.p, 1) || expert_bytes % static_cast<int64_t>(w_align) != 0 || x_stride % 4 != 0) {
    return absl::UnimplementedError(absl::StrCat("linear_experts_cuda: no decode GEMV for ", t.name, " at this alignment"));
  }
  const bool mma_fits = experts_mma_fits(w, expert_bytes, n);
  if (mma == 2 && !mma_fits) {
    return absl::UnimplementedError(absl::StrCat("linear_experts_mma_cuda: no tensor-core GEMV for ", t.name, " here"));
  }
  if (mma_fits && (mma == 2 || (mma == 1 && experts_mma_applies(w.type, w.rows, w.cols, n)))) {
    return launch_experts_mma(ctx, w.type, b.p, ids, expert_bytes, n, x_stride, y_stride);
  }
  const cudaStream_t st = cuda::stream_of(ctx);
  switch (w.type) {
    case GgmlType::kQ2_K: return launch_rows<ExpertK, GgmlType::kQ2_K>(w.rows, w.cols, n, st, b);
    case GgmlType::kQ3_K: return launch_rows<ExpertK, GgmlType::kQ3_K>(w.rows, w.cols, n, st, b);
    case GgmlType::kQ4_K: return launch_rows<ExpertK, GgmlType::kQ4_K>(w.rows, w.cols, n, st, b);
    default: return launch_rows<ExpertK, GgmlType::kQ6_K>(w.rows, w.cols, n, st, b);
  }
}

}  // namespace

Status linear_experts_cuda(const ExecCtx& ctx, const Weight& w, int64_t expert_bytes, const int32_t* ids, int n,
                           const float* x, int64_t x_stride, float* y, int64_t y_stride, OutRound round) {
  return experts_gemv(ctx, w, expert_bytes, ids, n, x, x_stride, y, y_stride, round, 1);
}

Status linear_experts_mma_cuda(const ExecCtx& ctx, const Weight& w, int64_t expert_bytes, const int32_t* ids, int n,
                               const float* x, int64_t x_stride, float* y, int64_t y_stride, OutRound round) {
  return experts_gemv(ctx, w, expert_bytes, ids, n, x, x_stride, y, y_stride, round, 2);
}

Status linear_experts_gate_up_cuda(const ExecCtx& ctx, const Weight& gate, int64_t gate_bytes, const Weight& up,
                                   int64_t up_bytes, const int32_t* ids, int n, const float* x, float* y_gate, float* y_up,
                                   int64_t y_stride, OutRound round) {
  if (n <= 0) return absl::OkStatus();
  const bool same = gate.type == up.type && gate.rows == up.rows && gate.cols == up.cols && gate.row_bytes == up.row_bytes;
  if (same && experts_mma_fits(gate, gate_bytes, n) && experts_mma_fits(up, up_bytes, n) &&
      linear_experts_supported(gate, gate_bytes) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      experts_mma_applies(gate.type, gate.rows, gate.cols, 2 * n)) {
    return launch_experts_mma(ctx, gate.type, params_of(gate, x, y_gate, 1, round), ids, gate_bytes, n, 0, y_stride,
                              up.data, y_up, up_bytes);
  }
  RETURN_IF_ERROR(linear_experts_cuda(ctx, gate, gate_bytes, ids, n, x, 0, y_gate, y_stride, round));
  return linear_experts_cuda(ctx, up, up_bytes, ids, n, x, 0, y_up, y_stride, round);
}

bool linear_experts_supported(const Weight& w, int64_t expert_bytes) {
  if (w.layout == WeightLayout::kTiles16) return experts_mma_fits(w, expert_bytes, 1) && mma_columns_fit(w.cols);
  const LinearParams p = params_of(w, nullptr, nullptr, 1, OutRound::kF32);
  const int64_t w_align = w.type == GgmlType::kQ4_K ? 16 : 2;
  return decode_gemv_applies(w.type, &p, 1) && expert_bytes % w_align == 0;
}

Status quantize_act_q8_cuda(const ExecCtx& ctx, const float* x, int64_t cols, int n, int64_t x_stride, ActQ8 out) {
  if (n <= 0) return absl::OkStatus();
  if (cols % 32 != 0) return absl::InvalidArgumentError(absl::StrCat("quantize_act_q8_cuda: ", cols, " columns, not whole runs of 32"));
  const int64_t runs = cols / 32;
  return cuda::launch(quantize_q8_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>((runs + kWarps - 1) / kWarps), static_cast<unsigned>(n)),
                                         dim3(kWarps * 32), 0, cuda::stream_of(ctx)},
                      x, cols, x_stride, out);
}

bool linear_experts_q8_supported(const Weight& w, int64_t expert_bytes) {
  if (w.layout != WeightLayout::kGguf) return false;  // the dp4a GEMVs read the GGUF order only
  return (w.type == GgmlType::kQ2_K || w.type == GgmlType::kQ3_K) && linear_experts_supported(w, expert_bytes);
}

Status linear_experts_q8_cuda(const ExecCtx& ctx, const Weight& w, int64_t expert_bytes, const int32_t* ids, int n,
                              const ActQ8& x, bool one_x, float* y, int64_t y_stride, OutRound round) {
  if (n <= 0) return absl::OkStatus();
  const quant::TypeTraits& t = quant::traits(w.type);
  if (!linear_experts_q8_supported(w, expert_bytes)) {
    return absl::UnimplementedError(absl::StrCat("linear_experts_q8_cuda: no 8-bit-activation GEMV for ", t.name));
  }
  ExpertBatchQ8 b{params_of(w, nullptr, y, 1, round), ids, expert_bytes, y_stride, one_x ? 0 : w.cols, x};
  const cudaStream_t st = cuda::stream_of(ctx);
  if (w.type == GgmlType::kQ2_K) return launch_rows<ExpertQ8K, GgmlType::kQ2_K>(w.rows, w.cols, n, st, b);
  return launch_rows<ExpertQ8K, GgmlType::kQ3_K>(w.rows, w.cols, n, st, b);
}

}  // namespace dsflash::kernels
