// Sparse attention of a few query rows split over its lists' chunks (flash decoding), with the
// reference's arithmetic.
//
// The single-launch kernel (attn.cu) gives each (row, head) one CTA that walks the list's
// chunks of 64 entries in turn, so a decode step is 64 CTAs each reading every listed KV row:
// a chain of dependent load rounds and barriers per chunk, and 64 times the rows' bytes from
// L2. Here a CTA takes one chunk of one row's list for kHeads heads (4, 2 or 1), which share the
// rows it loads (the KV rows are the same for every head), in two launches:
//   1. the chunk's logits and its max logit per head;
//   2. the chunk's probabilities against the running max of the chunks up to it (known now),
//      their sum and bf16 roundings, its value sum; the last CTA of a (row, head group) to
//      finish then runs the reference's accumulation over the chunks in order (acc = acc *
//      rescale + part, L likewise), the sink and the division.
// Every rounding is the reference's, in its order, so the result is the single-launch
// kernel's but for the logits' dot products (a tree over 16-byte slices of the row).
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/attn/attn_args.cuh"
#include "kernels/attn/sparse_split.cuh"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"

namespace dsflash::kernels::attn::detail {
namespace {

using cuda::round_bf16;

constexpr int kChunk = 64;   // entries a CTA takes: the reference's chunk
constexpr int kMaxHeads = 4;  // heads a CTA takes at most; they share the rows it loads
// Threads of a CTA of either launch. A values thread adds kHeads consecutive values of one
// head's row (all threads busy at Dh = 512, more loop beyond), over kChunk / kHeads rows loaded
// at once (64 registers).
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kWarpEntries = kChunk / kWarps;
constexpr int64_t kMaxDh = 1024;                     // q rows of the CTA's heads in 16 KB of shared memory
constexpr int64_t kMaxScratch = int64_t{32} << 20;  // bytes of partial results a launch may take
constexpr int64_t kMaxChunks = 512;                 // the merge's maxima and sums in 16 KB of shared memory

// Scratch of a launch: per (row t, head h, chunk c) the logits, the chunk's max logit, its
// value sum and its sum of probabilities; per (row, head group) the count of finished chunks.
struct Scratch {
  float* part;    // [S][H][chunks][Dh]
  float* logits;  // [S][H][chunks][kChunk], -inf for no entry
  float* cmax;    // [S][H][chunks]
  float* psum;    // [S][H][chunks]
  int* done;      // [S][H / kHeads]
};

struct SplitArgs {
  const float* q;
  int H;
  int64_t Dh;
  const float* kv_a;
  int64_t n_a;
  const float* kv_b;
  const int32_t* idx;
  int64_t width;
  const float* sink;
  float scale;
  RopeArgs rope;
  WindowArgs win;
  int64_t chunks;
  Scratch x;
  float* o;
  int64_t t0, S;  // the launch's first query row, the call's rows (a launch takes rows t0 + blockIdx.z)
};

// kN consecutive floats (1, 2 or 4, 4 kN-byte aligned) in one load (zeros for a null pointer)
// or store.
template <int kN>
struct FloatVec;
template <>
struct FloatVec<1> {
  __device__ __forceinline__ static void load(const float* p, float (&v)[1]) { v[0] = p != nullptr ? __ldg(p) : 0.0f; }
  __device__ __forceinline__ static void store(float* p, const float (&v)[1]) { *p = v[0]; }
};
template <>
struct FloatVec<2> {
  __device__ __forceinline__ static void load(const float* p, float (&v)[2]) {
    const float2 u = p != nullptr ? __ldg(reinterpret_cast<const float2*>(p)) : make_float2(0.0f, 0.0f);
    v[0] = u.x, v[1] = u.y;
  }
  __device__ __forceinline__ static void store(float* p, const float (&v)[2]) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  }
};
template <>
struct FloatVec<4> {
  __device__ __forceinline__ static void load(const float* p, float (&v)[4]) {
    const float4 u = p != nullptr ? __ldg(reinterpret_cast<const float4*>(p)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
  }
  __device__ __forceinline__ static void store(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
};

// The CTA's chunk: how many entries it has and their rows (null: no entry) in shared memory.
__device__ __forceinline__ int chunk_rows(const SplitArgs& a, int64_t c, int64_t t, const float** rows) {
  const WindowArgs win = a.win;  // (a copy: a reference into the parameter would go through local memory)
  const int64_t e0 = c * kChunk, pos0 = win.ww > 0 ? cuda::scalar_value(win.pos0_value, win.pos0_dev) : 0;
  const int cn = static_cast<int>(min(static_cast<int64_t>(kChunk), a.width - e0));
  const int32_t* list = a.idx + t * (a.width - win.ww);
  if (threadIdx.x < kChunk) {
    const int k = static_cast<int>(threadIdx.x);
    rows[k] = k < cn ? kv_row(a.kv_a, a.n_a, a.kv_b, a.Dh, list_entry(win, pos0, a.S, t, list, e0 + k)) : nullptr;
  }
  return cn;
}

// grid (chunks, H / kHeads, rows): the logits of one chunk of row t's list for kHeads heads (each
// warp's kWarpEntries entries for all of them at once, 16-byte loads of the rows) and the
// chunk's max logit per head. Chunk 0 also clears the row's count of finished chunks.
template <int kHeads>
__global__ void __launch_bounds__(kThreads) sparse_logits_kernel(const __grid_constant__ SplitArgs a) {
  cuda::await_inputs();
  extern __shared__ float4 q_smem[];  // [kHeads][Dh / 4]
  __shared__ float logit[kHeads][kChunk];
  __shared__ const float* rows[kChunk];
  const int64_t c = blockIdx.x, tl = blockIdx.z, t = a.t0 + tl, Dh = a.Dh, Dh4 = Dh / 4;  // tl: the scratch's row
  const int h0 = static_cast<int>(blockIdx.y) * kHeads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* qs = reinterpret_cast<float*>(q_smem);
  for (int64_t i = threadIdx.x; i < kHeads * Dh; i += kThreads) qs[i] = a.q[(t * a.H + h0) * Dh + i];
  if (c == 0 && threadIdx.x == 0) a.x.done[tl * (a.H / kHeads) + blockIdx.y] = 0;
  const int cn = chunk_rows(a, c, t, rows);
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
    const int64_t at = (tl * a.H + h0 + h) * a.chunks + c;
    float cmax = -INFINITY;
    for (int k = lane; k < kChunk; k += 32) {
      a.x.logits[at * kChunk + k] = logit[h][k];
      if (k < cn) cmax = fmaxf(cmax, logit[h][k]);
    }
    for (int off = 16; off > 0; off >>= 1) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, off));
    if (lane == 0) a.x.cmax[at] = cmax;
  }
}

