// Attention kernels (see attn_cuda.h).

#include "kernels/attn/attn_cuda.h"
#include "kernels/attn/attn_args.cuh"
#include "kernels/attn/sparse_split.cuh"
#include "kernels/attn/sparse_tc.cuh"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"
#include "kernels/norm/norm_row.cuh"
#include "kernels/qdq/qdq_math.cuh"
#include "kernels/rope/rope_math.cuh"

namespace dsflash::kernels::attn {
namespace {

using cuda::round_bf16;
using namespace detail;

constexpr int kChunk = 64;  // entries per online-softmax step, as the reference
constexpr int kAttnThreads = 512;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kWarpEntries = kChunk / kAttnWarps;  // a chunk's entries per warp

// grid (H, S): one head of one query row. Per chunk: logits by warps (each warp's four entries
// at once; each entry's row address kept in shared memory), the chunk max and the
// probabilities by warp 0 (their sum in entry order by lane 0), then each thread forms the
// chunk's value sum for its dims in entry order and folds it into the accumulator. The loops
// over a row's dims and over a chunk's entries are unrolled so that their loads are in flight
// together (the sums keep their order): at decode the kernel is bound by load latency, 64 CTAs
// for a GPU's worth of SMs (one a SM: __launch_bounds__ lets it use the registers).
__global__ void __launch_bounds__(kAttnThreads, 1)
    sparse_attn_kernel(const float* __restrict__ q, int H, int64_t Dh, const float* __restrict__ kv_a, int64_t n_a,
                       const float* __restrict__ kv_b, const int32_t* __restrict__ idx, int64_t width,
                       const float* __restrict__ sink, float scale, const RopeArgs rope, const WindowArgs win,
                       float* __restrict__ o) {
  cuda::await_inputs();
  extern __shared__ float smem[];
  float* qh = smem;       // [Dh]
  float* acc = qh + Dh;   // [Dh]
  __shared__ float logit[kChunk], pb[kChunk], s_rescale, s_m, s_L;
  __shared__ const float* rows[kChunk];  // null: a padding entry
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.y;
  const float* qsrc = q + (t * H + h) * Dh;
  const int32_t* list = idx + t * (width - win.ww);
  const int64_t pos0 = win.ww > 0 ? cuda::scalar_value(win.pos0_value, win.pos0_dev) : 0;
  for (int64_t d = threadIdx.x; d < Dh; d += kAttnThreads) {
    qh[d] = qsrc[d];
    acc[d] = 0.0f;
  }
  if (threadIdx.x == 0) {
    s_m = -1e30f;
    s_L = 0.0f;
  }
  rope.rotate(qh, Dh, t, false);
  __syncthreads();
  for (int64_t c0 = 0; c0 < width; c0 += kChunk) {
    const int cn = static_cast<int>(min(static_cast<int64_t>(kChunk), width - c0));
    // Each warp's entries (k = warp + 16 i) with their loads in flight together; each dot
    // product still sums its dims in order, then across the warp.
    float dot[kWarpEntries];
    const float* r[kWarpEntries];
#pragma unroll
    for (int i = 0; i < kWarpEntries; ++i) {
      const int k = warp + i * kAttnWarps;
      const int64_t e = c0 + k;
      r[i] = k < cn ? kv_row(kv_a, n_a, kv_b, Dh, list_entry(win, pos0, gridDim.y, t, list, e)) : nullptr;
      dot[i] = 0.0f;
    }
#pragma unroll 4
    for (int64_t d = lane; d < Dh; d += 32) {
      const float qd = qh[d];
#pragma unroll
      for (int i = 0; i < kWarpEntries; ++i) {
        if (r[i] != nullptr) dot[i] = fmaf(qd, r[i][d], dot[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kWarpEntries; ++i) {
      const int k = warp + i * kAttnWarps;
      const float sum = cuda::warp_sum(dot[i]);
      if (lane == 0 && k < cn) {
        logit[k] = r[i] != nullptr ? sum * scale : -INFINITY;
        rows[k] = r[i];
      }
    }
    __syncthreads();
    if (warp == 0) {
      float cmax = -INFINITY;
      for (int k = lane; k < cn; k += 32) cmax = fmaxf(cmax, logit[k]);
      for (int off = 16; off > 0; off >>= 1) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, off));
      const float m = s_m, m_new = fmaxf(m, cmax);
      for (int k = lane; k < cn; k += 32) logit[k] = expf(logit[k] - m_new);  // p, unrounded
      __syncwarp();
      if (lane == 0) {
        float psum = 0.0f;
        for (int k = 0; k < cn; ++k) psum = __fadd_rn(psum, logit[k]);
        const float rescale = expf(m - m_new);
        s_L = __fadd_rn(__fmul_rn(s_L, rescale), psum);
        s_rescale = rescale;
        s_m = m_new;
      }
      for (int k = lane; k < cn; k += 32) pb[k] = round_bf16(logit[k]);
    }
    __syncthreads();
    const float rescale = s_rescale;
    for (int64_t d = threadIdx.x; d < Dh; d += kAttnThreads) {
      float part = 0.0f;
#pragma unroll 16
      for (int k = 0; k < cn; ++k) {
        const float* row = rows[k];
        if (row != nullptr) part = __fadd_rn(part, __fmul_rn(pb[k], row[d]));
      }
      acc[d] = __fadd_rn(__fmul_rn(acc[d], rescale), part);
    }
    __syncthreads();
  }
  const float L = __fadd_rn(s_L, expf(sink[h] - s_m));
  float* out = o + (t * H + h) * Dh;
  if (rope.freqs == nullptr) {
    for (int64_t d = threadIdx.x; d < Dh; d += kAttnThreads) out[d] = round_bf16(__fdiv_rn(acc[d], L));
    return;
  }
  for (int64_t d = threadIdx.x; d < Dh; d += kAttnThreads) acc[d] = round_bf16(__fdiv_rn(acc[d], L));
  rope.rotate(acc, Dh, t, true);
  __syncthreads();
  for (int64_t d = threadIdx.x; d < Dh; d += kAttnThreads) out[d] = acc[d];
}

__global__ void pool_kernel(const float* __restrict__ k, const float* __restrict__ s, int64_t groups, int r,
                            int64_t n, float* __restrict__ latent) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [groups][n]
  if (i >= groups * n) return;
  const int64_t g = i / n, c = i % n;
  const float* kg = k + g * r * n;
  const float* sg = s + g * r * n;
  float mx = -INFINITY;
  for (int t = 0; t < r; ++t) mx = fmaxf(mx, sg[t * n + c]);
  float den = 0.0f;
  for (int t = 0; t < r; ++t) den = __fadd_rn(den, expf(sg[t * n + c] - mx));
  float acc = 0.0f;
  for (int t = 0; t < r; ++t) acc = __fadd_rn(acc, __fmul_rn(kg[t * n + c], __fdiv_rn(expf(sg[t * n + c] - mx), den)));
  latent[i] = round_bf16(acc);
}

// bs[t][b] = max of score[t] over block b (-inf padded); the block of position
// compress_len - 1 pinned to +inf.
__global__ void block_max_kernel(const float* __restrict__ score, int64_t n, int64_t nb, int64_t block,
                                 int64_t pos0_value, const int64_t* pos0_dev, int ratio, float* __restrict__ bs) {
  cuda::await_inputs();
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (b >= nb) return;
  const int64_t compress_len = visible_keys(pos0_value, pos0_dev, t, ratio);
  float m = -INFINITY;
  for (int64_t i = b * block; i < min(n, (b + 1) * block); ++i) m = fmaxf(m, score[t * n + i]);
  if (compress_len >= 1 && (compress_len - 1) / block == b) m = INFINITY;
  bs[t * nb + b] = m;
}

__global__ void keep_blocks_kernel(const float* __restrict__ bs, const int32_t* __restrict__ chosen, int64_t nb,
                                   int64_t kb, int64_t S, uint8_t* __restrict__ keep) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [S][kb]
  if (i >= S * kb) return;
  const int64_t t = i / kb, b = chosen[i];
  keep[t * nb + b] = bs[t * nb + b] > -INFINITY;
}

__global__ void expand_mask_kernel(const uint8_t* __restrict__ keep, int64_t n, int64_t nb, int64_t block, int64_t S,
                                   uint8_t* __restrict__ mask) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [S][n]
  if (i >= S * n) return;
  const int64_t t = i / n, j = i % n;
  mask[i] = keep[t * nb + j / block];
}

