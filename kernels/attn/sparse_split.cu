// Sparse attention of a few query rows split over its lists' chunks (flash decoding).
//
// The single-launch kernel (attn.cu) gives each (row, head) one CTA that walks the list's
// chunks of 64 entries in turn, so a decode step is 64 CTAs each reading every listed KV row:
// a chain of ~3 dependent load rounds and barriers per chunk, and 64 times the rows' bytes from
// L2. Here a CTA takes one chunk of one row's list for kSplitHeads heads, which share the rows it
// loads (the KV rows are the same for every head), and writes that chunk's partial result: its
// max logit m_c, its sum of exp(logit - m_c) and its value sum over bf16(exp(logit - m_c)),
// each formed in entry order as the reference forms a chunk's. A second kernel merges a head's
// chunks in chunk order with weights exp(m_c - M), M the largest m_c, adds the sink and divides.
// The reference instead rescales a running sum chunk by chunk and rounds the probabilities
// against the running max, so results agree to fp32 rounding (bf16 outputs to an ulp where a
// rounding boundary is crossed), not bit for bit; a one-chunk list gives the same operations.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/attn/attn_args.cuh"
#include "kernels/attn/sparse_split.cuh"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"

namespace dsflash::kernels::attn::detail {
namespace {

using cuda::round_bf16;

constexpr int kChunk = 64;  // entries a CTA takes: the reference's chunk
constexpr int kHeads = 4;   // heads a CTA takes; they share the rows it loads
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kWarpEntries = kChunk / kWarps;
constexpr int64_t kMaxDh = 1024;                     // q rows of the CTA's heads in 16 KB of shared memory
constexpr int64_t kMaxScratch = int64_t{32} << 20;  // bytes of partial results a launch may take
constexpr int64_t kMaxChunks = 4096;                // the merge's weights beside a row in shared memory

struct ChunkArgs {
  const float* q;
  int H;
  int64_t Dh;
  const float* kv_a;
  int64_t n_a;
  const float* kv_b;
  const int32_t* idx;
  int64_t width;
  float scale;
  RopeArgs rope;
  WindowArgs win;
  int64_t chunks;
  float* part;  // [S][H][chunks][Dh]: the chunk's value sums
  float* stat;  // [S][H][chunks][2]: the chunk's max logit and its sum of exp(logit - max)
};

// grid (chunks, H / kHeads, S). Logits by warps (each warp's kWarpEntries entries for the
// kHeads heads at once, 16-byte loads), then per head one warp: the chunk max, the
// probabilities, their sum in entry order (lane 0), their bf16 roundings; then each thread one
// head's four dims of the value sum in entry order.
__global__ void __launch_bounds__(kThreads) sparse_chunk_kernel(const __grid_constant__ ChunkArgs a) {
  cuda::await_inputs();
  extern __shared__ float4 q_smem[];  // [kHeads][Dh / 4]
  __shared__ float logit[kHeads][kChunk], pb[kHeads][kChunk];
  __shared__ const float* rows[kChunk];  // null: no entry
  const int64_t c = blockIdx.x, t = blockIdx.z, S = gridDim.z, Dh = a.Dh, Dh4 = Dh / 4;
  const int h0 = static_cast<int>(blockIdx.y) * kHeads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t e0 = c * kChunk;
  const int cn = static_cast<int>(min(static_cast<int64_t>(kChunk), a.width - e0));
  const WindowArgs win = a.win;  // (copies: a reference into the parameter would go through local memory)
  const int64_t pos0 = win.ww > 0 ? cuda::scalar_value(win.pos0_value, win.pos0_dev) : 0;
  const int32_t* list = a.idx + t * (a.width - win.ww);
  float* qs = reinterpret_cast<float*>(q_smem);
  for (int64_t i = threadIdx.x; i < kHeads * Dh; i += kThreads) qs[i] = a.q[(t * a.H + h0) * Dh + i];
  if (threadIdx.x < kChunk) {
    const int k = static_cast<int>(threadIdx.x);
    rows[k] = k < cn ? kv_row(a.kv_a, a.n_a, a.kv_b, Dh, list_entry(win, pos0, S, t, list, e0 + k)) : nullptr;
  }
  const RopeArgs rope = a.rope;
  for (int h = 0; h < kHeads; ++h) rope.rotate(qs + h * Dh, Dh, t, false);
  __syncthreads();

  float dot[kWarpEntries][kHeads] = {};
#pragma unroll 2
  for (int64_t d4 = lane; d4 < Dh4; d4 += 32) {
    float4 v[kWarpEntries];
#pragma unroll
    for (int i = 0; i < kWarpEntries; ++i) {
      const float* row = rows[warp + i * kWarps];
      v[i] = row != nullptr ? __ldg(reinterpret_cast<const float4*>(row) + d4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float4 qv = q_smem[h * Dh4 + d4];
#pragma unroll
      for (int i = 0; i < kWarpEntries; ++i) {
        dot[i][h] = fmaf(qv.x, v[i].x, fmaf(qv.y, v[i].y, fmaf(qv.z, v[i].z, fmaf(qv.w, v[i].w, dot[i][h]))));
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kWarpEntries; ++i) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float sum = cuda::warp_sum(dot[i][h]);
      const int k = warp + i * kWarps;
      if (lane == 0) logit[h][k] = rows[k] != nullptr ? sum * a.scale : -INFINITY;
    }
  }
  __syncthreads();

  if (warp < kHeads) {
    const int h = warp;
    float cmax = -INFINITY;
    for (int k = lane; k < cn; k += 32) cmax = fmaxf(cmax, logit[h][k]);
    for (int off = 16; off > 0; off >>= 1) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, off));
    // No entry in the chunk: nothing to add (p = 0 rather than exp(-inf + inf)).
    for (int k = lane; k < kChunk; k += 32) {
      logit[h][k] = k < cn && cmax > -INFINITY ? expf(logit[h][k] - cmax) : 0.0f;
    }
    __syncwarp();
    if (lane == 0) {
      float psum = 0.0f;
      for (int k = 0; k < cn; ++k) psum = __fadd_rn(psum, logit[h][k]);
      float* st = a.stat + (((t * a.H + h0 + h) * a.chunks) + c) * 2;
      st[0] = cmax;
      st[1] = psum;
    }
    for (int k = lane; k < kChunk; k += 32) pb[h][k] = round_bf16(logit[h][k]);
  }
  __syncthreads();

