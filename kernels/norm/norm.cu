// RMSNorm kernel (see norm_cuda.h).
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/norm/norm_cuda.h"

namespace dsflash::kernels {
namespace {

// Threads per row: 1024 for wide rows (a decode step's rows are alone on the GPU), else 256.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, int64_t n, float eps,
                                float* __restrict__ y) {
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) ss = fmaf(xr[i], xr[i], ss);
  __shared__ float part[kThreads / 32];
  ss = cuda::block_sum<kThreads>(ss, part);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    yr[i] = __bfloat162float(__float2bfloat16_rn(w[i] * (xr[i] * inv)));
  }
}

}  // namespace

Status rms_norm_cuda(const ExecCtx& ctx, const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  if (n_rows <= 0 || n <= 0) return absl::OkStatus();
  if (n_rows > 0x7fffffff) return absl::InvalidArgumentError(absl::StrCat("rms_norm_cuda: ", n_rows, " rows"));
  const cudaStream_t st = static_cast<cudaStream_t>(ctx.cuda_stream);
  const dim3 grid(static_cast<unsigned>(n_rows));
  if (n >= 2048) return cuda::launch(rms_norm_kernel<1024>, cuda::LaunchParams{grid, dim3(1024), 0, st}, x, w, n, eps, y);
  return cuda::launch(rms_norm_kernel<256>, cuda::LaunchParams{grid, dim3(256), 0, st}, x, w, n, eps, y);
}

}  // namespace dsflash::kernels
