// MoE kernels (see moe_cuda.h).
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/linear/wide16.cuh"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_math.cuh"

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

// route_kernel for E <= 32 on one warp: lane e holds expert e's logit z (lanes >= E: any) and
// scores in registers, each round's arg-max is the same butterfly over the same (value, index)
// pairs, the chosen lane marks itself, and every lane adds the chosen scores in pick order
// (route_kernel's lane 0 sum): the same experts and weights bit for bit, without the
// shared-memory passes and lane 0's reads back.
__device__ __forceinline__ void route_lanes(float z, const float* __restrict__ bias, int64_t E, int64_t k,
                                            bool norm_topk, float route_scale, int32_t* __restrict__ experts,
                                            float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  float score = 0.0f, biased = -INFINITY;
  if (lane < E) {
    score = route_score(z);
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
      experts[r] = arg;
    }
    sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, score, arg));
  }
  if (rank >= 0) weights[rank] = route_weight(score, sum, k, norm_topk, route_scale);
}

__global__ void route_lanes_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t E,
                                   int64_t k, bool norm_topk, float route_scale, int32_t* __restrict__ experts,
                                   float* __restrict__ weights) {
  cuda::await_inputs();
  const int64_t t = blockIdx.x;
  const float z = threadIdx.x < E ? logits[t * E + threadIdx.x] : 0.0f;
  route_lanes(z, bias, E, k, norm_topk, route_scale, experts + t * k, weights + t * k);
}

// One token's router GEMV and routing in one launch: CTA e computes logit e as
// linear_wide16_kernel does (fp32 output), and the last CTA to finish routes on its first warp
// as route_lanes_kernel does.
struct RouterArgs {
  const uint8_t* w;
  int64_t row_bytes, cols;
  const float* x;
  const float* bias;
  int64_t k;
  bool norm_topk;
  float route_scale;
  float* logits;
  int32_t* experts;
  float* weights;
  int* counter;
};

constexpr int kRouterThreads = 256;  // linear_wide16_kernel's block

template <quant::GgmlType kType>
__global__ void __launch_bounds__(kRouterThreads) router_route_kernel(const RouterArgs a) {
  cuda::await_inputs();
  __shared__ float part[kRouterThreads / 32];
  const int64_t e = blockIdx.x, E = gridDim.x;
  const float z = wide16_row_dot<kType, kRouterThreads>(a.w + e * a.row_bytes, a.x, a.cols, part);
  if (threadIdx.x == 0) a.logits[e] = z;
  if (!cuda::last_arrival(a.counter, static_cast<int>(E))) return;
  if (threadIdx.x >= 32) return;
  const float zl = threadIdx.x < E ? __ldcg(a.logits + threadIdx.x) : 0.0f;
  route_lanes(zl, a.bias, E, a.k, a.norm_topk, a.route_scale, a.experts, a.weights);
}

__global__ void swiglu_kernel(float* __restrict__ a, const float* __restrict__ b, int64_t S, int64_t F, float limit,
                              const float* __restrict__ weight) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * F) return;
  a[i] = swiglu_value(a[i], b[i], limit, weight ? weight[i / F] : 1.0f);
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

__global__ void combine_routed_kernel(const float* __restrict__ y, const int32_t* __restrict__ experts,
                                      const float* __restrict__ shared, int64_t S, int64_t K, int64_t D, bool loaded,
                                      float* __restrict__ out) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * D) return;
  const int64_t t = i / D, d = i % D;
  const float sh = shared[i];
  if (loaded) {  // K <= kCombineMaxK: every row loaded at once, then added in the same order
    out[i] = routed_output(RoutedOrder(experts + t * K, K), y + t * K * D + d, D, K, sh);
    return;
  }
  out[i] = cuda::round_bf16(__fadd_rn(routed_sum_serial(y, experts + t * K, t, K, D, d), sh));
}

cuda::LaunchParams flat(const ExecCtx& ctx, int64_t n) {
  return cuda::LaunchParams{dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0,
                            static_cast<cudaStream_t>(ctx.cuda_stream)};
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
                                           static_cast<cudaStream_t>(ctx.cuda_stream)},
                        logits, bias, E, k, norm_topk, route_scale, experts, weights);
  }
  const size_t smem = 2 * static_cast<size_t>(E) * sizeof(float) + static_cast<size_t>(E);
  return cuda::launch(route_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(32), smem,
                                         static_cast<cudaStream_t>(ctx.cuda_stream)},
                      logits, bias, E, k, norm_topk, route_scale, experts, weights);
}

bool router_route_supported(const Weight& w, const float* x, int64_t k) {
  const bool wide16 = w.type == quant::GgmlType::kBF16 || w.type == quant::GgmlType::kF16;
  return wide16 && w.rows > 0 && w.rows <= 32 && k > 0 && k <= w.rows && w.cols % 8 == 0 && w.row_bytes % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

Status router_route_cuda(const ExecCtx& ctx, const Weight& w, const float* x, const float* bias, int64_t k,
                         bool norm_topk, float route_scale, float* logits, int32_t* experts, float* weights,
                         int32_t* counter) {
  if (!router_route_supported(w, x, k)) {
    return absl::UnimplementedError(absl::StrCat("router_route_cuda: no fused router for ", k, " of ", w.rows, " ",
                                                 quant::traits(w.type).name, " rows of ", w.cols));
  }
  const RouterArgs a{w.data, static_cast<int64_t>(w.row_bytes), w.cols, x, bias, k, norm_topk, route_scale,
                     logits, experts, weights, counter};
  const cuda::LaunchParams lp{dim3(static_cast<unsigned>(w.rows)), dim3(kRouterThreads), 0,
                              static_cast<cudaStream_t>(ctx.cuda_stream)};
  if (w.type == quant::GgmlType::kBF16) return cuda::launch(router_route_kernel<quant::GgmlType::kBF16>, lp, a);
  return cuda::launch(router_route_kernel<quant::GgmlType::kF16>, lp, a);
}

Status swiglu_cuda(const ExecCtx& ctx, float* a, const float* b, int64_t S, int64_t F, float limit,
                   const float* weight) {
  if (S <= 0 || F <= 0) return absl::OkStatus();
  return cuda::launch(swiglu_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>((S * F + 255) / 256)), dim3(256), 0,
                                         static_cast<cudaStream_t>(ctx.cuda_stream)},
                      a, b, S, F, limit, weight);
}

}  // namespace dsflash::kernels::moe