  for (int64_t i = threadIdx.x; i < kHeads * Dh4; i += kThreads) {
    const int h = static_cast<int>(i / Dh4);
    const int64_t d4 = i % Dh4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
    for (int k = 0; k < cn; ++k) {
      const float* row = rows[k];
      if (row == nullptr) continue;
      const float4 v = __ldg(reinterpret_cast<const float4*>(row) + d4);
      const float p = pb[h][k];
      acc.x = __fadd_rn(acc.x, __fmul_rn(p, v.x));
      acc.y = __fadd_rn(acc.y, __fmul_rn(p, v.y));
      acc.z = __fadd_rn(acc.z, __fmul_rn(p, v.z));
      acc.w = __fadd_rn(acc.w, __fmul_rn(p, v.w));
    }
    reinterpret_cast<float4*>(a.part + ((t * a.H + h0 + h) * a.chunks + c) * Dh)[d4] = acc;
  }
}

struct MergeArgs {
  int H;
  int64_t Dh, chunks;
  const float* part;
  const float* stat;
  const float* sink;
  RopeArgs rope;
  float* o;
};

// grid (H, S): head h of row t from its chunks' partial results, in chunk order; the output's
// inverse RoPE as the single-launch kernel applies it.
__global__ void sparse_merge_kernel(const __grid_constant__ MergeArgs a) {
  cuda::await_inputs();
  extern __shared__ float merge_smem[];
  float* w = merge_smem;            // [chunks]: exp(m_c - M)
  float* out = merge_smem + a.chunks;  // [Dh]
  const int h = static_cast<int>(blockIdx.x);
  const int64_t t = blockIdx.y, Dh = a.Dh, row = t * a.H + h;
  const float* st = a.stat + row * a.chunks * 2;
  float M = -INFINITY;
  for (int64_t c = 0; c < a.chunks; ++c) M = fmaxf(M, st[2 * c]);
  if (M == -INFINITY) M = -1e30f;  // no entry at all: the reference's starting max
  for (int64_t c = threadIdx.x; c < a.chunks; c += blockDim.x) w[c] = expf(st[2 * c] - M);
  __syncthreads();
  float L = 0.0f;
  for (int64_t c = 0; c < a.chunks; ++c) L = __fadd_rn(L, __fmul_rn(st[2 * c + 1], w[c]));
  L = __fadd_rn(L, expf(a.sink[h] - M));
  const float* part = a.part + row * a.chunks * Dh;
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) {
    float v = 0.0f;
    for (int64_t c = 0; c < a.chunks; ++c) v = __fadd_rn(v, __fmul_rn(part[c * Dh + d], w[c]));
    out[d] = round_bf16(__fdiv_rn(v, L));
  }
  const RopeArgs rope = a.rope;
  rope.rotate(out, Dh, t, true);
  __syncthreads();
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) a.o[row * Dh + d] = out[d];
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t chunks_of(int64_t width) { return (width + kChunk - 1) / kChunk; }

