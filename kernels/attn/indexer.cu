// The indexer's scores and the top-k selection (see attn_cuda.h).
#include <cub/block/block_scan.cuh>

#include "kernels/attn/attn_args.cuh"
#include "kernels/attn/attn_cuda.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"

namespace dsflash::kernels::attn {
namespace {

using cuda::round_bf16;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

// One head's term of a key's score, as the CPU forms it: bf16(relu(bf16(dot)) x bf16(w x scale)).
__device__ __forceinline__ float score_term(float dot, float w, float w_scale) {
  const float relu = fmaxf(round_bf16(dot), 0.0f);
  return round_bf16(__fmul_rn(relu, round_bf16(__fmul_rn(w, w_scale))));
}

// ---- index scores -------------------------------------------------------------------------

constexpr int kScoreWarps = 8;

// Any Di. grid (ceil(n_keys / 8), S): one key per warp, the heads in order; each dot is a
// lane's products in dim order then warp_sum's xor tree.
__global__ void index_scores_kernel(const float* __restrict__ q, int Hi, int64_t Di, const float* __restrict__ keys,
                                    int64_t n_keys, const float* __restrict__ w, float w_scale, int64_t pos0_value,
                                    const int64_t* pos0_dev, int ratio, float* __restrict__ score) {
  cuda::await_inputs();
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kScoreWarps + (threadIdx.x >> 5);
  const int64_t t = blockIdx.y;
  if (j >= n_keys) return;
  const int64_t visible = detail::visible_keys(pos0_value, pos0_dev, t, ratio);
  float* out = score + t * n_keys + j;
  if (j >= visible) {
    if (lane == 0) *out = -INFINITY;
    return;
  }
  const float* kj = keys + j * Di;
  const float* qt = q + t * Hi * Di;
  const float* wt = w + t * Hi;
  float sum = 0.0f;
  for (int h = 0; h < Hi; ++h) {
    float dot = 0.0f;
    for (int64_t d = lane; d < Di; d += 32) dot = fmaf(qt[h * Di + d], kj[d], dot);
    sum = __fadd_rn(sum, score_term(cuda::warp_sum(dot), wt[h], w_scale));
  }
  if (lane == 0) *out = round_bf16(sum);
}

// Di = 32 x kDW. A warp takes kKeys = 4 keys (held in registers) and the heads eight at a
// time: 32 dots a round, each a lane's products in dim order as above, folded across the warp
// in 31 shuffles (the values halve at each xor step, so lane l ends with dot l: head l / 4,
// key l % 4) instead of 32 x 5; the xor tree is warp_sum's, so every score equals the one-key
// kernel's bit for bit. The heads' terms are then summed in head order. Loads q once a warp
// for four keys.
constexpr int kKeys = 4, kHeadsRound = 32 / kKeys, kFoldWarps = 4;

// 2S values a lane -> S: each lane keeps the half its bit S picks and adds its partner's.
template <int S>
__device__ __forceinline__ void fold(float (&v)[32], int lane) {
  const bool upper = (lane & S) != 0;
#pragma unroll
  for (int c = 0; c < S; ++c) {
    const float send = upper ? v[c] : v[c + S];
    const float keep = upper ? v[c + S] : v[c];
    v[c] = keep + __shfl_xor_sync(kFull, send, S);
  }
}

template <int kDW>
__global__ void __launch_bounds__(kFoldWarps * 32)
    index_scores_fold_kernel(const float* __restrict__ q, int Hi, const float* __restrict__ keys, int64_t n_keys,
                             const float* __restrict__ w, float w_scale, int64_t pos0_value, const int64_t* pos0_dev,
                             int ratio, float* __restrict__ score) {
  constexpr int Di = 32 * kDW;
  cuda::await_inputs();
  const int lane = threadIdx.x & 31;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kFoldWarps + (threadIdx.x >> 5)) * kKeys;
  const int64_t t = blockIdx.y;
  if (j0 >= n_keys) return;
  const int64_t visible = detail::visible_keys(pos0_value, pos0_dev, t, ratio);
  const int64_t j = j0 + (lane & (kKeys - 1));  // the key whose score this lane ends with
  float* out = score + t * n_keys + j;
  const bool writer = lane < kKeys && j < n_keys;
  if (j0 >= visible) {
    if (writer) *out = -INFINITY;
    return;
  }
  float k[kKeys][kDW];
#pragma unroll
  for (int kk = 0; kk < kKeys; ++kk) {
    const bool real = j0 + kk < n_keys;
#pragma unroll
    for (int i = 0; i < kDW; ++i) k[kk][i] = real ? keys[(j0 + kk) * Di + lane + 32 * i] : 0.0f;
  }
  const float* qt = q + t * Hi * Di;
  const float* wt = w + t * Hi;
  float sum = 0.0f;
  for (int h0 = 0; h0 < Hi; h0 += kHeadsRound) {
    float v[32];
#pragma unroll
    for (int g = 0; g < kHeadsRound; ++g) {
      float qv[kDW];
#pragma unroll
      for (int i = 0; i < kDW; ++i) qv[i] = h0 + g < Hi ? qt[(h0 + g) * Di + lane + 32 * i] : 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKeys; ++kk) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kDW; ++i) dot = fmaf(qv[i], k[kk][i], dot);
        v[g * kKeys + kk] = dot;
      }
    }
    fold<16>(v, lane);
    fold<8>(v, lane);
    fold<4>(v, lane);
    fold<2>(v, lane);
    fold<1>(v, lane);
    const int h = h0 + lane / kKeys;
    const float term = h < Hi ? score_term(v[0], wt[h], w_scale) : 0.0f;
