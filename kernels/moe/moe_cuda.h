// MoE ops on the CUDA backend (host-only header): routing and the clamped SwiGLU for S tokens,
// device pointers, on ctx.cuda_stream, in the CPU reference's order of operations (expf and
// log1pf may differ from the host's libm by an ulp; top-k lists then differ only on true ties).
// FailedPrecondition in a build without CUDA.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::moe {

// experts[S][k], weights[S][k] = route() of each row of logits [S][E] with bias [E]. E <= 8192.
Status route_cuda(const ExecCtx& ctx, const float* logits, const float* bias, int64_t S, int64_t E, int64_t k,
                  bool norm_topk, float route_scale, int32_t* experts, float* weights);

// a[t][*] = swiglu(a[t], b[t], F, limit, weight[t]) for t < S, a and b [S][F]; weight null = 1.
Status swiglu_cuda(const ExecCtx& ctx, float* a, const float* b, int64_t S, int64_t F, float limit,
                   const float* weight);

}  // namespace dsflash::kernels::moe