__global__ void window_index_kernel(int64_t pos0_value, const int64_t* pos0_dev, int64_t S, int64_t W, int64_t width,
                                    int32_t* __restrict__ idx, int64_t ld) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [S][width]
  if (i >= S * width) return;
  const int64_t t = i / width, j = i % width;
  idx[t * ld + j] = window_entry(cuda::scalar_value(pos0_value, pos0_dev), S, W, t, j);
}

__global__ void ring_write_kernel(const float* __restrict__ kv, int64_t pos0_value, const int64_t* pos0_dev, int64_t S,
                                  int64_t first, int64_t W, int64_t Dh, float* __restrict__ ring) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [S - first][Dh]
  if (i >= (S - first) * Dh) return;
  const int64_t pos0 = cuda::scalar_value(pos0_value, pos0_dev);
  const int64_t t = first + i / Dh, d = i % Dh;
  ring[((pos0 + t) % W) * Dh + d] = kv[t * Dh + d];
}

// kv_rows_cuda: one block per row, the three ops in turn on the row in global memory (each
// thread's writes visible to the block after a barrier), each as its own kernel does it.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    kv_rows_kernel(float* __restrict__ kv, int64_t Dh, const float* __restrict__ norm_w, float eps,
                   const float* __restrict__ freqs, int half, int64_t pos0_value, const int64_t* pos0_dev,
                   float* __restrict__ ring, int64_t W) {
  cuda::await_inputs();
  const int64_t t = blockIdx.x, pos = cuda::scalar_value(pos0_value, pos0_dev) + t;
  float* row = kv + t * Dh;
  cuda::rms_norm_row<kThreads>(row, norm_w, Dh, eps, row);  // as rms_norm_kernel
  __syncthreads();
  for (int i = threadIdx.x; i < half; i += kThreads) {  // RoPE as rope_kernel (row t at pos0 + t)
    rope::detail::rotate_pair(row + Dh - 2 * half, i, static_cast<float>(pos) * freqs[i], false);
  }
  __syncthreads();
  for (int64_t i0 = 0; i0 < Dh; i0 += kThreads) {  // FP8 QDQ as qdq_kernel: a warp holds a block of 32
    const int64_t i = i0 + threadIdx.x;
    const float v = qdq::detail::qdq_lane<qdq::detail::Kind::kFp8E8m0>(i < Dh ? row[i] : 0.0f);
    if (i >= Dh) continue;
    row[i] = v;
    if (ring != nullptr) ring[(pos % W) * Dh + i] = v;
  }
}

