// Quantised GEMV/GEMM on the GPU: one warp per output row, lanes stride over the row's
// values, decode each value from its GGML block (kernels/cuda/ggml_blocks.cuh) and multiply
// with up to kTok tokens held in registers; a warp shuffle reduces, lane 0 writes (bf16-
// rounded or fp32). Memory-bound at decode (n_tok = 1): the weight bytes are read once per
// token group, x stays in L1/L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/ggml_blocks.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/linear_params.cuh"
#include "kernels/linear/tiles.h"

namespace dsflash::kernels {
namespace {

using quant::GgmlType;
using namespace dsflash::kernels::cuda;

// Warp-reduces each token's partial sums and lets lane 0 write the row's outputs (static
// indices keep acc in registers).
__device__ __forceinline__ void store_row(const LinearParams& p, float (&acc)[kTok], int nt, int64_t row, int64_t t0,
                                          int lane) {
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    for (int off = 16; off > 0; off >>= 1) acc[t] += __shfl_down_sync(0xffffffffu, acc[t], off);
  }
  if (lane != 0) return;
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    if (t < nt) p.y[(t0 + t) * p.rows + row] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(acc[t])) : acc[t];
  }
}

// Value i of a row: plain float types read directly; block types find their block with 32-bit
// division (rows are shorter than 2^31 values).
template <GgmlType kType>
__device__ __forceinline__ float value_at(const uint8_t* wr, int64_t i, const LinearParams& p) {
  if constexpr (kType == GgmlType::kF32) {
    return reinterpret_cast<const float*>(wr)[i];
  } else if constexpr (kType == GgmlType::kF16 || kType == GgmlType::kBF16) {
    return block_value<kType>(wr + 2 * i, 0);
  } else {
    const int k = static_cast<int>(i);
    return block_value<kType>(wr + (k / p.block_elems) * p.block_bytes, k % p.block_elems);
  }
}

template <GgmlType kType>
__global__ void __launch_bounds__(kWarps * 32) linear_kernel(LinearParams p) {
  cuda::await_inputs();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const uint8_t* wr = p.w + row * p.row_bytes;
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += kTok) {
    const int nt = p.n_tok - t0 < kTok ? static_cast<int>(p.n_tok - t0) : kTok;
    float acc[kTok] = {};
    for (int64_t i = lane; i < p.cols; i += 32) {
      const float v = value_at<kType>(wr, i, p);
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t < nt) acc[t] += v * p.x[(t0 + t) * p.cols + i];
      }
    }
    store_row(p, acc, nt, row, t0, lane);
  }
}

// Few rows (a router, the indexer's head weights): a whole block per row, so the row's values
// are spread over kWideThreads threads instead of one warp; per-token block reduction.
constexpr int kWideThreads = 256;
constexpr int64_t kWideRows = 1024;  // below this many rows a warp per row leaves the GPU idle

template <GgmlType kType>
__global__ void __launch_bounds__(kWideThreads) linear_wide_kernel(LinearParams p) {
  cuda::await_inputs();
  __shared__ float part[kTok][kWideThreads / 32];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint8_t* wr = p.w + row * p.row_bytes;
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += kTok) {
    const int nt = p.n_tok - t0 < kTok ? static_cast<int>(p.n_tok - t0) : kTok;
    float acc[kTok] = {};
    for (int64_t i = threadIdx.x; i < p.cols; i += kWideThreads) {
      const float v = value_at<kType>(wr, i, p);
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t < nt) acc[t] += v * p.x[(t0 + t) * p.cols + i];
      }
    }
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      for (int off = 16; off > 0; off >>= 1) acc[t] += __shfl_down_sync(0xffffffffu, acc[t], off);
      if (lane == 0) part[t][warp] = acc[t];
    }
    __syncthreads();
    if (threadIdx.x < nt) {
      float sum = 0.0f;
      for (int w = 0; w < kWideThreads / 32; ++w) sum += part[threadIdx.x][w];
      p.y[(t0 + threadIdx.x) * p.rows + row] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(sum)) : sum;
    }
    __syncthreads();
  }
}