// The running max after chunk c (the max of chunks 0..c, and -1e30), as the reference's chunk
// loop has it, on every lane of a warp: the lanes load the chunks' maxima at once (a max is
// exact in any order; one after another they were a chain of dependent loads).
__device__ __forceinline__ float max_through(const float* cmax, int64_t c, int lane) {
  float m = -1e30f;
  for (int64_t i = lane; i <= c; i += 32) m = fmaxf(m, cmax[i]);
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}

// The last chunk's CTA of a (row, head group): the reference's accumulation over the chunks in
// order (acc = acc * rescale + part, L likewise), the sink, the division, the inverse RoPE. The
// chunks' maxima and probability sums are first loaded by all threads at once into rescale
// and psums ([kHeads][chunks] each); then per head one lane forms the chunks' rescales (in
// place of the maxima) and L; then each thread four dims of one head, their chunks' value sums
// loaded ahead of the (ordered) accumulation.
template <int kHeads>
__device__ void merge_chunks(const SplitArgs& a, int64_t t, int64_t tl, int h0, float* out, float* rescale,
                             float* psums) {
  __shared__ float s_L[kHeads];
  const int64_t Dh = a.Dh, Dh4 = Dh / 4, n = a.chunks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t i = threadIdx.x; i < kHeads * n; i += kThreads) {
    const int64_t at = (tl * a.H + h0) * n + i;  // head h0 + i / n, chunk i % n
    rescale[i] = __ldcg(a.x.cmax + at);
    psums[i] = __ldcg(a.x.psum + at);
  }
  __syncthreads();
  if (warp < kHeads && lane == 0) {
    float m = -1e30f, L = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      const float m_new = fmaxf(m, rescale[warp * n + c]), r = expf(m - m_new);
      rescale[warp * n + c] = r;
      L = __fadd_rn(__fmul_rn(L, r), psums[warp * n + c]);
      m = m_new;
    }
    s_L[warp] = __fadd_rn(L, expf(a.sink[h0 + warp] - m));
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < kHeads * Dh4; i += kThreads) {
    const int h = static_cast<int>(i / Dh4);
    const int64_t d4 = i % Dh4;
    const float4* part = reinterpret_cast<const float4*>(a.x.part + (tl * a.H + h0 + h) * n * Dh) + d4;
    const float* r = rescale + h * n;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int64_t c = 0; c < n; ++c) {
      const float4 v = __ldcg(part + c * Dh4);
      acc.x = __fadd_rn(__fmul_rn(acc.x, r[c]), v.x);
      acc.y = __fadd_rn(__fmul_rn(acc.y, r[c]), v.y);
      acc.z = __fadd_rn(__fmul_rn(acc.z, r[c]), v.z);
      acc.w = __fadd_rn(__fmul_rn(acc.w, r[c]), v.w);
    }
    const float L = s_L[h];
    float* o = out + h * Dh + 4 * d4;
    o[0] = round_bf16(__fdiv_rn(acc.x, L));
    o[1] = round_bf16(__fdiv_rn(acc.y, L));
    o[2] = round_bf16(__fdiv_rn(acc.z, L));
    o[3] = round_bf16(__fdiv_rn(acc.w, L));
  }
  const RopeArgs rope = a.rope;
  for (int h = 0; h < kHeads; ++h) rope.rotate(out + h * Dh, Dh, t, true);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < kHeads * Dh; i += kThreads) a.o[(t * a.H + h0) * Dh + i] = out[i];
}

