// Hyper-connection kernels (see hc_cuda.h).
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/engram/gate.cuh"
#include "kernels/hc/hc.h"
#include "kernels/hc/hc_cuda.h"
#include "kernels/hc/split_math.h"
#include "kernels/norm/norm_row.cuh"

namespace dsflash::kernels::hc {
namespace {

constexpr int kThreads = 256;

// grid (M, S, P): a partial of one mix of one token over part p of the C*D values (enough
// blocks to stream fn at full bandwidth); the sum of squares comes with mix 0's partials.
__global__ void mixes_partial_kernel(const float* __restrict__ h, const float* __restrict__ fn, int64_t n, int M,
                                     int64_t chunk, float* __restrict__ part_dot, float* __restrict__ part_ss) {
  cuda::await_inputs();
  __shared__ float part[kThreads / 32];
  const int P = gridDim.z;
  const float* ht = h + blockIdx.y * n;
  const float* row = fn + blockIdx.x * n;
  const int64_t lo = blockIdx.z * chunk, hi = min(n, lo + chunk);
  float ss = 0.0f, acc = 0.0f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    ss = fmaf(ht[i], ht[i], ss);
    acc = fmaf(ht[i], row[i], acc);
  }
  acc = cuda::block_sum<kThreads>(acc, part);
  if (blockIdx.x == 0) ss = cuda::block_sum<kThreads>(ss, part);
  if (threadIdx.x != 0) return;
  part_dot[(blockIdx.y * M + blockIdx.x) * P + blockIdx.z] = acc;
  if (blockIdx.x == 0) part_ss[blockIdx.y * P + blockIdx.z] = ss;
}

// Mix i = t M + k of token t: (sum of its partials, in order) * rsqrt(mean square + eps).
__device__ __forceinline__ float finish_mix(const float* __restrict__ part_dot, const float* __restrict__ part_ss,
                                            int64_t n, int P, int64_t t, int64_t i, float eps) {
  float ss = 0.0f, acc = 0.0f;
  for (int p = 0; p < P; ++p) {
    ss += part_ss[t * P + p];
    acc += part_dot[i * P + p];
  }
  return acc * (1.0f / sqrtf(ss / static_cast<float>(n) + eps));
}

// m[t][k], one thread per mix.
__global__ void mixes_finish_kernel(const float* __restrict__ part_dot, const float* __restrict__ part_ss, int64_t n,
                                    int M, int P, int64_t S, float eps, float* __restrict__ m) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [S][M]
  if (i >= S * M) return;
  m[i] = finish_mix(part_dot, part_ss, n, P, i / M, i, eps);
}

__global__ void split_kernel(const float* __restrict__ m, const float* __restrict__ scale, const float* __restrict__ base,
                             int C, int64_t S, int iters, float eps, float* __restrict__ pre, float* __restrict__ post,
                             float* __restrict__ comb) {
  cuda::await_inputs();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= S) return;
  const int M = (2 + C) * C;
  detail::split_token(m + t * M, scale, base, C, iters, eps, pre + t * C, post + t * C, comb + t * C * C);
}

