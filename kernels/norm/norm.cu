// RMSNorm kernel (see norm_cuda.h).
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/norm/norm_cuda.h"
#include "kernels/norm/norm_row.cuh"

namespace dsflash::kernels {
namespace {

template <int kThreads>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* x, const float* __restrict__ w, int64_t n,
                                                            float eps, float* y) {
  cuda::await_inputs();
  cuda::rms_norm_row<kThreads>(x + blockIdx.x * n, w, n, eps, y + blockIdx.x * n);
}

}  // namespace

Status rms_norm_cuda(const ExecCtx& ctx, const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  if (n_rows <= 0 || n <= 0) return absl::OkStatus();
  if (n_rows > 0x7fffffff) return absl::InvalidArgumentError(absl::StrCat("rms_norm_cuda: ", n_rows, " rows"));
  const dim3 grid(static_cast<unsigned>(n_rows));
  const cudaStream_t st = cuda::stream_of(ctx);
  return cuda::with_norm_threads(n, [&](auto threads) {
    constexpr int kThreads = decltype(threads)::value;
    return cuda::launch(rms_norm_kernel<kThreads>, cuda::LaunchParams{grid, dim3(kThreads), 0, st}, x, w, n, eps, y);
  });
}

}  // namespace dsflash::kernels
