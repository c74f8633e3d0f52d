// Device discovery for the CUDA backend.
#include <cuda_runtime.h>

#include "kernels/exec.h"

namespace dsflash::kernels {

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace dsflash::kernels
