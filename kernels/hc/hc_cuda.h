// Hyper-connection ops on the CUDA backend (host-only header), for S tokens at once, device
// pointers, on ctx.cuda_stream. pre and post are bit-exact with kernels::hc (same summation
// order, no FMA contraction); mixes reduces in a tree (fp32 results agree to rounding).
// split runs the CPU's order of operations (split_math.h; a warp per token when C * C <= 32).
#pragma once

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::hc {

// m[S][M] = (fn . h_t) * rsqrt(mean(h_t^2) + eps), h [S][C*D], fn [M = (2 + C) C][C*D].
Status mixes_cuda(const ExecCtx& ctx, const float* h, const float* fn, int C, int64_t D, int64_t S, float norm_eps,
                  float* m);
// pre [S][C], post [S][C], comb [S][C][C] = split of each token's mixes m [S][M]; scale [3],
// base [M] device pointers.
Status split_cuda(const ExecCtx& ctx, const float* m, const float* scale, const float* base, int C, int64_t S, int iters,
                  float hc_eps, float* pre, float* post, float* comb);
// y[S][D] = bf16(sum_c w[t][c] h[t][c][:]), w [S][C].
Status pre_cuda(const ExecCtx& ctx, const float* h, const float* w, int C, int64_t D, int64_t S, float* y);
// Fused forms for a sub-layer (the same results as the ops they join):
// split_cuda of mixes_cuda, without the mixes leaving the GPU's registers (two launches);
Status mixes_split_cuda(const ExecCtx& ctx, const float* h, const float* fn, const float* scale, const float* base,
                        int C, int64_t D, int64_t S, float norm_eps, int iters, float hc_eps, float* pre, float* post,
                        float* comb);
// rms_norm_cuda(pre_cuda(h, w), norm_w) in one launch (y [S][D]).
Status pre_norm_cuda(const ExecCtx& ctx, const float* h, const float* w, int C, int64_t D, int64_t S,
                     const float* norm_w, float norm_eps, float* y);
// A sub-layer's entry: mixes_split_cuda (pre, post, comb from h) and pre_norm_cuda (y from h
// and the previous sub-layer's pre, in_pre) in two launches, the split beside the norm.
Status sublayer_in_cuda(const ExecCtx& ctx, const float* h, const float* fn, const float* scale, const float* base,
                        int C, int64_t D, int64_t S, float norm_eps, int iters, float hc_eps, const float* in_pre,
                        const float* norm_w, float* pre, float* post, float* comb, float* y);
// y[S][C][D] = bf16(post[t][j] x[t] + sum_i comb[t][i][j] res[t][i]), post [S][C], comb [S][C][C].
Status post_cuda(const ExecCtx& ctx, const float* x, const float* res, const float* post, const float* comb, int C,
                 int64_t D, int64_t S, float* y);
// A sub-layer's exit joined to the next one's norm: post_cuda(x, res, post, comb) into h, then
// pre_norm_cuda(h, pre, norm_w) into y, one block per token (one launch).
Status post_pre_norm_cuda(const ExecCtx& ctx, const float* x, const float* res, const float* post, const float* comb,
                          int C, int64_t D, int64_t S, const float* pre, const float* norm_w, float norm_eps, float* h,
                          float* y);

// post_cuda(x, res, post, comb) into h, engram::gate_update_cuda(h, kv, qk) on it (an Engram
// layer between two sub-layers), then pre_norm_cuda(h, pre, norm_w) into y, in one launch (a
// cluster of 8 CTAs a token); the gate's sums reduce in another tree than gate_update_cuda's
// (fp32 rounding apart). Where post_gate_pre_norm_applies (C = 4, D <= 8,192; not with
// DSF_ENGRAM_EXIT=0, measurement); else Unimplemented.
Status post_gate_pre_norm_cuda(const ExecCtx& ctx, const float* x, const float* res, const float* post,
                               const float* comb, int C, int64_t D, int64_t S, const float* kv, const float* qk,
                               const float* pre, const float* norm_w, float norm_eps, float* h, float* y);
bool post_gate_pre_norm_applies(int C, int64_t D);

}  // namespace dsflash::kernels::hc