#pragma unroll
    for (int g = 0; g < kHeadsRound; ++g) {
      const float tg = __shfl_sync(kFull, term, g * kKeys + (lane & (kKeys - 1)));
      if (h0 + g < Hi) sum = __fadd_rn(sum, tg);
    }
  }
  if (writer) *out = j < visible ? round_bf16(sum) : -INFINITY;
}

template <int kDW>
Status launch_fold(cudaStream_t st, const float* q, int64_t S, int Hi, const float* keys, int64_t n_keys,
                   const float* w, float w_scale, DevScalar pos0, int ratio, float* score) {
  constexpr int64_t kPerCta = kFoldWarps * kKeys;
  const dim3 grid(static_cast<unsigned>((n_keys + kPerCta - 1) / kPerCta), static_cast<unsigned>(S));
  return cuda::launch(index_scores_fold_kernel<kDW>, cuda::LaunchParams{grid, dim3(kFoldWarps * 32), 0, st}, q, Hi,
                      keys, n_keys, w, w_scale, pos0.value, pos0.dev, ratio, score);
}

// ---- top-k ----------------------------------------------------------------------------------

constexpr int kTopkThreads = 512;
constexpr int kTopkLoads = 4;  // keys a thread loads at once

// hist[bin] += 1 for each lane with `hit`: one shared-memory atomic per distinct bin of the
// warp (ties and the -inf keys of a graph's unseen positions would otherwise queue on one
// address). Every lane of the warp calls it.
__device__ __forceinline__ void count_bin(uint32_t* hist, bool hit, uint32_t bin) {
  const unsigned hits = __ballot_sync(kFull, hit);
  if (!hit) return;
  const unsigned peers = __match_any_sync(hits, bin);
  if (static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// Warp 0: the bin where the count from bin 255 downwards first reaches *need (the counts total
// at least *need): *prefix gains it at `shift`, *need becomes what is left to take inside it,
// and *whole says whether that is every key of the bin (then no later pass can split it).
__device__ void choose_bin(const uint32_t* hist, int shift, uint32_t* prefix, uint32_t* need, uint32_t* whole) {
  const int lane = threadIdx.x & 31;
  uint32_t c[8], own = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) own += (c[i] = hist[255 - 8 * lane - i]);
  uint32_t incl = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t up = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += up;
  }
  const uint32_t want = *need;
  const unsigned reached = __ballot_sync(kFull, incl >= want);
  if (lane != __ffs(reached) - 1) return;
  uint32_t rem = want - (incl - own);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (c[i] >= rem) {
      *prefix |= static_cast<uint32_t>(255 - 8 * lane - i) << shift;
      *need = rem;
      *whole = c[i] == rem;
      return;
    }
    rem -= c[i];
  }
}

