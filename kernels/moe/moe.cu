// MoE kernels (see moe_cuda.h).
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"
#include "common/quant/quant.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/linear/linear.h"
#include "kernels/moe/moe_cuda.h"

namespace dsflash::kernels::moe {
namespace {

using quant::GgmlType;

// The routing of one token's logits on one warp (the calling thread's lane = threadIdx.x & 31):
// sqrt-softplus scores and biased scores in shared memory (score, biased: E floats, taken: E
// bytes), then k rounds of a warp arg-max (ties towards the lower index) over the experts not
// yet chosen.
__device__ __forceinline__ void route_token(const float* logits, const float* __restrict__ bias, int64_t E, int64_t k,
                                            bool norm_topk, float route_scale, float* score, float* biased,
                                            uint8_t* taken, int32_t* __restrict__ et, float* __restrict__ wt) {
  const int lane = threadIdx.x & 31;
  for (int64_t e = lane; e < E; e += 32) {
    const float z = logits[e];
    const float sp = z > 20.0f ? z : log1pf(expf(z));
    score[e] = sqrtf(sp);
    biased[e] = __fadd_rn(score[e], bias[e]);
    taken[e] = 0;
  }
  __syncwarp();
  for (int64_t r = 0; r < k; ++r) {
    float best = -INFINITY;
    int32_t arg = -1;
    for (int64_t e = lane; e < E; e += 32) {
      if (!taken[e] && (arg < 0 || biased[e] > best)) {
        best = biased[e];
        arg = static_cast<int32_t>(e);
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int32_t oa = __shfl_xor_sync(0xffffffffu, arg, off);
      if (oa >= 0 && (arg < 0 || ob > best || (ob == best && oa < arg))) {
        best = ob;
        arg = oa;
      }
    }
    if (lane == 0) {
      et[r] = arg;
      taken[arg] = 1;
    }
    __syncwarp();
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int64_t r = 0; r < k; ++r) sum = __fadd_rn(sum, score[et[r]]);
    for (int64_t r = 0; r < k; ++r) {
      float w = score[et[r]];
      if (norm_topk && k > 1) w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
      wt[r] = __fmul_rn(w, route_scale);
    }
  }
}

// One warp per token.
__global__ void route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t E, int64_t k,
                             bool norm_topk, float route_scale, int32_t* __restrict__ experts,
                             float* __restrict__ weights) {
  cuda::await_inputs();
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x;
  route_token(logits + t * E, bias, E, k, norm_topk, route_scale, smem, smem + E,
              reinterpret_cast<uint8_t*>(smem + 2 * E), experts + t * k, weights + t * k);
}

// One decode token's router and routing in one launch, for few experts: a cluster of kCtas
// CTAs, CTA c taking rows c, c + kCtas, ... (at most kRows), each row summed as
// linear_wide16_kernel sums it (each thread 8 columns a load at i = threadIdx.x + m kThreads,
// fmaf in column order, then block_sum), so the logits are that kernel's bit for bit. A CTA's
// weights are in registers before it waits for x (nothing earlier writes them). The logits
// meet in CTA 0's shared memory, whose first warp routes them as route_kernel.
constexpr int kRouterThreads = 256, kRouterCtas = 8, kRouterIters = 4;  // columns up to 8 x 256 x 4

struct RouterArgs {
  const uint8_t* w;
  int64_t row_bytes, cols, E, k;
  const float* x;
  const float* bias;
  bool norm_topk;
  float route_scale;
  int32_t* experts;
  float* weights;
};

template <GgmlType kType, int kRows>
__global__ void __launch_bounds__(kRouterThreads) router_route_kernel(const __grid_constant__ RouterArgs a) {
  static_assert(kType == GgmlType::kBF16 || kType == GgmlType::kF16);
  extern __shared__ float smem[];  // CTA 0's: logits, scores, biased scores [E] each, taken [E] bytes
  __shared__ float part[kRouterThreads / 32];
  const int rank = blockIdx.x;
  const int64_t n8 = a.cols / 8;
  uint4 w[kRows][kRouterIters];
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    const int64_t row = rank + static_cast<int64_t>(j) * kRouterCtas;
    const uint4* wr = reinterpret_cast<const uint4*>(a.w + row * a.row_bytes);
#pragma unroll
    for (int m = 0; m < kRouterIters; ++m) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(m) * kRouterThreads;
      w[j][m] = row < a.E && i < n8 ? wr[i] : make_uint4(0, 0, 0, 0);
    }
  }
  cuda::await_inputs();
  const auto lo = [](uint32_t v) {
    if constexpr (kType == GgmlType::kBF16) return __uint_as_float(v << 16);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xffffu)));
  };
  const auto hi = [](uint32_t v) {
    if constexpr (kType == GgmlType::kBF16) return __uint_as_float(v & 0xffff0000u);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16)));
  };
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  float acc[kRows];
#pragma unroll
  for (int j = 0; j < kRows; ++j) acc[j] = 0.0f;