// One token of a 16-bit float matrix with few rows (the MoE router, bf16): a block per row as
// linear_wide_kernel, but each thread takes 8 values a load (16 bytes of weights, two float4
// of x), so a 5,120-column row is three rounds of loads instead of twenty 2-byte ones.
// Needs 16-byte aligned rows and x and columns in multiples of 8.
template <GgmlType kType>
__global__ void __launch_bounds__(kWideThreads) linear_wide16_kernel(LinearParams p) {
  static_assert(kType == GgmlType::kBF16 || kType == GgmlType::kF16);
  cuda::await_inputs();
  __shared__ float part[kWideThreads / 32];
  const int64_t row = blockIdx.x;
  const uint4* wr = reinterpret_cast<const uint4*>(p.w + row * p.row_bytes);
  const float4* x4 = reinterpret_cast<const float4*>(p.x);
  const auto lo = [](uint32_t w) {
    if constexpr (kType == GgmlType::kBF16) return __uint_as_float(w << 16);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  };
  const auto hi = [](uint32_t w) {
    if constexpr (kType == GgmlType::kBF16) return __uint_as_float(w & 0xffff0000u);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  };
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < p.cols / 8; i += kWideThreads) {
    const uint4 w = wr[i];
    const float4 a = x4[2 * i], b = x4[2 * i + 1];
    acc = fmaf(lo(w.x), a.x, acc);
    acc = fmaf(hi(w.x), a.y, acc);
    acc = fmaf(lo(w.y), a.z, acc);
    acc = fmaf(hi(w.y), a.w, acc);
    acc = fmaf(lo(w.z), b.x, acc);
    acc = fmaf(hi(w.z), b.y, acc);
    acc = fmaf(lo(w.w), b.z, acc);
    acc = fmaf(hi(w.w), b.w, acc);
  }
  acc = block_sum<kWideThreads>(acc, part);
  if (threadIdx.x == 0) p.y[row] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(acc)) : acc;
}

// Prefill GEMM (n_tok >= kGemmMinTokens): a block computes 64 rows x 64 tokens. Per step of 32
// columns it decodes the weight tile once into shared memory (exact fp32 values, as the CPU),
// stages the activations beside it, and each of 256 threads accumulates a 4 x 4 micro-tile in
// fp32 (per 32-column step, then into the running sum). The weights are decoded once per 64
// tokens instead of once per kTok, and every shared-memory read feeds 16 FMAs.
// A launch with few tiles (an expert's rows at a short prompt: 36 CTAs for 2,304 rows) splits
// the columns into gridDim.z ranges of k_span: each writes its fp32 sums to `partials`
// ([split][token][row]) and gemm_reduce_kernel adds them in split order (deterministic).
constexpr int kGemmRows = 64, kGemmToks = 64, kGemmK = 32, kGemmThreads = 256;
constexpr int64_t kGemmMinTokens = 16;

