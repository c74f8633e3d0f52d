// Device discovery when the build has no CUDA backend.
#include "kernels/exec.h"

namespace dsflash::kernels {

bool cuda_available() { return false; }

}  // namespace dsflash::kernels