// The same split with one warp per token, lane i * C + j holding comb[i][j] (C * C <= 32):
// the row and column sums of the Sinkhorn passes are gathered by shuffles and added in the
// order split_token adds them, so each pass costs C shuffles, C adds and one division per
// lane instead of C * C of each on one thread.
__device__ __forceinline__ void split_warp(const float* mt, const float* __restrict__ scale,
                                           const float* __restrict__ base, int C, int64_t t, int iters, float eps,
                                           float* __restrict__ pre, float* __restrict__ post,
                                           float* __restrict__ comb) {
  const int lane = threadIdx.x & 31;
  if (lane < C) {
    pre[t * C + lane] = 1.0f / (1.0f + expf(-(mt[lane] * scale[0] + base[lane]))) + eps;
    post[t * C + lane] = 2.0f * (1.0f / (1.0f + expf(-(mt[C + lane] * scale[1] + base[C + lane]))));
  }
  const bool live = lane < C * C;
  const int i = lane / C, j = lane % C;
  float v = live ? mt[2 * C + lane] * scale[2] + base[2 * C + lane] : -INFINITY;
  float mx = -INFINITY;
  for (int b = 0; b < C; ++b) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v, i * C + b));
  v = live ? expf(v - mx) : 0.0f;
  float sum = 0.0f;
  for (int b = 0; b < C; ++b) sum += __shfl_sync(0xffffffffu, v, i * C + b);
  v = v / sum + eps;
  const int passes = iters > 1 ? 2 * iters - 1 : 1;
  for (int it = 0; it < passes; ++it) {
    const bool columns = it % 2 == 0;
    sum = 0.0f;
    for (int b = 0; b < C; ++b) sum += __shfl_sync(0xffffffffu, v, columns ? b * C + j : i * C + b);
    v = v / (sum + eps);
  }
  if (live) comb[t * C * C + lane] = v;
}

__global__ void split_warp_kernel(const float* __restrict__ m, const float* __restrict__ scale,
                                  const float* __restrict__ base, int C, int64_t S, int iters, float eps,
                                  float* __restrict__ pre, float* __restrict__ post, float* __restrict__ comb) {
  cuda::await_inputs();
  const int64_t t = blockIdx.x;
  split_warp(m + t * (2 + C) * C, scale, base, C, t, iters, eps, pre, post, comb);
}

// The partial sums of the mixes (with_mix_partials) and what the split needs besides.
struct SplitArgs {
  const float* part_dot;
  const float* part_ss;
  int64_t n;
  int P;
  float norm_eps;
  const float* scale;
  const float* base;
  int C, iters;
  float eps;
  float* pre;
  float* post;
  float* comb;
};

// mixes_finish_kernel and split_warp_kernel for token t on the first warp (M <= 32): lane k
// finishes mix k, the warp splits them. Not inlined: inside the 256-thread split_pre_norm_kernel
// it made ptxas spill 8 bytes.
__device__ __noinline__ void finish_split_token(const SplitArgs& a, int64_t t) {
  __shared__ float mt[32];
  const int lane = threadIdx.x, M = (2 + a.C) * a.C;
  if (lane < M) mt[lane] = finish_mix(a.part_dot, a.part_ss, a.n, a.P, t, t * M + lane, a.norm_eps);
  __syncwarp();
  split_warp(mt, a.scale, a.base, a.C, t, a.iters, a.eps, a.pre, a.post, a.comb);
}

__global__ void finish_split_kernel(const __grid_constant__ SplitArgs a) {
  cuda::await_inputs();
  finish_split_token(a, blockIdx.x);
}

// xs[k] = bf16(value(d)) for this thread's values d = vt + k kThreads of a row of D (bf16(0)
// beyond it), vt the thread's index among the row's kThreads, every value's loads in one round.
template <int kThreads, typename F>
__device__ __forceinline__ void row_regs(int64_t D, float (&xs)[cuda::kRowRegs], const F& value,
                                         int vt = threadIdx.x) {
#pragma unroll
  for (int k = 0; k < cuda::kRowRegs; ++k) {
    const int64_t d = vt + static_cast<int64_t>(k) * kThreads;
    xs[k] = __bfloat162float(__float2bfloat16_rn(d < D ? value(d) : 0.0f));
  }
}