template <GgmlType kType>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_kernel(LinearParams p, int64_t k_span, float* partials) {
  cuda::await_inputs();
  const int64_t k_lo = static_cast<int64_t>(blockIdx.z) * k_span, k_hi = min(p.cols, k_lo + k_span);
  __shared__ __align__(16) float ws[kGemmK][kGemmRows + 4];  // [column][row]
  __shared__ __align__(16) float xs[kGemmK][kGemmToks + 4];  // [column][token]
  const int tid = threadIdx.x, tr = tid % 16, tt = tid / 16;  // rows 4 tr.., tokens 4 tt..
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kGemmRows, tok0 = static_cast<int64_t>(blockIdx.y) * kGemmToks;
  float acc[4][4] = {};
  for (int64_t k0 = k_lo; k0 < k_hi; k0 += kGemmK) {
    for (int e = tid; e < kGemmRows * kGemmK; e += kGemmThreads) {  // a warp walks one row's columns
      const int r = e / kGemmK, k = e % kGemmK;
      const int64_t row = min(row0 + r, p.rows - 1);
      ws[k][r] = k0 + k < k_hi ? value_at<kType>(p.w + row * p.row_bytes, k0 + k, p) : 0.0f;
    }
    for (int e = tid; e < kGemmToks * kGemmK; e += kGemmThreads) {
      const int t = e / kGemmK, k = e % kGemmK;
      const int64_t tok = tok0 + t;
      xs[k][t] = tok < p.n_tok && k0 + k < k_hi ? p.x[tok * p.cols + k0 + k] : 0.0f;
    }
    __syncthreads();
    // This step's 32 columns are summed apart and added to acc at once: the rounding error of
    // K/32 partials of 32 terms, not of one running sum of K terms.
    float part[4][4] = {};
#pragma unroll 8
    for (int k = 0; k < kGemmK; ++k) {
      const float4 a = *reinterpret_cast<const float4*>(&ws[k][4 * tr]);
      const float4 b = *reinterpret_cast<const float4*>(&xs[k][4 * tt]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) part[i][j] = fmaf(av[i], bv[j], part[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += part[i][j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + 4 * tr + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t tok = tok0 + 4 * tt + j;
      if (row >= p.rows || tok >= p.n_tok) continue;
      if (partials != nullptr) {
        partials[(blockIdx.z * p.n_tok + tok) * p.rows + row] = acc[i][j];
      } else {
        p.y[tok * p.rows + row] = p.round_bf16 ? __bfloat162float(__float2bfloat16_rn(acc[i][j])) : acc[i][j];
      }
    }
  }
}

// y[i] = the splits' partial sums of output i added in split order (rounded as the GEMM's).
__global__ void gemm_reduce_kernel(const float* __restrict__ partials, int splits, int64_t n, bool round_bf16,
                                   float* __restrict__ y) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = partials[i];
  for (int z = 1; z < splits; ++z) s += partials[z * n + i];
  y[i] = round_bf16 ? __bfloat162float(__float2bfloat16_rn(s)) : s;
}

// CTAs a SM the GEMM's column split aims for: 8, or DSF_GEMM_SPLIT_CTAS (measurement). H200,
// perf preset, prefill of 64 / 512 tokens: 2 -> 139 / 248 tok/s, 4 -> 163 / 270, 8 -> 163 / 280.
int64_t gemm_split_ctas() {
  static const int64_t n = [] {
    const long long v = cuda::env_int("DSF_GEMM_SPLIT_CTAS", 0);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{8};
  }();
  return n;
}

// The GEMM of p, its columns split where the tiles alone would leave most SMs idle (ranges of
// at least 256 columns, at most 16 of them, until the launch has gemm_split_ctas() CTAs a SM).
Status launch_gemm(const cuda::LaunchParams& base, const LinearParams& p,
                   Status (*launch)(const cuda::LaunchParams&, const LinearParams&, int64_t, float*)) {
  const int64_t tiles = static_cast<int64_t>(base.grid.x) * base.grid.y;
  const int64_t steps = (p.cols + kGemmK - 1) / kGemmK;
  int splits = 1;
  while (splits < 16 && tiles * splits < gemm_split_ctas() * cuda::sm_count() && steps / (2 * splits) >= 8) splits *= 2;
  const int64_t k_span = (steps + splits - 1) / splits * kGemmK;
  splits = static_cast<int>((p.cols + k_span - 1) / k_span);
  if (splits == 1) return launch(base, p, p.cols, nullptr);
  const int64_t n = p.n_tok * p.rows;
  float* partials = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&partials, static_cast<size_t>(splits * n) * sizeof(float), base.stream));
  cuda::LaunchParams lp = base;
  lp.grid.z = static_cast<unsigned>(splits);
  const Status s = [&]() -> Status {
    RETURN_IF_ERROR(launch(lp, p, k_span, partials));
    return cuda::launch(gemm_reduce_kernel,
                        cuda::LaunchParams{dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, base.stream},
                        partials, splits, n, p.round_bf16, p.y);
  }();
  cudaFreeAsync(partials, base.stream);
  return s;
}