#pragma unroll
  for (int m = 0; m < kRouterIters; ++m) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(m) * kRouterThreads;
    if (i >= n8) break;
    const float4 p = x4[2 * i], q = x4[2 * i + 1];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const uint4 v = w[j][m];
      acc[j] = fmaf(lo(v.x), p.x, acc[j]);
      acc[j] = fmaf(hi(v.x), p.y, acc[j]);
      acc[j] = fmaf(lo(v.y), p.z, acc[j]);
      acc[j] = fmaf(hi(v.y), p.w, acc[j]);
      acc[j] = fmaf(lo(v.z), q.x, acc[j]);
      acc[j] = fmaf(hi(v.z), q.y, acc[j]);
      acc[j] = fmaf(lo(v.w), q.z, acc[j]);
      acc[j] = fmaf(hi(v.w), q.w, acc[j]);
    }
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  float* logits0 = cluster.map_shared_rank(smem, 0);
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    const int64_t row = rank + static_cast<int64_t>(j) * kRouterCtas;
    const float sum = cuda::block_sum<kRouterThreads>(acc[j], part);
    if (threadIdx.x == 0 && row < a.E) logits0[row] = sum;
  }
  cluster.sync();
  if (rank == 0 && threadIdx.x < 32) {
    route_token(smem, a.bias, a.E, a.k, a.norm_topk, a.route_scale, smem + a.E, smem + 2 * a.E,
                reinterpret_cast<uint8_t*>(smem + 3 * a.E), a.experts, a.weights);
  }
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

__global__ void combine_routed_kernel(const float* __restrict__ y, const int32_t* __restrict__ experts,
                                      const float* __restrict__ shared, int64_t S, int64_t K, int64_t D,
                                      float* __restrict__ out) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * D) return;
  const int64_t t = i / D, d = i % D;
  const int32_t* e = experts + t * K;
  float acc = 0.0f;
  int32_t prev = -1;
  for (int64_t n = 0; n < K; ++n) {  // the next larger expert id each time (ids of a token are distinct)
    int64_t best = -1;
    for (int64_t k = 0; k < K; ++k) {
      if (e[k] > prev && (best < 0 || e[k] < e[best])) best = k;
    }
    acc = __fadd_rn(acc, y[(t * K + best) * D + d]);
    prev = e[best];
  }
  out[i] = cuda::round_bf16(__fadd_rn(acc, shared[i]));
}

// combine_routed_kernel for K <= kMaxK: every row's value loaded at once (they do not depend on
// the order), then summed in ascending expert id through each row's rank (constant register
// indices only), the same additions in the same order.
constexpr int kCombineMaxK = 8;

__global__ void combine_routed_loaded_kernel(const float* __restrict__ y, const int32_t* __restrict__ experts,
                                             const float* __restrict__ shared, int64_t S, int64_t K, int64_t D,
                                             float* __restrict__ out) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= S * D) return;
  const int64_t t = i / D, d = i % D;
  int32_t id[kCombineMaxK];
  float v[kCombineMaxK];
  const float sh = shared[i];