// pre_kernel then the RMSNorm (norm_row.cuh, as norm.cu's kernel) of token t on one block:
// y = bf16(norm_w * (x * rsqrt(mean(x^2) + eps))), x = bf16(sum_c w[c] h[c]).
template <int kThreads>
__device__ __forceinline__ void pre_norm_token(const float* __restrict__ h, const float* __restrict__ w, int C,
                                               int64_t D, const float* __restrict__ norm_w, float eps,
                                               float* __restrict__ y, int64_t t) {
  float* yt = y + t * D;
  if (D <= kThreads * cuda::kRowRegs) {  // the row in registers: every load in one round
    float xs[cuda::kRowRegs];
    row_regs<kThreads>(D, xs, [&](int64_t d) {
      float acc = 0.0f;
#pragma unroll 4
      for (int c = 0; c < C; ++c) acc = __fadd_rn(acc, __fmul_rn(w[t * C + c], h[(t * C + c) * D + d]));
      return acc;
    });
    cuda::rms_scale_regs<kThreads>(xs, norm_w, D, eps, yt);
    return;
  }
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    float acc = 0.0f;
    for (int c = 0; c < C; ++c) acc = __fadd_rn(acc, __fmul_rn(w[t * C + c], h[(t * C + c) * D + d]));
    const float x = __bfloat162float(__float2bfloat16_rn(acc));
    yt[d] = x;
    ss = fmaf(x, x, ss);
  }
  cuda::rms_scale_row<kThreads>(yt, norm_w, D, ss, eps, yt);
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads) pre_norm_kernel(const float* __restrict__ h, const float* __restrict__ w,
                                                            int C, int64_t D, const float* __restrict__ norm_w,
                                                            float eps, float* __restrict__ y) {
  cuda::await_inputs();
  pre_norm_token<kThreads>(h, w, C, D, norm_w, eps, y, blockIdx.x);
}

// A sub-layer's entry in one launch: blocks (t, 0) the hc pre + RMSNorm of token t (with the
// previous sub-layer's pre), blocks (t, 1) the split of token t's mixes on one warp; the two
// are independent, so the split's serial Sinkhorn passes run beside the norm.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) split_pre_norm_kernel(const __grid_constant__ SplitArgs a,
                                                                  const float* __restrict__ h,
                                                                  const float* __restrict__ w, int64_t D,
                                                                  const float* __restrict__ norm_w,
                                                                  float* __restrict__ y) {
  cuda::await_inputs();
  if (blockIdx.y == 0) {
    pre_norm_token<kThreads>(h, w, a.C, D, norm_w, a.norm_eps, y, blockIdx.x);
  } else if (threadIdx.x < 32) {
    finish_split_token(a, blockIdx.x);
  }
}

__global__ void pre_kernel(const float* __restrict__ h, const float* __restrict__ w, int C, int64_t D, int64_t S,
                           float* __restrict__ y) {
  cuda::await_inputs();
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= S * D) return;
  const int64_t t = k / D, d = k % D;
  float acc = 0.0f;
  for (int c = 0; c < C; ++c) acc = __fadd_rn(acc, __fmul_rn(w[t * C + c], h[(t * C + c) * D + d]));
  y[k] = __bfloat162float(__float2bfloat16_rn(acc));
}

// Stream j of a value after hc post: r[i] the residual streams' values, xv the sub-layer
// output's, post_t and comb_t the token's coefficients.
template <int kMaxC = Split::kMaxC>
__device__ __forceinline__ float post_value(const float* r, float xv, const float* __restrict__ post_t,
                                            const float* __restrict__ comb_t, int C, int j) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxC; ++i) {  // r indexed by constants: registers
    if (i < C) acc = __fadd_rn(acc, __fmul_rn(comb_t[i * C + j], r[i]));
  }
  return __bfloat162float(__float2bfloat16_rn(__fadd_rn(__fmul_rn(post_t[j], xv), acc)));
}

__global__ void post_kernel(const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ post,
                            const float* __restrict__ comb, int C, int64_t D, int64_t S, float* __restrict__ y) {
  cuda::await_inputs();
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // over [S][C][D]
  if (k >= S * C * D) return;
  const int64_t t = k / (C * D), j = (k / D) % C, d = k % D;
  float r[Split::kMaxC];
#pragma unroll
  for (int i = 0; i < Split::kMaxC; ++i) r[i] = i < C ? res[(t * C + i) * D + d] : 0.0f;
  y[k] = post_value(r, x[t * D + d], post + t * C, comb + t * C * C, C, static_cast<int>(j));
}

