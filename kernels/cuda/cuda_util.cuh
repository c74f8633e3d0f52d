// CUDA helpers shared by kernels: error mapping to Status and the single launch helper.
#pragma once

#include <cuda_runtime.h>

#include "common/status.h"

#define CUDA_RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                          \
    const cudaError_t dsf_cuda_err_ = (expr);                                                   \
    if (dsf_cuda_err_ != cudaSuccess) {                                                         \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorName(dsf_cuda_err_), " (", \
                                              cudaGetErrorString(dsf_cuda_err_), ")"));         \
    }                                                                                           \
  } while (0)

namespace dsflash::kernels::cuda {

struct LaunchParams {
  dim3 grid;
  dim3 block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
};

// Launches `kernel` and returns the launch error as a Status.
template <typename... KArgs, typename... Args>
Status launch(void (*kernel)(KArgs...), const LaunchParams& p, Args&&... args) {
  if (p.grid.x == 0) return absl::OkStatus();
  kernel<<<p.grid, p.block, p.smem, p.stream>>>(std::forward<Args>(args)...);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace dsflash::kernels::cuda