// Q2_K / Q3_K rows (the expert matrices): a lane takes one 16-value sub-block per step, so a
// warp covers two 256-value super-blocks; the lane loads its 16 code bytes as 4 words, its
// 16 activations as 4 float4, and forms sum x*q and sum x once per sub-block:
//   sum_i x_i (dl q_i - ml) = dl * sum x_i q_i - ml * sum x_i.
// Sub-block s = 8n + 2j + h covers values 128n + 32j + 16h + [0, 16), codes in
// qs[32n + 16h + i] >> 2j (and, for Q3_K, hmask[16h + i] bit 4n + j).
template <GgmlType kType>
__global__ void __launch_bounds__(kWarps * 32) linear_k23_kernel(LinearParams p) {
  cuda::await_inputs();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const uint8_t* wr = p.w + row * p.row_bytes;
  const int64_t n_super = p.cols / 256;
  const int s = lane & 15, n = s / 8, j = (s % 8) / 2, h = s % 2;
  const int first = 128 * n + 32 * j + 16 * h;
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += kTok) {
    const int nt = p.n_tok - t0 < kTok ? static_cast<int>(p.n_tok - t0) : kTok;
    float acc[kTok] = {};
    for (int64_t sb = lane >> 4; sb < n_super; sb += 2) {
      const uint8_t* b = wr + sb * p.block_bytes;
      int q[16];
      float dl, ml = 0.0f;
      if constexpr (kType == GgmlType::kQ2_K) {
        const uint8_t sc = b[s];
        dl = half_at(b + 80) * static_cast<float>(sc & 0xf);
        ml = half_at(b + 82) * static_cast<float>(sc >> 4);
        // 84-byte blocks keep the code bytes 4-byte aligned: four word loads.
        const uint32_t* qs = reinterpret_cast<const uint32_t*>(b + 16 + 32 * n + 16 * h);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t w4 = (qs[k] >> (2 * j)) & 0x03030303u;
#pragma unroll
          for (int i = 0; i < 4; ++i) q[4 * k + i] = (w4 >> (8 * i)) & 3;
        }
      } else {
        const uint8_t* sc6 = b + 96;
        const int lo4 = s < 8 ? (sc6[s] & 0xf) : (sc6[s - 8] >> 4);
        const int hi2 = (sc6[8 + (s % 4)] >> (2 * (s / 4))) & 3;
        dl = half_at(b + 108) * static_cast<float>((lo4 | (hi2 << 4)) - 32);
        const uint8_t* qs = b + 32 + 32 * n + 16 * h;
        const uint8_t* hm = b + 16 * h;
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = ((qs[i] >> (2 * j)) & 3) - (((hm[i] >> (4 * n + j)) & 1) ? 0 : 4);
      }
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t >= nt) continue;
        const float4* xv = reinterpret_cast<const float4*>(p.x + (t0 + t) * p.cols + sb * 256 + first);
        float sxq = 0.0f, sx = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float4 v = xv[k];
          sxq += v.x * q[4 * k] + v.y * q[4 * k + 1] + v.z * q[4 * k + 2] + v.w * q[4 * k + 3];
          sx += (v.x + v.y) + (v.z + v.w);
        }
        acc[t] += dl * sxq - ml * sx;
      }
    }
    store_row(p, acc, nt, row, t0, lane);
  }
}

// Q8_0 / Q4_K / Q6_K rows (attention, shared expert, head): a lane takes one sub-block per
// step (Q8_0: a 32-value block; Q4_K: a 32-value sub-block; Q6_K: a 16-value sub-block), so
// scales are decoded once per sub-block rather than per value.
template <GgmlType kType>
__global__ void __launch_bounds__(kWarps * 32) linear_sub_kernel(LinearParams p) {
  cuda::await_inputs();
  constexpr int kSubs = kType == GgmlType::kQ8_0 ? 1 : kType == GgmlType::kQ4_K ? 8 : 16;   // sub-blocks per block
  constexpr int kLen = kType == GgmlType::kQ6_K ? 16 : 32;                                     // values per sub-block
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const uint8_t* wr = p.w + row * p.row_bytes;
  const int64_t n_subs = p.cols / kLen;
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += kTok) {
    const int nt = p.n_tok - t0 < kTok ? static_cast<int>(p.n_tok - t0) : kTok;
    float acc[kTok] = {};
    for (int64_t g = lane; g < n_subs; g += 32) {
      const uint8_t* b = wr + (g / kSubs) * p.block_bytes;
      const int sub = static_cast<int>(g % kSubs);
      float q[kLen];
      float scale, offset = 0.0f;
      if constexpr (kType == GgmlType::kQ8_0) {
        scale = half_at(b);
#pragma unroll
        for (int i = 0; i < 32; ++i) q[i] = static_cast<float>(static_cast<int8_t>(b[2 + i]));
      } else if constexpr (kType == GgmlType::kQ4_K) {
        int sc, m;
        scale_min_k4(sub, b + 4, &sc, &m);
        scale = half_at(b) * static_cast<float>(sc);
        offset = half_at(b + 2) * static_cast<float>(m);
        const uint32_t* qs = reinterpret_cast<const uint32_t*>(b + 16 + 32 * (sub / 2));
        const int shift = (sub % 2) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const uint32_t w4 = (qs[k] >> shift) & 0x0f0f0f0fu;
#pragma unroll
          for (int i = 0; i < 4; ++i) q[4 * k + i] = static_cast<float>((w4 >> (8 * i)) & 0xf);
        }
      } else {  // Q6_K: sub-block s of 16 values at r0 = 16 (s % 8) in half n = s / 8
        const int n = sub / 8, r0 = 16 * (sub % 8), quarter = r0 / 32, l0 = r0 % 32;
        scale = half_at(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + 8 * n + l0 / 16 + 2 * quarter]));
        const uint8_t* ql = b + 64 * n + l0 + ((quarter & 1) ? 32 : 0);
        const uint8_t* qh = b + 128 + 32 * n + l0;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int lo = (quarter & 2) ? (ql[i] >> 4) : (ql[i] & 0xf);
          q[i] = static_cast<float>((lo | (((qh[i] >> (2 * quarter)) & 3) << 4)) - 32);
        }
      }
      const int64_t base = kType == GgmlType::kQ6_K ? (g / 16) * 256 + 128 * (sub / 8) + 16 * (sub % 8) : g * kLen;
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t >= nt) continue;
        const float* xt = p.x + (t0 + t) * p.cols + base;
        float sxq = 0.0f, sx = 0.0f;