__global__ void publish_topk_kernel(const int32_t* __restrict__ top, int64_t S, int64_t k, int64_t pos0_value,
                                    const int64_t* pos0_dev, int ratio, int64_t n_win, int32_t* __restrict__ out,
                                    int64_t ld) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * k) return;
  const int64_t t = i / k, visible = visible_keys(pos0_value, pos0_dev, t, ratio);
  const int32_t j = top != nullptr ? top[i] : static_cast<int32_t>(i % k);  // null: every key, k of k
  out[t * ld + i % k] = j < visible ? static_cast<int32_t>(j + n_win) : -1;
}

__global__ void mask_candidates_kernel(float* __restrict__ score, const uint8_t* __restrict__ cand, int64_t S,
                                       int64_t n, int64_t cand_ld) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * n) return;
  if (!cand[(i / n) * cand_ld + i % n]) score[i] = -INFINITY;
}

cuda::LaunchParams flat(const ExecCtx& ctx, int64_t n) {
  return cuda::LaunchParams{dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, cuda::stream_of(ctx)};
}

}  // namespace

Status sparse_attn_cuda(const ExecCtx& ctx, const float* q, int64_t S, int H, int64_t Dh, const float* kv_a,
                        int64_t n_a, const float* kv_b, const int32_t* idx, int64_t width, const float* sink,
                        float scale, float* o, const AttnRope* rope, const AttnWindow* window) {
  if (S <= 0 || H <= 0) return absl::OkStatus();
  if (Dh <= 0 || Dh > 4096) return absl::InvalidArgumentError(absl::StrCat("sparse_attn_cuda: head dim ", Dh));
  WindowArgs wa{0, 1, 0, nullptr};
  if (window != nullptr) {
    const int64_t ww = window->pos0.value == 0 ? std::min(S, window->W) : window->W;
    if (window->W <= 0 || ww > width) {
      return absl::InvalidArgumentError(absl::StrCat("sparse_attn_cuda: a window of ", window->W, " in lists of ", width));
    }
    wa = WindowArgs{ww, window->W, window->pos0.value, window->pos0.dev};
  }
  RopeArgs ra{nullptr, 0, 0, nullptr};
  if (rope != nullptr) {
    if (rope->freqs == nullptr || rope->dims <= 0 || rope->dims % 2 != 0 || rope->dims > Dh) {
      return absl::InvalidArgumentError("sparse_attn_cuda: RoPE dims must be even, positive and <= the head dim");
    }
    ra = RopeArgs{rope->freqs, rope->dims / 2, rope->pos0.value, rope->pos0.dev};
  }
  if (detail::tc_applies(S, H, Dh, width, ra.freqs != nullptr ? ra.half : 0, q, kv_a, kv_b)) {
    return detail::sparse_attn_tc(cuda::stream_of(ctx), q, S, H, Dh, kv_a, n_a, kv_b, idx, width, sink, scale, o, ra,
                                  wa);
  }
  if (detail::split_applies(S, H, Dh, width, q, kv_a, kv_b, o)) {
    return detail::sparse_attn_split(cuda::stream_of(ctx), q, S, H, Dh, kv_a, n_a, kv_b, idx, width, sink, scale, o, ra, wa);
  }
  const size_t smem = 2 * static_cast<size_t>(Dh) * sizeof(float);
  return cuda::launch(sparse_attn_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(H), static_cast<unsigned>(S)), dim3(kAttnThreads),
                                         smem, cuda::stream_of(ctx)},
                      q, H, Dh, kv_a, n_a, kv_b, idx, width, sink, scale, ra, wa, o);
}