// One row per block. Radix selection of the k-th largest key, 8 bits per pass from the top;
// then every key above it and the first `need` keys equal to it (lowest indices) are written
// in index order, a tile of kTopkThreads x kTopkLoads keys (a thread's keys contiguous) at a
// time through one block scan of packed (equal, above) counts. The passes stop once the chosen
// bin is taken whole: keys are then compared on the bits decided so far (bf16 scores, whose low
// 16 bits never differ, end after two passes unless the k-th value is tied). With ratio > 0, row t reads
// only its first (pos0 + t + 1) / ratio keys and counts the rest as -inf (keys a query cannot
// see yet: a graph's step scores a capacity's keys, most of them beyond the position).
__global__ void __launch_bounds__(kTopkThreads)
    topk_kernel(const float* __restrict__ v, int64_t n, int64_t k, int64_t pos0_value, const int64_t* pos0_dev,
                int ratio, int32_t* __restrict__ out) {
  cuda::await_inputs();
  const int64_t n_read =
      ratio > 0 ? clamp64(detail::visible_keys(pos0_value, pos0_dev, blockIdx.x, ratio), 0, n) : n;
  const uint32_t neg_inf = cuda::ordered_key(-INFINITY);
  using Scan = cub::BlockScan<uint32_t, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_need, s_whole;
  const float* row = v + static_cast<int64_t>(blockIdx.x) * n;
  int32_t* dst = out + static_cast<int64_t>(blockIdx.x) * k;
  uint32_t mask = 0;
  if (threadIdx.x == 0) {
    s_need = static_cast<uint32_t>(k);
    s_prefix = 0;
    s_whole = 0;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int64_t base = 0; base < n_read; base += kTopkThreads * kTopkLoads) {  // the same trips for every thread
      uint32_t key[kTopkLoads];
#pragma unroll
      for (int u = 0; u < kTopkLoads; ++u) {
        const int64_t i = base + u * kTopkThreads + threadIdx.x;
        key[u] = i < n_read ? cuda::ordered_key(row[i]) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kTopkLoads; ++u) {
        const int64_t i = base + u * kTopkThreads + threadIdx.x;
        count_bin(hist, i < n_read && (key[u] & mask) == prefix, (key[u] >> shift) & 255u);
      }
    }
    if (threadIdx.x == 0 && n_read < n && (neg_inf & mask) == prefix) {
      atomicAdd(&hist[(neg_inf >> shift) & 255u], static_cast<uint32_t>(n - n_read));
    }
    __syncthreads();
    if (threadIdx.x < 32) choose_bin(hist, shift, &s_prefix, &s_need, &s_whole);
    __syncthreads();
    mask |= 0xffu << shift;
    if (s_whole != 0) break;  // the same value for every thread
  }
  const uint32_t thr = s_prefix;
  const int64_t need = s_need;
  int64_t base = 0, eq_seen = 0;  // keys taken, keys equal to thr passed
  constexpr int64_t kTile = int64_t{kTopkThreads} * kTopkLoads;
  for (int64_t t0 = 0; t0 < n_read && base < k; t0 += kTile) {
    const int64_t i0 = t0 + static_cast<int64_t>(threadIdx.x) * kTopkLoads;
    uint32_t key[kTopkLoads], above = 0, equal = 0;
#pragma unroll
    for (int u = 0; u < kTopkLoads; ++u) {
      key[u] = i0 + u < n_read ? cuda::ordered_key(row[i0 + u]) & mask : 0u;
      above += i0 + u < n_read && key[u] > thr;
      equal += i0 + u < n_read && key[u] == thr;
    }
    uint32_t before, total;  // (equal << 16 | above) of the threads before, of the tile
    Scan(scan_tmp).ExclusiveSum(equal << 16 | above, before, total);
    __syncthreads();
    const int64_t eq_left = need - eq_seen;  // equal keys still to take at the tile's start
    int64_t eq_rank = eq_seen + (before >> 16);
    int64_t pos = base + (before & 0xffffu) + clamp64(eq_left, 0, before >> 16);
#pragma unroll
    for (int u = 0; u < kTopkLoads; ++u) {
      if (i0 + u >= n_read) break;
      if (key[u] > thr) {
        dst[pos++] = static_cast<int32_t>(i0 + u);
      } else if (key[u] == thr) {
        if (eq_rank < need) dst[pos++] = static_cast<int32_t>(i0 + u);
        ++eq_rank;
      }
    }
    base += (total & 0xffffu) + clamp64(eq_left, 0, total >> 16);
    eq_seen += total >> 16;
  }
  // What is left to take are keys counted as -inf, the first ones in index order (the
  // selection reached them, so they are at or above the k-th largest).
  for (int64_t i = threadIdx.x; i < k - base; i += kTopkThreads) dst[base + i] = static_cast<int32_t>(n_read + i);
}

}  // namespace

