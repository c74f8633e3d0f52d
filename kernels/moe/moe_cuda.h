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

// out[t][d] = bf16(sum_k y[rows[t][k]][d] + shared[t][d]), the K routed outputs of token t
// summed in the order listed (ascending expert index, as the CPU) from 0.0f.
Status combine_cuda(const ExecCtx& ctx, const float* y, const int32_t* rows, const float* shared, int64_t S, int64_t K,
                    int64_t D, float* out);

// As combine_cuda with y in route order (row t K + k holds expert experts[t][k]'s output):
// each token's rows are summed in ascending expert index (the CPU's order) without a host pass.
Status combine_routed_cuda(const ExecCtx& ctx, const float* y, const int32_t* experts, const float* shared, int64_t S,
                           int64_t K, int64_t D, float* out);

}  // namespace dsflash::kernels::moe