Status pool_cuda(const ExecCtx& ctx, const float* k, const float* s, int64_t groups, int r, int64_t n, float* latent) {
  if (groups <= 0 || n <= 0) return absl::OkStatus();
  return cuda::launch(pool_kernel, flat(ctx, groups * n), k, s, groups, r, n, latent);
}

Status candidate_mask_cuda(const ExecCtx& ctx, const float* score, int64_t S, int64_t n, DevScalar pos0, int ratio,
                           int64_t topk_blocks, int64_t block, uint8_t* mask) {
  if (S <= 0 || n <= 0) return absl::OkStatus();
  if (ratio <= 0 || block <= 0 || topk_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("candidate_mask_cuda: ratio ", ratio, ", block ", block, ", top ", topk_blocks));
  }
  const int64_t nb = (n + block - 1) / block, kb = std::min(topk_blocks, nb);
  cudaStream_t st = cuda::stream_of(ctx);
  float* bs = nullptr;
  int32_t* chosen = nullptr;
  uint8_t* keep = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&bs, S * nb * sizeof(float), st));
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&chosen, S * kb * sizeof(int32_t), st));
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&keep, S * nb, st));
  const Status s = [&]() -> Status {
    RETURN_IF_ERROR(cuda::launch(
        block_max_kernel,
        cuda::LaunchParams{dim3(static_cast<unsigned>((nb + 255) / 256), static_cast<unsigned>(S)), dim3(256), 0, st},
        score, n, nb, block, pos0.value, pos0.dev, ratio, bs));
    RETURN_IF_ERROR(topk_cuda(ctx, bs, S, nb, kb, chosen));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(keep, 0, S * nb, st));
    RETURN_IF_ERROR(cuda::launch(keep_blocks_kernel, flat(ctx, S * kb), bs, chosen, nb, kb, S, keep));
    return cuda::launch(expand_mask_kernel, flat(ctx, S * n), keep, n, nb, block, S, mask);
  }();
  cudaFreeAsync(bs, st);
  cudaFreeAsync(chosen, st);
  cudaFreeAsync(keep, st);
  return s;
}