// Value d of token t after hc post (its C streams written to h) and hc pre: sum_j pre_t[j] h[j][d].
template <int kMaxC>
__device__ __forceinline__ float post_pre_value(const float* __restrict__ x, const float* __restrict__ res,
                                                const float* __restrict__ post_t, const float* __restrict__ comb_t,
                                                const float* __restrict__ pre_t, int C, int64_t D, int64_t t,
                                                int64_t d, float* h) {
  float r[kMaxC];
#pragma unroll
  for (int i = 0; i < kMaxC; ++i) r[i] = i < C ? res[(t * C + i) * D + d] : 0.0f;
  const float xv = x[t * D + d];
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxC; ++j) {
    if (j >= C) break;
    const float hv = post_value<kMaxC>(r, xv, post_t, comb_t, C, j);
    h[(t * C + j) * D + d] = hv;
    acc = __fadd_rn(acc, __fmul_rn(pre_t[j], hv));
  }
  return acc;
}

// post_kernel's rows of token t, then pre_norm_token's. Rows of up to kThreads * kRowRegs
// values: each thread's values and their C streams in registers, every load in one round and
// the norm's input made from the registers (the same values pre_norm_token reads back); wider
// ones: the rows written, then pre_norm_token on them (visible to the block after the barrier).
// kMaxC: C's bound (4 for the released model: fewer registers).
template <int kThreads, int kMaxC>
__global__ void __launch_bounds__(kThreads) post_pre_norm_kernel(const float* __restrict__ x,
                                                                 const float* __restrict__ res,
                                                                 const float* __restrict__ post,
                                                                 const float* __restrict__ comb, int C, int64_t D,
                                                                 const float* __restrict__ pre,
                                                                 const float* __restrict__ norm_w, float eps, float* h,
                                                                 float* __restrict__ y) {
  cuda::await_inputs();
  const int64_t t = blockIdx.x;
  const float *post_t = post + t * C, *comb_t = comb + t * C * C, *pre_t = pre + t * C;
  if (D <= kThreads * cuda::kRowRegs) {
    float xs[cuda::kRowRegs];
    row_regs<kThreads>(D, xs,
                       [&](int64_t d) { return post_pre_value<kMaxC>(x, res, post_t, comb_t, pre_t, C, D, t, d, h); });
    cuda::rms_scale_regs<kThreads>(xs, norm_w, D, eps, y + t * D);
    return;
  }
  for (int64_t k = threadIdx.x; k < C * D; k += kThreads) {
    const int64_t d = k % D;
    float r[kMaxC];
#pragma unroll
    for (int i = 0; i < kMaxC; ++i) r[i] = i < C ? res[(t * C + i) * D + d] : 0.0f;
    h[t * C * D + k] = post_value<kMaxC>(r, x[t * D + d], post_t, comb_t, C, static_cast<int>(k / D));
  }
  __syncthreads();
  pre_norm_token<kThreads>(h, pre, C, D, norm_w, eps, y, t);
}

// A token's hc coefficients for exactly kC streams, read once into registers (post_pre_value
// reads them again for every value).
template <int kC>
struct PostPreCoef {
  float post[kC], comb[kC * kC], pre[kC];
  __device__ __forceinline__ PostPreCoef(const float* __restrict__ post_t, const float* __restrict__ comb_t,
                                         const float* __restrict__ pre_t) {
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      post[j] = post_t[j];
      pre[j] = pre_t[j];
    }
#pragma unroll
    for (int k = 0; k < kC * kC; ++k) comb[k] = comb_t[k];
  }

  // post_pre_value for C = kC: the same operations in the same order.
  __device__ __forceinline__ float value(const float* __restrict__ x, const float* __restrict__ res, int64_t D,
                                         int64_t t, int64_t d, float* h) const {
    float r[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) r[i] = res[(t * kC + i) * D + d];
    const float xv = x[t * D + d];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < kC; ++i) a = __fadd_rn(a, __fmul_rn(comb[i * kC + j], r[i]));
      const float hv = __bfloat162float(__float2bfloat16_rn(__fadd_rn(__fmul_rn(post[j], xv), a)));
      h[(t * kC + j) * D + d] = hv;
      acc = __fadd_rn(acc, __fmul_rn(pre[j], hv));
    }
    return acc;
  }
};

