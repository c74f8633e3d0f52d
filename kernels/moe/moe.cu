// MoE kernels (see moe_cuda.h).
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"
#include "kernels/moe/moe_cuda.h"

namespace dsflash::kernels::moe {
namespace {

// The warp's largest (best, arg) pair, ties to the lower arg, arg < 0 for none: every lane
// ends with the same pair (a butterfly over a total order).
__device__ __forceinline__ void warp_argmax(float& best, int32_t& arg) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int32_t oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (oa >= 0 && (arg < 0 || ob > best || (ob == best && oa < arg))) {
      best = ob;
      arg = oa;
    }
  }
}

// An expert's routing score from its logit: sqrt(softplus(z)).
__device__ __forceinline__ float route_score(float z) {
  const float sp = z > 20.0f ? z : log1pf(expf(z));
  return sqrtf(sp);
}

// A chosen expert's weight from its score and the chosen scores' sum (in pick order).
__device__ __forceinline__ float route_weight(float score, float sum, int64_t k, bool norm_topk, float route_scale) {
  if (norm_topk && k > 1) score = __fdiv_rn(score, __fadd_rn(sum, 1e-20f));
  return __fmul_rn(score, route_scale);
}

// One warp per token: sqrt-softplus scores and biased scores in shared memory, then k rounds
// of a warp arg-max (ties towards the lower index) over the experts not yet chosen.
__global__ void route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t E, int64_t k,
                             bool norm_topk, float route_scale, int32_t* __restrict__ experts,
                             float* __restrict__ weights) {
  cuda::await_inputs();
  extern __shared__ float smem[];
  float* score = smem;        // [E]
  float* biased = smem + E;   // [E]
  uint8_t* taken = reinterpret_cast<uint8_t*>(smem + 2 * E);
  const int lane = threadIdx.x;
  const int64_t t = blockIdx.x;
  for (int64_t e = lane; e < E; e += 32) {
    score[e] = route_score(logits[t * E + e]);
    biased[e] = __fadd_rn(score[e], bias[e]);
    taken[e] = 0;
  }
  __syncwarp();
  int32_t* et = experts + t * k;
  float* wt = weights + t * k;
  for (int64_t r = 0; r < k; ++r) {
    float best = -INFINITY;
    int32_t arg = -1;
    for (int64_t e = lane; e < E; e += 32) {
      if (!taken[e] && (arg < 0 || biased[e] > best)) {
        best = biased[e];
        arg = static_cast<int32_t>(e);
      }
    }
    warp_argmax(best, arg);
    if (lane == 0) {
      et[r] = arg;
      taken[arg] = 1;
    }
    __syncwarp();
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int64_t r = 0; r < k; ++r) sum = __fadd_rn(sum, score[et[r]]);
    for (int64_t r = 0; r < k; ++r) wt[r] = route_weight(score[et[r]], sum, k, norm_topk, route_scale);
  }
}

// route_kernel for E <= 32: lane e holds expert e's scores in registers, each round's arg-max is
// the same butterfly over the same (value, index) pairs, the chosen lane marks itself, and every
// lane adds the chosen scores in pick order (route_kernel's lane 0 sum): the same experts and
// weights bit for bit, without the shared-memory passes and lane 0's reads back.
__global__ void route_lanes_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t E,
                                   int64_t k, bool norm_topk, float route_scale, int32_t* __restrict__ experts,
                                   float* __restrict__ weights) {
  cuda::await_inputs();
  const int lane = threadIdx.x;
  const int64_t t = blockIdx.x;
  float score = 0.0f, biased = -INFINITY;
  if (lane < E) {
    score = route_score(logits[t * E + lane]);
    biased = __fadd_rn(score, bias[lane]);
  }
  bool taken = lane >= E;
  int rank = -1;
  float sum = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    float best = taken ? -INFINITY : biased;
    int32_t arg = taken ? -1 : lane;
    warp_argmax(best, arg);
    if (lane == arg) {
      taken = true;
      rank = static_cast<int>(r);
      experts[t * k + r] = arg;
    }
    sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, score, arg));
  }
  if (rank >= 0) weights[t * k + rank] = route_weight(score, sum, k, norm_topk, route_scale);
}

__global__ void swiglu_kernel(float* __restrict__ a, const float* __restrict__ b, int64_t S, int64_t F, float limit,
                              const float* __restrict__ weight) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * F) return;
  float g = a[i], u = b[i];
  if (limit > 0) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  const float w = weight ? weight[i / F] : 1.0f;
  a[i] = cuda::round_bf16(__fmul_rn(w, __fmul_rn(silu, u)));
}

__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ rows,
                               const float* __restrict__ shared, int64_t S, int64_t K, int64_t D, float* __restrict__ out) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * D) return;
  const int64_t t = i / D, d = i % D;
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) acc = __fadd_rn(acc, y[static_cast<int64_t>(rows[t * K + k]) * D + d]);
  out[i] = cuda::round_bf16(__fadd_rn(acc, shared[i]));
}

// Token t's K routed outputs at column d (row t K + k holds expert e[k]'s), summed from 0.0f in
// ascending expert id: the next larger id each time (ids of a token are distinct), each row
// loaded once chosen.
__device__ __forceinline__ float routed_sum_serial(const float* __restrict__ y, const int32_t* __restrict__ e,
                                                   int64_t t, int64_t K, int64_t D, int64_t d) {
  float acc = 0.0f;
  int32_t prev = -1;
  for (int64_t n = 0; n < K; ++n) {
    int64_t best = -1;
    for (int64_t k = 0; k < K; ++k) {
      if (e[k] > prev && (best < 0 || e[k] < e[best])) best = k;
    }
    acc = __fadd_rn(acc, y[(t * K + best) * D + d]);
    prev = e[best];
  }
  return acc;
}