bool split_off() {
  static const bool off = cuda::env_int("DSF_ATTN_SPLIT", 1) == 0;  // measurement: the single-launch kernel
  return off;
}

}  // namespace

bool split_applies(int64_t S, int H, int64_t Dh, int64_t width, const float* q, const float* kv_a, const float* kv_b,
                   const float* o) {
  if (split_off() || width <= 0 || H % kHeads != 0 || Dh % 4 != 0 || Dh > kMaxDh) return false;
  if (chunks_of(width) > kMaxChunks) return false;
  if (!aligned16(q) || !aligned16(kv_a) || (kv_b != nullptr && !aligned16(kv_b)) || !aligned16(o)) return false;
  return S * H * chunks_of(width) * (Dh + 2) * static_cast<int64_t>(sizeof(float)) <= kMaxScratch;
}

Status sparse_attn_split(cudaStream_t st, const float* q, int64_t S, int H, int64_t Dh, const float* kv_a, int64_t n_a,
                         const float* kv_b, const int32_t* idx, int64_t width, const float* sink, float scale, float* o,
                         const RopeArgs& rope, const WindowArgs& win) {
  const int64_t chunks = chunks_of(width);
  float* part = nullptr;
  float* stat = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&part, S * H * chunks * Dh * sizeof(float), st));
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&stat, S * H * chunks * 2 * sizeof(float), st));
  const Status s = [&]() -> Status {
    const ChunkArgs ca{q, H, Dh, kv_a, n_a, kv_b, idx, width, scale, rope, win, chunks, part, stat};
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(H / kHeads), static_cast<unsigned>(S));
    RETURN_IF_ERROR(cuda::launch(sparse_chunk_kernel,
                                 cuda::LaunchParams{grid, dim3(kThreads), static_cast<size_t>(kHeads * Dh) * sizeof(float), st},
                                 ca));
    const MergeArgs ma{H, Dh, chunks, part, stat, sink, rope, o};
    return cuda::launch(sparse_merge_kernel,
                        cuda::LaunchParams{dim3(static_cast<unsigned>(H), static_cast<unsigned>(S)), dim3(256),
                                           static_cast<size_t>(chunks + Dh) * sizeof(float), st},
                        ma);
  }();
  (void)cudaFreeAsync(part, st);
  (void)cudaFreeAsync(stat, st);
  return s;
}

}  // namespace dsflash::kernels::attn::detail