// grid (chunks, H / kHeads, rows): the chunk's probabilities against the running max (as the
// reference: p = exp(logit - max), their sum in entry order, bf16 p for the values), its value
// sum (each thread four dims of one head, entries in order), then the last chunk's CTA to
// finish merges them all (merge_chunks, in chunk order whichever finishes last).
template <int kHeads>
__global__ void __launch_bounds__(kThreads) sparse_values_kernel(const __grid_constant__ SplitArgs a) {
  cuda::await_inputs();
  extern __shared__ float4 out_smem[];  // [kHeads][Dh] and twice [kHeads][chunks] for merge_chunks
  __shared__ float pb[kHeads][kChunk];
  __shared__ const float* rows[kChunk];
  __shared__ bool last;
  const int64_t c = blockIdx.x, tl = blockIdx.z, t = a.t0 + tl, Dh = a.Dh;
  const int h0 = static_cast<int>(blockIdx.y) * kHeads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cn = chunk_rows(a, c, t, rows);
  if (warp < kHeads) {
    const int64_t row = tl * a.H + h0 + warp, at = row * a.chunks + c;
    const float m_new = max_through(a.x.cmax + row * a.chunks, c, lane);
    const float* lg = a.x.logits + at * kChunk;
    for (int k = lane; k < kChunk; k += 32) pb[warp][k] = k < cn ? expf(lg[k] - m_new) : 0.0f;  // p, unrounded
    __syncwarp();
    if (lane == 0) {
      float psum = 0.0f;
      for (int k = 0; k < cn; ++k) psum = __fadd_rn(psum, pb[warp][k]);
      a.x.psum[at] = psum;
    }
    __syncwarp();
    for (int k = lane; k < kChunk; k += 32) pb[warp][k] = round_bf16(pb[warp][k]);
  }
  __syncthreads();
  // Each thread's kHeads values of a head: kBatch rows loaded at once (rows past cn are null:
  // chunk_rows), then added in entry order, a null row skipped (acc as it was). With the loads
  // inside the ordered loop each waited on the one before (a null row may not be loaded
  // through): ncu 16.6 us a launch at 128 CTAs; 12.3 with 16 rows a batch of 16-byte loads,
  // 11.7 with 64 of 4 bytes (1 head).
  using Vec = FloatVec<kHeads>;
  constexpr int kBatch = kChunk / kHeads;
  const int64_t Dhv = Dh / kHeads;
  for (int64_t i = threadIdx.x; i < kHeads * Dhv; i += kThreads) {
    const int h = static_cast<int>(i / Dhv);
    const int64_t dv = i % Dhv;
    float acc[kHeads] = {};
    for (int k0 = 0; k0 < cn; k0 += kBatch) {
      float v[kBatch][kHeads];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float* row = rows[k0 + j];
        Vec::load(row != nullptr ? row + dv * kHeads : nullptr, v[j]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (rows[k0 + j] == nullptr) continue;
        const float p = pb[h][k0 + j];
#pragma unroll
        for (int e = 0; e < kHeads; ++e) acc[e] = __fadd_rn(acc[e], __fmul_rn(p, v[j][e]));
      }
    }
    Vec::store(a.x.part + ((tl * a.H + h0 + h) * a.chunks + c) * Dh + dv * kHeads, acc);
  }
  // The last CTA of the (row, head group) to get here merges: every write above is visible
  // device-wide before the count moves.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.x.done + tl * (a.H / kHeads) + blockIdx.y, 1) == a.chunks - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* out = reinterpret_cast<float*>(out_smem);
  merge_chunks<kHeads>(a, t, tl, h0, out, out + kHeads * Dh, out + kHeads * (Dh + a.chunks));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t chunks_of(int64_t width) { return (width + kChunk - 1) / kChunk; }

bool split_off() {
  static const bool off = cuda::env_int("DSF_ATTN_SPLIT", 1) == 0;  // measurement: the single-launch kernel
  return off;
}

// Bytes of partial results a query row takes (all heads, all chunks).
int64_t row_scratch(int H, int64_t Dh, int64_t width) {
  return H * chunks_of(width) * (Dh + kChunk + 2) * static_cast<int64_t>(sizeof(float));
}

// Query rows a launch pair takes: all that fit kMaxScratch, or (a prefill chunk) as many as
// do, in passes; DSF_ATTN_SPLIT_PASSES=0 (measurement) leaves calls that need passes to the
// single-launch kernel.
int64_t rows_a_pass(int64_t S, int H, int64_t Dh, int64_t width) {
  static const bool passes = cuda::env_int("DSF_ATTN_SPLIT_PASSES", 1) != 0;
  const int64_t fit = kMaxScratch / row_scratch(H, Dh, width);
  return fit >= S ? S : passes ? fit : 0;
}

// Heads a CTA takes: the most (of 4, 2, 1) whose grid of (chunk, head group, row) CTAs still
// gives at least half the SMs one; else 1. A decode step's lists (a 128-entry window and the
// layer's compressed rows: 2-6 chunks at a 64-token prompt) at 64 heads on 132 SMs: asking a
// CTA for every SM (the rule until 2026-12-03) gave 4 chunks one head a CTA (256 CTAs), each
// reading its chunk's KV rows from L2 once per head, and 6 chunks two; now they take two and
// four (128 and 96 CTAs), the shorter step (H200, perf preset pooled, interleaved: 6.61-6.66
// against 6.67-6.69 ms). DSF_ATTN_HEADS=4, 2 or 1 (measurement) forces it. The result does not
// depend on it: each head's logits and value sums are formed alike whichever CTA holds it.
int heads_a_cta(int64_t rows, int H, int64_t chunks) {
  static const int forced = static_cast<int>(cuda::env_int("DSF_ATTN_HEADS", 0));
  if ((forced == 1 || forced == 2 || forced == 4) && H % forced == 0) return forced;
  for (int k = kMaxHeads; k > 1; k /= 2) {
    if (H % k == 0 && 2 * rows * chunks * (H / k) >= cuda::sm_count()) return k;
  }
  return 1;
}

template <int kHeads>
Status launch_pair(cudaStream_t st, const SplitArgs& args, int64_t rows) {
  const size_t smem = static_cast<size_t>(kHeads * args.Dh) * sizeof(float);
  const size_t merge_smem = smem + static_cast<size_t>(2 * kHeads * args.chunks) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(args.chunks), static_cast<unsigned>(args.H / kHeads), static_cast<unsigned>(rows));
  RETURN_IF_ERROR(cuda::launch(sparse_logits_kernel<kHeads>, cuda::LaunchParams{grid, dim3(kThreads), smem, st}, args));
  return cuda::launch(sparse_values_kernel<kHeads>,
                      cuda::LaunchParams{grid, dim3(kThreads), merge_smem, st}, args);
}

}  // namespace