Status index_scores_cuda(const ExecCtx& ctx, const float* q, int64_t S, int Hi, int64_t Di, const float* keys,
                         int64_t n_keys, const float* w, float w_scale, DevScalar pos0, int ratio, float* score) {
  if (S <= 0 || n_keys <= 0) return absl::OkStatus();
  if (ratio <= 0) return absl::InvalidArgumentError(absl::StrCat("index_scores_cuda: ratio ", ratio));
  cudaStream_t st = cuda::stream_of(ctx);
  if (cuda::env_int("DSF_INDEX_FOLD", 1) != 0) {
    switch (Di) {
      case 32: return launch_fold<1>(st, q, S, Hi, keys, n_keys, w, w_scale, pos0, ratio, score);
      case 64: return launch_fold<2>(st, q, S, Hi, keys, n_keys, w, w_scale, pos0, ratio, score);
      case 128: return launch_fold<4>(st, q, S, Hi, keys, n_keys, w, w_scale, pos0, ratio, score);
      case 256: return launch_fold<8>(st, q, S, Hi, keys, n_keys, w, w_scale, pos0, ratio, score);
      default: break;
    }
  }
  const dim3 grid(static_cast<unsigned>((n_keys + kScoreWarps - 1) / kScoreWarps), static_cast<unsigned>(S));
  return cuda::launch(index_scores_kernel, cuda::LaunchParams{grid, dim3(kScoreWarps * 32), 0, st}, q, Hi, Di, keys,
                      n_keys, w, w_scale, pos0.value, pos0.dev, ratio, score);
}

Status topk_cuda(const ExecCtx& ctx, const float* v, int64_t rows, int64_t n, int64_t k, int32_t* out) {
  return topk_visible_cuda(ctx, v, rows, n, k, DevScalar{}, 0, out);
}

Status topk_visible_cuda(const ExecCtx& ctx, const float* v, int64_t rows, int64_t n, int64_t k, DevScalar pos0,
                         int ratio, int32_t* out) {
  if (rows <= 0) return absl::OkStatus();
  if (k <= 0 || k > n || ratio < 0) {
    return absl::InvalidArgumentError(absl::StrCat("topk_cuda: k ", k, " of ", n, ", ratio ", ratio));
  }
  if (n >= (int64_t{1} << 31)) return absl::InvalidArgumentError(absl::StrCat("topk_cuda: ", n, " keys (at most 2^31 - 1)"));
  return cuda::launch(topk_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(rows)), dim3(kTopkThreads), 0, cuda::stream_of(ctx)}, v,
                      n, k, pos0.value, pos0.dev, ratio, out);
}

}  // namespace dsflash::kernels::attn