#pragma unroll
        for (int i = 0; i < kLen; ++i) {
          sxq += xt[i] * q[i];
          sx += xt[i];
        }
        acc[t] += scale * sxq - offset * sx;
      }
    }
    store_row(p, acc, nt, row, t0, lane);
  }
}

// The fewest tokens a call's linear takes the GEMM from: kGemmMinTokens, or DSF_GEMM_MIN_TOKENS
// (measurement).
int64_t gemm_min_tokens() {
  static const int64_t n = [] {
    const long long v = cuda::env_int("DSF_GEMM_MIN_TOKENS", 0);
    return v > 0 ? static_cast<int64_t>(v) : kGemmMinTokens;
  }();
  return n;
}

// The fewest tokens the tensor-core GEMM (gemm_mma.cu) takes: 4, or DSF_GEMM_MMA_MIN_TOKENS
// (measurement). H200, perf preset, a 64-token prefill (the routed experts' calls have a few
// tokens each): 278 tok/s from 16 tokens, 301 from 4, 296 from 2.
int64_t gemm_mma_min_tokens() {
  static const int64_t n = [] {
    const long long v = cuda::env_int("DSF_GEMM_MMA_MIN_TOKENS", 0);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{4};
  }();
  return n;
}

template <GgmlType kType>
Status launch_linear(const ExecCtx& ctx, const LinearParams& p) {
  const unsigned grid = static_cast<unsigned>((p.rows + kWarps - 1) / kWarps);
  const cuda::LaunchParams lp{dim3(grid), dim3(kWarps * 32), 0, cuda::stream_of(ctx)};
  if (p.n_tok >= gemm_mma_min_tokens() && gemm_mma_applies(kType, p)) return launch_gemm_mma(ctx, kType, p);
  if (p.n_tok >= gemm_min_tokens() && (p.n_tok + kGemmToks - 1) / kGemmToks <= 65535) {
    const dim3 g(static_cast<unsigned>((p.rows + kGemmRows - 1) / kGemmRows),
                 static_cast<unsigned>((p.n_tok + kGemmToks - 1) / kGemmToks));
    return launch_gemm(cuda::LaunchParams{g, dim3(kGemmThreads), 0, lp.stream}, p,
                       [](const cuda::LaunchParams& l, const LinearParams& q, int64_t span, float* part) {
                         return cuda::launch(gemm_kernel<kType>, l, q, span, part);
                       });
  }
  if constexpr (kType == GgmlType::kQ2_K || kType == GgmlType::kQ3_K) {
    // float4 activation loads need 16-byte aligned x; Q2_K word loads a 4-byte aligned W.
    const bool w_ok = kType != GgmlType::kQ2_K || (reinterpret_cast<uintptr_t>(p.w) % 4 == 0 && p.row_bytes % 4 == 0);
    if (reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && w_ok) return cuda::launch(linear_k23_kernel<kType>, lp, p);
  }
  // Q8_0 stays on the per-value kernel: its 34-byte blocks make per-lane block reads uncoalesced
  // (161 vs 212 GB/s measured on H200).
  if constexpr (kType == GgmlType::kQ6_K) return cuda::launch(linear_sub_kernel<kType>, lp, p);
  if constexpr (kType == GgmlType::kQ4_K) {
    // Word loads of the code bytes need a 4-byte aligned W (144-byte blocks keep it).
    if (reinterpret_cast<uintptr_t>(p.w) % 4 == 0 && p.row_bytes % 4 == 0) return cuda::launch(linear_sub_kernel<kType>, lp, p);
  }
  if constexpr (kType == GgmlType::kBF16 || kType == GgmlType::kF16) {
    const bool aligned = reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && p.row_bytes % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.cols % 8 == 0;
    if (p.n_tok == 1 && p.rows < kWideRows && aligned) {
      return cuda::launch(linear_wide16_kernel<kType>,
                          cuda::LaunchParams{dim3(static_cast<unsigned>(p.rows)), dim3(kWideThreads), 0, lp.stream}, p);
    }
  }
  if (p.rows < kWideRows) {
    return cuda::launch(linear_wide_kernel<kType>,
                        cuda::LaunchParams{dim3(static_cast<unsigned>(p.rows)), dim3(kWideThreads), 0, lp.stream}, p);
  }
  return cuda::launch(linear_kernel<kType>, lp, p);
}