// post_pre_norm_kernel's register form for rows of up to kThreads * kRowRegs values, its
// kThreads threads spread over a cluster of kCtas CTAs (one per SM: each SM moves 1/kCtas of
// the streams) that play the one block's threads: the same values and the same reduction tree
// (cuda::cluster_sum), so bit for bit the one-block kernel. Grid: kCtas CTAs a token.
// kExact: C is kMaxC (the released model's 4), the coefficients in registers: ~40 % less code,
// which every CTA fetches cold once a layer.
template <int kThreads, int kCtas, int kMaxC, bool kExact>
__global__ void __launch_bounds__(kThreads / kCtas) post_pre_norm_cluster_kernel(
    const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ post,
    const float* __restrict__ comb, int C, int64_t D, const float* __restrict__ pre, const float* __restrict__ norm_w,
    float eps, float* h, float* __restrict__ y) {
  cuda::await_inputs();
  const int64_t t = blockIdx.x / kCtas;
  const int vt = static_cast<int>(blockIdx.x % kCtas) * (kThreads / kCtas) + threadIdx.x;
  const float *post_t = post + t * C, *comb_t = comb + t * C * C, *pre_t = pre + t * C;
  float xs[cuda::kRowRegs];
  if constexpr (kExact) {
    const PostPreCoef<kMaxC> k(post_t, comb_t, pre_t);
    row_regs<kThreads>(D, xs, [&](int64_t d) { return k.value(x, res, D, t, d, h); }, vt);
  } else {
    row_regs<kThreads>(
        D, xs, [&](int64_t d) { return post_pre_value<kMaxC>(x, res, post_t, comb_t, pre_t, C, D, t, d, h); }, vt);
  }
  cuda::rms_scale_regs_by<kThreads>(xs, norm_w, D, eps, y + t * D, vt,
                                    [&](float v) { return cuda::cluster_sum<kThreads, kCtas>(v, vt); });
}

// post_pre_norm_cluster_kernel's exit (C = kC) with an Engram layer's gate and update between
// the post and the pre: each thread's values of the kC streams after the post stay in
// registers, their three row sums a stream (h h, key key, (h w) key) reduce over the cluster
// in one pass, and the updated streams bf16(h + g value) are written and mixed by the pre.
// The same operations as post_cuda, engram::gate_update_cuda and pre_norm_cuda in turn, the
// gate's sums in another tree (fp32 rounding apart).
template <int kThreads, int kCtas, int kC>
__global__ void __launch_bounds__(kThreads / kCtas) post_gate_pre_norm_cluster_kernel(
    const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ post,
    const float* __restrict__ comb, int64_t D, const float* __restrict__ kv, const float* __restrict__ qk,
    const float* __restrict__ pre, const float* __restrict__ norm_w, float eps, float* h, float* __restrict__ y) {
  cuda::await_inputs();
  const int64_t t = blockIdx.x / kCtas;
  const int vt = static_cast<int>(blockIdx.x % kCtas) * (kThreads / kCtas) + threadIdx.x;
  const PostPreCoef<kC> k(post + t * kC, comb + t * kC * kC, pre + t * kC);
  const float* key = kv + t * (kC + 1) * D;  // stream j's key at j D, the value at kC D
  float hv[kC][cuda::kRowRegs], sums[3 * kC];
#pragma unroll
  for (int i = 0; i < 3 * kC; ++i) sums[i] = 0.0f;
#pragma unroll
  for (int r = 0; r < cuda::kRowRegs; ++r) {
    const int64_t d = vt + static_cast<int64_t>(r) * kThreads;
    float rv[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) rv[i] = d < D ? res[(t * kC + i) * D + d] : 0.0f;
    const float xv = d < D ? x[t * D + d] : 0.0f;
#pragma unroll
    for (int j = 0; j < kC; ++j) {  // PostPreCoef::value's post
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < kC; ++i) a = __fadd_rn(a, __fmul_rn(k.comb[i * kC + j], rv[i]));
      hv[j][r] = cuda::round_bf16(__fadd_rn(__fmul_rn(k.post[j], xv), a));
      if (d < D) {
        const float kd = key[j * D + d];
        sums[3 * j] = fmaf(hv[j][r], hv[j][r], sums[3 * j]);
        sums[3 * j + 1] = fmaf(kd, kd, sums[3 * j + 1]);
        sums[3 * j + 2] = fmaf(__fmul_rn(hv[j][r], qk[j * D + d]), kd, sums[3 * j + 2]);
      }
    }
  }
  cuda::cluster_sums<kThreads, kCtas, 3 * kC>(sums, vt);
  float g[kC];
