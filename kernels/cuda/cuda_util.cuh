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

// A DevScalar's value inside a kernel: read from device memory when it has an address.
__device__ __forceinline__ int64_t scalar_value(int64_t value, const int64_t* dev) {
  return dev != nullptr ? *dev : value;
}

// Kernel timing (exec.h set_kernel_timing; kernel_timing.cu): events around each launch.
bool kernel_timing_on();
cudaEvent_t kernel_timing_start(cudaStream_t stream);
void kernel_timing_stop(const void* kernel, cudaStream_t stream, cudaEvent_t start);

// Launches `kernel` and returns the launch error as a Status.
template <typename... KArgs, typename... Args>
Status launch(void (*kernel)(KArgs...), const LaunchParams& p, Args&&... args) {
  if (p.grid.x == 0) return absl::OkStatus();
  cudaEvent_t start = kernel_timing_on() ? kernel_timing_start(p.stream) : nullptr;
  kernel<<<p.grid, p.block, p.smem, p.stream>>>(std::forward<Args>(args)...);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (start != nullptr) kernel_timing_stop(reinterpret_cast<const void*>(kernel), p.stream, start);
  return absl::OkStatus();
}

}  // namespace dsflash::kernels::cuda