// GGUF rows (src) into the tile order (dst, tiles.h): a 2-byte unit a thread, over every
// (tile, block) of `rows` rows.
__global__ void __launch_bounds__(256) to_tiles_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                                        int64_t rows, int64_t blocks, int block_bytes) {
  cuda::await_inputs();  // src may be the H2D copy's staging, written by the stream's earlier work
  const int tile = tiles::tile_bytes(block_bytes), units = tile / 2, row_units = block_bytes / 2;
  const int64_t row_bytes = blocks * block_bytes, total = rows / tiles::kRows * blocks * units;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = i / units;  // (tile, block) = (pair / blocks, pair % blocks)
    const int u = static_cast<int>(i % units), r = u / row_units, o = 2 * (u % row_units);
    const int64_t t = pair / blocks, b = pair % blocks;
    const uint16_t v = *reinterpret_cast<const uint16_t*>(src + (t * tiles::kRows + r) * row_bytes + b * block_bytes + o);
    *reinterpret_cast<uint16_t*>(dst + pair * tile + tiles::tile_byte(block_bytes, r, o)) = v;
  }
}

}  // namespace

bool tile_layout_exists(const Weight& w) {
  return (w.type == GgmlType::kQ2_K || w.type == GgmlType::kQ3_K) && w.rows > 0 && w.rows % tiles::kRows == 0 &&
         mma_columns_fit(w.cols);
}

namespace {

bool tiles_on() {
  static const bool on = cuda::env_int("DSF_WEIGHT_TILES", 1) != 0 && cuda::env_int("DSF_GEMV_MMA", 2) == 2 &&
                         cuda::env_int("DSF_GEMM_MMA", 1) != 0;
  return on;
}

}  // namespace

bool tiles_apply(const Weight& w) { return tiles_on() && w.layout == WeightLayout::kGguf && tile_layout_exists(w); }

bool linear_tiles_apply(const Weight& w) {
  const bool q6k = w.type == GgmlType::kQ6_K && w.rows > 0 && w.rows % tiles::kRows == 0 && mma_columns_fit(w.cols);
  return tiles_on() && w.layout == WeightLayout::kGguf && (q6k || tile_layout_exists(w));
}

