// Engram ops on the CUDA backend (host-only header), S tokens at once, device pointers, on
// ctx.cuda_stream. FailedPrecondition in a build without CUDA.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::engram {

// gate_update for each token: h [S][C][D] updated in place from kv [S][(C+1)*D] and qk [C][D];
// gate [S][C] (may be null). The three row sums reduce in a tree (fp32 rounding apart from the
// CPU's sequential sums).
Status gate_update_cuda(const ExecCtx& ctx, float* h, const float* kv, const float* qk, int C, int64_t D, int64_t S,
                        float norm_eps, float* gate);

}  // namespace dsflash::kernels::engram