Status window_index_cuda(const ExecCtx& ctx, DevScalar pos0, int64_t S, int64_t W, int32_t* idx, int64_t ld) {
  const int64_t width = pos0.value == 0 ? std::min(S, W) : W;
  if (S <= 0 || width <= 0) return absl::OkStatus();
  return cuda::launch(window_index_kernel, flat(ctx, S * width), pos0.value, pos0.dev, S, W, width, idx, ld);
}

Status ring_write_cuda(const ExecCtx& ctx, const float* kv, DevScalar pos0, int64_t S, int64_t W, int64_t Dh,
                       float* ring) {
  const int64_t first = std::max<int64_t>(0, S - W);
  if (S <= 0) return absl::OkStatus();
  return cuda::launch(ring_write_kernel, flat(ctx, (S - first) * Dh), kv, pos0.value, pos0.dev, S, first, W, Dh, ring);
}

Status kv_rows_cuda(const ExecCtx& ctx, float* kv, int64_t S, int64_t Dh, const float* norm_w, float eps,
                    const float* freqs, int dims, DevScalar pos0, float* ring, int64_t W) {
  if (S <= 0) return absl::OkStatus();
  if (Dh <= 0 || Dh % 32 != 0 || dims <= 0 || dims % 2 != 0 || dims > Dh || (ring != nullptr && (S != 1 || W <= 0))) {
    return absl::InvalidArgumentError(absl::StrCat("kv_rows_cuda: Dh ", Dh, " (a multiple of 32), dims ", dims,
                                                   " (even, <= Dh), a ring write only for one row"));
  }
  return cuda::with_norm_threads(Dh, [&](auto threads) {
    constexpr int kThreads = decltype(threads)::value;
    return cuda::launch(kv_rows_kernel<kThreads>,
                        cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(kThreads), 0, cuda::stream_of(ctx)}, kv, Dh,
                        norm_w, eps, freqs, dims / 2, pos0.value, pos0.dev, ring, W);
  });
}

Status publish_topk_cuda(const ExecCtx& ctx, const int32_t* top, int64_t S, int64_t k, DevScalar pos0, int ratio,
                         int64_t n_win, int32_t* out, int64_t ld) {
  if (S <= 0 || k <= 0) return absl::OkStatus();
  return cuda::launch(publish_topk_kernel, flat(ctx, S * k), top, S, k, pos0.value, pos0.dev, ratio, n_win, out, ld);
}

Status mask_candidates_cuda(const ExecCtx& ctx, float* score, const uint8_t* cand, int64_t S, int64_t n,
                            int64_t cand_ld) {
  if (S <= 0 || n <= 0) return absl::OkStatus();
  return cuda::launch(mask_candidates_kernel, flat(ctx, S * n), score, cand, S, n, cand_ld);
}

}  // namespace dsflash::kernels::attn