Status to_tiles_cuda(const ExecCtx& ctx, const Weight& w, uint8_t* dst) {
  if (ctx.backend != Backend::kCuda) return absl::InvalidArgumentError("to_tiles_cuda needs a CUDA context");
  const quant::TypeTraits& t = quant::traits(w.type);
  if ((w.type != GgmlType::kQ2_K && w.type != GgmlType::kQ3_K && w.type != GgmlType::kQ6_K) ||
      w.layout != WeightLayout::kGguf ||
      w.rows % tiles::kRows != 0 || w.cols % 256 != 0 || reinterpret_cast<uintptr_t>(w.data) % 2 != 0 ||
      reinterpret_cast<uintptr_t>(dst) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("to_tiles_cuda: no tile layout for ", t.name, " rows of ", w.rows,
                                                   " x ", w.cols, " at this alignment"));
  }
  if (w.rows == 0) return absl::OkStatus();
  const int64_t blocks = w.cols / 256, units = w.rows * static_cast<int64_t>(w.row_bytes) / 2;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((units + 255) / 256, 8 * cuda::sm_count()));
  return cuda::launch(to_tiles_kernel, cuda::LaunchParams{dim3(grid), dim3(256), 0, cuda::stream_of(ctx)},
                      w.data, dst, w.rows, blocks, static_cast<int>(t.block_bytes));
}

Status linear_gemm_mma_cuda(const ExecCtx& ctx, const Weight& w, const float* x, int64_t n_tok, float* y,
                            OutRound round) {
  if (ctx.backend != Backend::kCuda) return absl::InvalidArgumentError("linear_gemm_mma_cuda needs a CUDA context");
  if (w.rows <= 0 || w.cols <= 0 || n_tok <= 0) return absl::InvalidArgumentError("linear_gemm_mma_cuda: empty shape");
  return launch_gemm_mma(ctx, w.type, params_of(w, x, y, n_tok, round));
}

Status linear_cuda(const ExecCtx& ctx, const Weight& w, const float* x, int64_t n_tok, float* y, OutRound round) {
  if (ctx.backend != Backend::kCuda) return absl::InvalidArgumentError("linear_cuda needs a CUDA context");
  if (w.rows <= 0 || w.cols <= 0 || n_tok <= 0) return absl::InvalidArgumentError("linear_cuda: empty shape");
  const quant::TypeTraits& t = quant::traits(w.type);
  if (w.cols % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("linear_cuda: ", w.cols, " columns are not whole ", t.name, " blocks"));
  }
  const LinearParams p = params_of(w, x, y, n_tok, round);
  if (p.tiles) {  // the tensor-core GEMM reads tiles at any token count, the Q6_K GEMV at one
    const bool x16 = reinterpret_cast<uintptr_t>(x) % 16 == 0, w16 = reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
    if (w.type == GgmlType::kQ6_K && n_tok == 1 && x16 && w16 && w.rows % tiles::kRows == 0 && gemv_mma_applies(&p, 1)) {
      return launch_dense_mma(ctx, w.type, &p, 1);
    }
    if (gemm_mma_applies(w.type, p)) return launch_gemm_mma(ctx, w.type, p);
    return absl::UnimplementedError(absl::StrCat("linear_cuda: no kernel reads ", t.name, " tiles of ", w.rows, " x ",
                                                 w.cols, " at this alignment (or DSF_GEMM_MMA=0)"));
  }
  if (decode_gemv_applies(w.type, &p, 1)) return launch_decode_gemv(ctx, w.type, &p, 1);
  switch (w.type) {
    case GgmlType::kF32: return launch_linear<GgmlType::kF32>(ctx, p);
    case GgmlType::kF16: return launch_linear<GgmlType::kF16>(ctx, p);
    case GgmlType::kBF16: return launch_linear<GgmlType::kBF16>(ctx, p);
    case GgmlType::kQ8_0: return launch_linear<GgmlType::kQ8_0>(ctx, p);
    case GgmlType::kQ2_K: return launch_linear<GgmlType::kQ2_K>(ctx, p);
    case GgmlType::kQ3_K: return launch_linear<GgmlType::kQ3_K>(ctx, p);
    case GgmlType::kQ4_K: return launch_linear<GgmlType::kQ4_K>(ctx, p);
    case GgmlType::kQ5_K: return launch_linear<GgmlType::kQ5_K>(ctx, p);
    case GgmlType::kQ6_K: return launch_linear<GgmlType::kQ6_K>(ctx, p);
    case GgmlType::kMXFP4: return launch_linear<GgmlType::kMXFP4>(ctx, p);
    default: return absl::UnimplementedError(absl::StrCat("linear_cuda: no device decoder for ", t.name));
  }
}

}  // namespace dsflash::kernels
