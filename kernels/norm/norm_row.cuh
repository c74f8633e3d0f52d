// The RMSNorm of one row by one block, shared by norm.cu's kernel and the fused kernels that
// end in a norm (hc.cu: hc pre + norm), so that fused and unfused forms give the same values.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/cuda/reduce.cuh"

namespace dsflash::kernels::cuda {

// Rows at least this wide get 1024 threads (a decode step's rows are alone on the GPU),
// narrower ones 256.
constexpr int64_t kWideNormRow = 2048;

// f(std::integral_constant<int, T>{}) with T, the threads per row for rows of n values.
template <typename F>
auto with_norm_threads(int64_t n, F&& f) {
  return n >= kWideNormRow ? f(std::integral_constant<int, 1024>{}) : f(std::integral_constant<int, 256>{});
}

// y[i] = bf16(w[i] * (x[i] * rsqrt(mean(x^2) + eps))) for i = threadIdx.x, + kThreads, ...,
// given ss, this thread's sum of squares of those x[i] (fmaf, in that order). x may be y.
template <int kThreads>
__device__ __forceinline__ void rms_scale_row(const float* x, const float* __restrict__ w, int64_t n, float ss,
                                              float eps, float* y) {
  __shared__ float part[kThreads / 32];
  ss = block_sum<kThreads>(ss, part);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) y[i] = __bfloat162float(__float2bfloat16_rn(w[i] * (x[i] * inv)));
}

// Values a thread holds in registers for a row of kThreads * kRowRegs or fewer: its values are
// loaded in one round instead of one round a stride.
constexpr int kRowRegs = 8;

// rms_scale_row for a row this thread holds: xs[k] = x[vt + k kThreads] (those < n), vt the
// thread's index among the row's kThreads; their sum of squares is taken here (fmaf, in k order,
// as rms_scale_row's callers do) and summed over the row's threads by sum(ss). With vt =
// threadIdx.x and block_sum, the same values as rms_scale_row.
template <int kThreads, typename Sum>
__device__ __forceinline__ void rms_scale_regs_by(const float (&xs)[kRowRegs], const float* __restrict__ w, int64_t n,
                                                  float eps, float* __restrict__ y, int vt, const Sum& sum) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k) {
    if (vt + static_cast<int64_t>(k) * kThreads < n) ss = fmaf(xs[k], xs[k], ss);
  }
  ss = sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k) {
    const int64_t i = vt + static_cast<int64_t>(k) * kThreads;
    if (i < n) y[i] = __bfloat162float(__float2bfloat16_rn(w[i] * (xs[k] * inv)));
  }
}

template <int kThreads>
__device__ __forceinline__ void rms_scale_regs(const float (&xs)[kRowRegs], const float* __restrict__ w, int64_t n,
                                               float eps, float* __restrict__ y) {
  __shared__ float part[kThreads / 32];
  rms_scale_regs_by<kThreads>(xs, w, n, eps, y, threadIdx.x, [&](float v) { return block_sum<kThreads>(v, part); });
}

// The RMSNorm of row x (n values) into y by the block: the row in registers when it fits
// (rms_scale_regs: every load in one round), else by strides (rms_scale_row). x may be y.
template <int kThreads>
__device__ __forceinline__ void rms_norm_row(const float* x, const float* __restrict__ w, int64_t n, float eps,
                                             float* y) {
  if (n <= kThreads * kRowRegs) {  // a thread writes only what it read, so in place is safe
    float xs[kRowRegs];
#pragma unroll
    for (int k = 0; k < kRowRegs; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      xs[k] = i < n ? x[i] : 0.0f;
    }
    rms_scale_regs<kThreads>(xs, w, n, eps, y);
    return;
  }
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) ss = fmaf(x[i], x[i], ss);
  rms_scale_row<kThreads>(x, w, n, ss, eps, y);
}

}  // namespace dsflash::kernels::cuda
