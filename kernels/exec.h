// Execution context and backend selection for kernels (host-only: no CUDA types here).
// Every op takes an ExecCtx; CUDA ops run on its stream, never the default stream.
#pragma once

namespace dsflash::kernels {

enum class Backend { kCpu, kCuda };

struct ExecCtx {
  Backend backend = Backend::kCpu;
  void* cuda_stream = nullptr;  // cudaStream_t of the caller (kCuda only)
};

// True when this build has the CUDA backend and a usable device is present.
bool cuda_available();

}  // namespace dsflash::kernels