#pragma unroll
  for (int j = 0; j < kC; ++j) g[j] = engram::gate_of(sums[3 * j], sums[3 * j + 1], sums[3 * j + 2], D, eps);
  float xs[cuda::kRowRegs];
#pragma unroll
  for (int r = 0; r < cuda::kRowRegs; ++r) {
    const int64_t d = vt + static_cast<int64_t>(r) * kThreads;
    float acc = 0.0f;
    if (d < D) {
      const float value = key[kC * D + d];
#pragma unroll
      for (int j = 0; j < kC; ++j) {
        const float u = cuda::round_bf16(__fadd_rn(hv[j][r], __fmul_rn(g[j], value)));
        h[(t * kC + j) * D + d] = u;
        acc = __fadd_rn(acc, __fmul_rn(k.pre[j], u));
      }
    }
    xs[r] = cuda::round_bf16(acc);
  }
  cuda::rms_scale_regs_by<kThreads>(xs, norm_w, D, eps, y + t * D, vt,
                                    [&](float v) { return cuda::cluster_sum<kThreads, kCtas>(v, vt); });
}

cuda::LaunchParams flat(const ExecCtx& ctx, int64_t n) {
  return cuda::LaunchParams{dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0,
                            cuda::stream_of(ctx)};
}

// The mixes' partial sums of S tokens (P partials per mix over the C*D values, sums of squares
// with them) in stream-ordered scratch, then finish(part_dot, part_ss, n, P) on the same
// stream; the scratch is released after it.
template <typename Finish>
Status with_mix_partials(const ExecCtx& ctx, const float* h, const float* fn, int C, int64_t D, int64_t S,
                         const Finish& finish) {
  const int M = (2 + C) * C;
  const int64_t n = static_cast<int64_t>(C) * D;
  const int P = static_cast<int>(std::min<int64_t>(32, (n + 2047) / 2048));
  const int64_t chunk = (n + P - 1) / P;
  cudaStream_t st = cuda::stream_of(ctx);
  float* part = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&part, static_cast<size_t>(S) * (M + 1) * P * sizeof(float), st));
  float* part_ss = part + S * M * P;
  const Status s = [&]() -> Status {
    RETURN_IF_ERROR(cuda::launch(
        mixes_partial_kernel,
        cuda::LaunchParams{dim3(static_cast<unsigned>(M), static_cast<unsigned>(S), static_cast<unsigned>(P)),
                           dim3(kThreads), 0, st},
        h, fn, n, M, chunk, part, part_ss));
    return finish(part, part_ss, n, P);
  }();
  cudaFreeAsync(part, st);
  return s;
}

}  // namespace

Status mixes_cuda(const ExecCtx& ctx, const float* h, const float* fn, int C, int64_t D, int64_t S, float norm_eps,
                  float* m) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  const int M = (2 + C) * C;
  return with_mix_partials(ctx, h, fn, C, D, S, [&](const float* part, const float* part_ss, int64_t n, int P) {
    return cuda::launch(mixes_finish_kernel, flat(ctx, S * M), part, part_ss, n, M, P, S, norm_eps, m);
  });
}

