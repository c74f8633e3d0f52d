// Hyper-connection ops on the CUDA backend (host-only header), for S tokens at once, device
// pointers, on ctx.cuda_stream. pre and post are bit-exact with kernels::hc (same summation
// order, no FMA contraction); mixes reduces in a tree (fp32 results agree to rounding).
// The Sinkhorn split stays on the host for now (kernels::hc::split, per token).
#pragma once

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::hc {

// m[S][M] = (fn . h_t) * rsqrt(mean(h_t^2) + eps), h [S][C*D], fn [M = (2 + C) C][C*D].
Status mixes_cuda(const ExecCtx& ctx, const float* h, const float* fn, int C, int64_t D, int64_t S, float norm_eps,
                  float* m);
// y[S][D] = bf16(sum_c w[t][c] h[t][c][:]), w [S][C].
Status pre_cuda(const ExecCtx& ctx, const float* h, const float* w, int C, int64_t D, int64_t S, float* y);
// y[S][C][D] = bf16(post[t][j] x[t] + sum_i comb[t][i][j] res[t][i]), post [S][C], comb [S][C][C].
Status post_cuda(const ExecCtx& ctx, const float* x, const float* res, const float* post, const float* comb, int C,
                 int64_t D, int64_t S, float* y);

}  // namespace dsflash::kernels::hc