#pragma unroll
  for (int k = 0; k < kCombineMaxK; ++k) {
    id[k] = k < K ? experts[t * K + k] : 0;
    v[k] = k < K ? y[(t * K + k) * D + d] : 0.0f;
  }
  int rank[kCombineMaxK];
#pragma unroll
  for (int k = 0; k < kCombineMaxK; ++k) {
    rank[k] = 0;
#pragma unroll
    for (int j = 0; j < kCombineMaxK; ++j) rank[k] += j < K && id[j] < id[k] ? 1 : 0;
  }
  float acc = 0.0f;
#pragma unroll
  for (int r = 0; r < kCombineMaxK; ++r) {
    if (r >= K) break;
    float pick = 0.0f;
#pragma unroll
    for (int k = 0; k < kCombineMaxK; ++k) pick = k < K && rank[k] == r ? v[k] : pick;
    acc = __fadd_rn(acc, pick);
  }
  out[i] = cuda::round_bf16(__fadd_rn(acc, sh));
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
  if (K <= kCombineMaxK && !serial) {
    return cuda::launch(combine_routed_loaded_kernel, flat(ctx, S * D), y, experts, shared, S, K, D, out);
  }
  return cuda::launch(combine_routed_kernel, flat(ctx, S * D), y, experts, shared, S, K, D, out);
}

Status route_cuda(const ExecCtx& ctx, const float* logits, const float* bias, int64_t S, int64_t E, int64_t k,
                  bool norm_topk, float route_scale, int32_t* experts, float* weights) {
  if (S <= 0) return absl::OkStatus();
  if (E <= 0 || E > 8192 || k <= 0 || k > E) {
    return absl::InvalidArgumentError(absl::StrCat("route_cuda: ", k, " of ", E, " experts"));
  }
  const size_t smem = 2 * static_cast<size_t>(E) * sizeof(float) + static_cast<size_t>(E);
  return cuda::launch(route_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(32), smem,
                                         static_cast<cudaStream_t>(ctx.cuda_stream)},
                      logits, bias, E, k, norm_topk, route_scale, experts, weights);
}

bool router_route_applies(const Weight& w, const float* x) {
  static const bool on = cuda::env_int("DSF_FUSED_ROUTE", 1) != 0;  // measurement
  return on && (w.type == GgmlType::kBF16 || w.type == GgmlType::kF16) && w.rows >= 1 &&
         w.rows <= 4 * kRouterCtas && w.cols % 8 == 0 && w.cols <= 8 * kRouterThreads * kRouterIters &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

Status router_route_cuda(const ExecCtx& ctx, const Weight& w, const float* x, const float* bias, int64_t k,
                         bool norm_topk, float route_scale, int32_t* experts, float* weights) {
  if (!router_route_applies(w, x) || k <= 0 || k > w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("router_route_cuda: ", k, " of ", w.rows, " experts of ", w.cols,
                                                   " columns (", quant::traits(w.type).name,
                                                   ") is not a shape the fused router takes"));
  }
  const RouterArgs a{w.data, static_cast<int64_t>(w.row_bytes), w.cols, w.rows, k, x, bias, norm_topk, route_scale,
                     experts, weights};
  const size_t smem = 3 * static_cast<size_t>(w.rows) * sizeof(float) + static_cast<size_t>(w.rows);
  const cuda::LaunchParams lp{dim3(kRouterCtas), dim3(kRouterThreads), smem, static_cast<cudaStream_t>(ctx.cuda_stream),
                              kRouterCtas};
  const bool two = w.rows <= 2 * kRouterCtas;
  if (w.type == GgmlType::kBF16) {
    return two ? cuda::launch(router_route_kernel<GgmlType::kBF16, 2>, lp, a)
               : cuda::launch(router_route_kernel<GgmlType::kBF16, 4>, lp, a);
  }
  return two ? cuda::launch(router_route_kernel<GgmlType::kF16, 2>, lp, a)
             : cuda::launch(router_route_kernel<GgmlType::kF16, 4>, lp, a);
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