Status mixes_split_cuda(const ExecCtx& ctx, const float* h, const float* fn, const float* scale, const float* base,
                        int C, int64_t D, int64_t S, float norm_eps, int iters, float hc_eps, float* pre, float* post,
                        float* comb) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  const int M = (2 + C) * C;
  cudaStream_t st = cuda::stream_of(ctx);
  if (M > 32) {  // no warp per token: the two ops
    float* m = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMallocAsync(&m, static_cast<size_t>(S) * M * sizeof(float), st));
    const Status s = [&]() -> Status {
      RETURN_IF_ERROR(mixes_cuda(ctx, h, fn, C, D, S, norm_eps, m));
      return split_cuda(ctx, m, scale, base, C, S, iters, hc_eps, pre, post, comb);
    }();
    cudaFreeAsync(m, st);
    return s;
  }
  return with_mix_partials(ctx, h, fn, C, D, S, [&](const float* part, const float* part_ss, int64_t n, int P) {
    const SplitArgs a{part, part_ss, n, P, norm_eps, scale, base, C, iters, hc_eps, pre, post, comb};
    return cuda::launch(finish_split_kernel, cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(32), 0, st}, a);
  });
}

Status sublayer_in_cuda(const ExecCtx& ctx, const float* h, const float* fn, const float* scale, const float* base,
                        int C, int64_t D, int64_t S, float norm_eps, int iters, float hc_eps, const float* in_pre,
                        const float* norm_w, float* pre, float* post, float* comb, float* y) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  if ((2 + C) * C > 32) {  // no warp per token: the ops one by one
    RETURN_IF_ERROR(mixes_split_cuda(ctx, h, fn, scale, base, C, D, S, norm_eps, iters, hc_eps, pre, post, comb));
    return pre_norm_cuda(ctx, h, in_pre, C, D, S, norm_w, norm_eps, y);
  }
  const cudaStream_t st = cuda::stream_of(ctx);
  return with_mix_partials(ctx, h, fn, C, D, S, [&](const float* part, const float* part_ss, int64_t n, int P) {
    const SplitArgs a{part, part_ss, n, P, norm_eps, scale, base, C, iters, hc_eps, pre, post, comb};
    return cuda::with_norm_threads(D, [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      return cuda::launch(split_pre_norm_kernel<kThreads>,
                          cuda::LaunchParams{dim3(static_cast<unsigned>(S), 2), dim3(kThreads), 0, st}, a, h, in_pre,
                          D, norm_w, y);
    });
  });
}

Status pre_norm_cuda(const ExecCtx& ctx, const float* h, const float* w, int C, int64_t D, int64_t S,
                     const float* norm_w, float norm_eps, float* y) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  const cudaStream_t st = cuda::stream_of(ctx);
  return cuda::with_norm_threads(D, [&](auto threads) {
    constexpr int kThreads = decltype(threads)::value;
    return cuda::launch(pre_norm_kernel<kThreads>,
                        cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(kThreads), 0, st}, h, w, C, D, norm_w,
                        norm_eps, y);
  });
}

Status split_cuda(const ExecCtx& ctx, const float* m, const float* scale, const float* base, int C, int64_t S, int iters,
                  float hc_eps, float* pre, float* post, float* comb) {
  if (C <= 0 || S <= 0) return absl::OkStatus();
  if (C * C <= 32) {
    return cuda::launch(split_warp_kernel,
                        cuda::LaunchParams{dim3(static_cast<unsigned>(S)), dim3(32), 0,
                                           cuda::stream_of(ctx)},
                        m, scale, base, C, S, iters, hc_eps, pre, post, comb);
  }
  return cuda::launch(split_kernel, flat(ctx, S), m, scale, base, C, S, iters, hc_eps, pre, post, comb);
}

