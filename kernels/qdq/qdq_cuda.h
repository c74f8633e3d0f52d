// The simulated-quantisation points on the CUDA backend (host-only header), bit-exact with
// kernels::qdq: in place on device arrays of n values (whole blocks), on ctx.cuda_stream.
// FailedPrecondition in a build without CUDA; InvalidArgument when n is not whole blocks.
#pragma once

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::qdq {

Status fp8_e8m0_32_cuda(const ExecCtx& ctx, float* v, int64_t n);
Status fp4_e4m3_16_cuda(const ExecCtx& ctx, float* v, int64_t n);
Status fp4_e8m0_32_cuda(const ExecCtx& ctx, float* v, int64_t n);

}  // namespace dsflash::kernels::qdq