bool split_applies(int64_t S, int H, int64_t Dh, int64_t width, const float* q, const float* kv_a, const float* kv_b,
                   const float* o) {
  if (split_off() || width <= 0 || H % kMaxHeads != 0 || Dh % 4 != 0 || Dh > kMaxDh) return false;
  if (chunks_of(width) > kMaxChunks) return false;
  if (!aligned16(q) || !aligned16(kv_a) || (kv_b != nullptr && !aligned16(kv_b)) || !aligned16(o)) return false;
  return rows_a_pass(S, H, Dh, width) > 0;
}

Status sparse_attn_split(cudaStream_t st, const float* q, int64_t S, int H, int64_t Dh, const float* kv_a, int64_t n_a,
                         const float* kv_b, const int32_t* idx, int64_t width, const float* sink, float scale, float* o,
                         const RopeArgs& rope, const WindowArgs& win) {
  const int64_t per = rows_a_pass(S, H, Dh, width);
  if (per <= 0) return absl::InternalError("sparse_attn_split: no row fits its scratch");
  const int64_t chunks = chunks_of(width), n = per * H * chunks;  // a pass's (row, head, chunk) triples
  const int64_t floats = n * (Dh + kChunk + 2);
  void* mem = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&mem, floats * sizeof(float) + per * H * sizeof(int), st));  // counters: H / kHeads a row
  float* f = static_cast<float*>(mem);
  const Scratch x{f, f + n * Dh, f + n * (Dh + kChunk), f + n * (Dh + kChunk + 1), reinterpret_cast<int*>(f + floats)};
  const Status s = [&]() -> Status {
    for (int64_t t0 = 0; t0 < S; t0 += per) {  // each pass reuses the scratch (stream order)
      const SplitArgs args{q, H, Dh, kv_a, n_a, kv_b, idx, width, sink, scale, rope, win, chunks, x, o, t0, S};
      const int64_t rows = std::min(per, S - t0);
      switch (heads_a_cta(rows, H, chunks)) {
        case 4: RETURN_IF_ERROR(launch_pair<4>(st, args, rows)); break;
        case 2: RETURN_IF_ERROR(launch_pair<2>(st, args, rows)); break;
        default: RETURN_IF_ERROR(launch_pair<1>(st, args, rows)); break;
      }
    }
    return absl::OkStatus();
  }();
  (void)cudaFreeAsync(mem, st);
  return s;
}

}  // namespace dsflash::kernels::attn::detail