Status pre_cuda(const ExecCtx& ctx, const float* h, const float* w, int C, int64_t D, int64_t S, float* y) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  return cuda::launch(pre_kernel, flat(ctx, S * D), h, w, C, D, S, y);
}

Status post_cuda(const ExecCtx& ctx, const float* x, const float* res, const float* post, const float* comb, int C,
                 int64_t D, int64_t S, float* y) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  if (C > Split::kMaxC) return absl::InvalidArgumentError(absl::StrCat("post_cuda: ", C, " streams"));
  return cuda::launch(post_kernel, flat(ctx, S * C * D), x, res, post, comb, C, D, S, y);
}

Status post_pre_norm_cuda(const ExecCtx& ctx, const float* x, const float* res, const float* post, const float* comb,
                          int C, int64_t D, int64_t S, const float* pre, const float* norm_w, float norm_eps, float* h,
                          float* y) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  if (C > Split::kMaxC) return absl::InvalidArgumentError(absl::StrCat("post_pre_norm_cuda: ", C, " streams"));
  const cudaStream_t st = cuda::stream_of(ctx);
  return cuda::with_norm_threads(D, [&](auto threads) {
    constexpr int kThreads = decltype(threads)::value;
    // A cluster of 8 CTAs (4 and 16 measured the same on the H200; DSF_HC_CLUSTER=0: one block).
    static const bool clustered = cuda::env_int("DSF_HC_CLUSTER", 1) != 0;
    if constexpr (kThreads == 1024) {
      if (clustered && C <= 4 && D <= kThreads * cuda::kRowRegs) {  // one SM's load and store rate would bound it
        constexpr int kCtas = 8;
        const cuda::LaunchParams lc{dim3(static_cast<unsigned>(S * kCtas)), dim3(kThreads / kCtas), 0, st, kCtas};
        const auto kernel = C == 4 ? post_pre_norm_cluster_kernel<kThreads, kCtas, 4, true>
                                   : post_pre_norm_cluster_kernel<kThreads, kCtas, 4, false>;
        return cuda::launch(kernel, lc, x, res, post, comb, C, D, pre, norm_w, norm_eps, h, y);
      }
    }
    const cuda::LaunchParams lp{dim3(static_cast<unsigned>(S)), dim3(kThreads), 0, st};
    if (C <= 4) return cuda::launch(post_pre_norm_kernel<kThreads, 4>, lp, x, res, post, comb, C, D, pre, norm_w, norm_eps, h, y);
    return cuda::launch(post_pre_norm_kernel<kThreads, Split::kMaxC>, lp, x, res, post, comb, C, D, pre, norm_w, norm_eps,
                        h, y);
  });
}

Status post_gate_pre_norm_cuda(const ExecCtx& ctx, const float* x, const float* res, const float* post,
                               const float* comb, int C, int64_t D, int64_t S, const float* kv, const float* qk,
                               const float* pre, const float* norm_w, float norm_eps, float* h, float* y) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  constexpr int kThreads = 1024, kCtas = 8;
  if (!post_gate_pre_norm_applies(C, D)) {
    return absl::UnimplementedError(absl::StrCat("post_gate_pre_norm_cuda: ", C, " streams of ", D,
                                                 " (4 streams of up to ", kThreads * cuda::kRowRegs, ")"));
  }
  const cuda::LaunchParams lc{dim3(static_cast<unsigned>(S * kCtas)), dim3(kThreads / kCtas), 0, cuda::stream_of(ctx),
                              kCtas};
  return cuda::launch(post_gate_pre_norm_cluster_kernel<kThreads, kCtas, 4>, lc, x, res, post, comb, D, kv, qk, pre,
                      norm_w, norm_eps, h, y);
}

bool post_gate_pre_norm_applies(int C, int64_t D) {
  static const bool on = cuda::env_int("DSF_ENGRAM_EXIT", 1) != 0;  // 0: the three launches (measurement)
  return on && C == 4 && D > 0 && D <= 1024 * cuda::kRowRegs;
}

}  // namespace dsflash::kernels::hc
