// RMSNorm on the CUDA backend (host-only header): as kernels::rms_norm (fp32 sum of squares,
// rsqrt, bf16(w * n)), one block per row, the sum reduced in a tree (so it differs from the
// CPU's sequential sum by rounding only: outputs agree to one bf16 ulp).
#pragma once

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels {

// x, w, y are device pointers ([n_rows][n], [n], [n_rows][n]); in place allowed; runs on
// ctx.cuda_stream. FailedPrecondition in a build without CUDA.
Status rms_norm_cuda(const ExecCtx& ctx, const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);

}  // namespace dsflash::kernels