// routed_sum_serial for K <= kCombineMaxK: every row loaded at once (the loads do not depend on
// the order), then added in ascending expert id through each row's rank among the ids, from
// constant register indices: the same additions in the same order. kExact: K is kMaxK (the
// combine compiled for the released model's top-k: no predicates, ~25 % of the code); I: the
// index type (32 bits where the call's sizes allow).
constexpr int kCombineMaxK = 8;
constexpr int kReleasedTopK = 6;

template <int kMaxK, bool kExact, typename I>
__device__ __forceinline__ float routed_sum_loaded(const float* __restrict__ y, const int32_t* __restrict__ e, I t,
                                                   I K_, I D, I d) {
  const I K = kExact ? I{kMaxK} : K_;
  int32_t id[kMaxK];
  float v[kMaxK];
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    id[k] = k < K ? e[k] : 0;
    v[k] = k < K ? y[(t * K + k) * D + d] : 0.0f;
  }
  int rank[kMaxK];
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    rank[k] = 0;
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) rank[k] += j < K && id[j] < id[k] ? 1 : 0;
  }
  float acc = 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxK; ++r) {
    if (r >= K) break;
    float pick = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) pick = k < K && rank[k] == r ? v[k] : pick;
    acc = __fadd_rn(acc, pick);
  }
  return acc;
}

// combine_routed_kernel for exactly kK routed rows and S * K * D below 2^31 (32-bit indices).
template <int kK>
__global__ void combine_routed_exact_kernel(const float* __restrict__ y, const int32_t* __restrict__ experts,
                                            const float* __restrict__ shared, int S, int D, float* __restrict__ out) {
  cuda::await_inputs();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= S * D) return;
  const int t = i / D, d = i - t * D;
  const float sh = shared[i];
  out[i] = cuda::round_bf16(__fadd_rn(routed_sum_loaded<kK, true>(y, experts + t * kK, t, kK, D, d), sh));
}

__global__ void combine_routed_kernel(const float* __restrict__ y, const int32_t* __restrict__ experts,
                                      const float* __restrict__ shared, int64_t S, int64_t K, int64_t D, bool loaded,
                                      float* __restrict__ out) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * D) return;
  const int64_t t = i / D, d = i % D;
  const float sh = shared[i];
  const float acc = loaded ? routed_sum_loaded<kCombineMaxK, false>(y, experts + t * K, t, K, D, d)
                           : routed_sum_serial(y, experts + t * K, t, K, D, d);
  out[i] = cuda::round_bf16(__fadd_rn(acc, sh));
}

cuda::LaunchParams flat(const ExecCtx& ctx, int64_t n) {
  return cuda::LaunchParams{dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0,
                            cuda::stream_of(ctx)};
}

}  // namespace

Status combine_cuda(const ExecCtx& ctx, const float* y, const int32_t* rows, const float* shared, int64_t S, int64_t K,
                    int64_t D, float* out) {
  if (S <= 0 || D <= 0) return absl::OkStatus();
  return cuda::launch(combine_kernel, flat(ctx, S * D), y, rows, shared, S, K, D, out);
}

Status combine_routed_cuda(const ExecCtx& ctx, const float* y, const int32_t* experts, const float* shared, int64_t S,
                           int64_t K, int64_t D, float* out) {
  if (S <= 0 || D <= 0) return absl::OkStatus();
  static const bool serial = cuda::env_int("DSF_COMBINE_SERIAL", 0) != 0;  // measurement
  if (K == kReleasedTopK && !serial && S * K * D < (int64_t{1} << 31)) {
    return cuda::launch(combine_routed_exact_kernel<kReleasedTopK>, flat(ctx, S * D), y, experts, shared,
                        static_cast<int>(S), static_cast<int>(D), out);
  }
  const bool loaded = K <= kCombineMaxK && !serial;
  return cuda::launch(combine_routed_kernel, flat(ctx, S * D), y, experts, shared, S, K, D, loaded, out);
}

Status route_cuda(const ExecCtx& ctx, const float* logits, const float* bias, int64_t S, int64_t E, int64_t k,
                  bool norm_topk, float route_scale, int32_t* experts, float* weights) {
  if (S <= 0) return absl::OkStatus();
  if (E <= 0 || E > 8192 || k <= 0 || k > E) {
    return absl::InvalidArgumentError(absl::StrCat("route_cuda: ", k, " of ", E, " experts"));
  }
  static const bool lanes = cuda::env_int("DSF_ROUTE_LANES", 1) != 0;  // measurement
  if (E <= 32 && lanes) {
    return cuda::launch(route_lanes_kernel,
                        cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(32), 0,
                                           cuda::stream_of(ctx)},
                        logits, bias, E, k, norm_topk, route_scale, experts, weights);
  }
  const size_t smem = 2 * static_cast<size_t>(E) * sizeof(float) + static_cast<size_t>(E);
  return cuda::launch(route_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(32), smem,
                                         cuda::stream_of(ctx)},
                      logits, bias, E, k, norm_topk, route_scale, experts, weights);
}

Status swiglu_cuda(const ExecCtx& ctx, float* a, const float* b, int64_t S, int64_t F, float limit,
                   const float* weight) {
  if (S <= 0 || F <= 0) return absl::OkStatus();
  return cuda::launch(swiglu_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>((S * F + 255) / 256)), dim3(256), 0,
                                         cuda::stream_of(ctx)},
                      a, b, S, F, limit, weight);
}

}  // namespace dsflash::kernels::moe
