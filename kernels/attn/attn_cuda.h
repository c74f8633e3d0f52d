// Attention ops on the CUDA backend (host-only header): the ops of kernels/attn for S query
// rows at once, device pointers, on ctx.cuda_stream. Each follows the CPU reference's order of
// operations; sums over a row's elements (dot products) reduce in a tree, so fp32 results agree
// to rounding and bf16 results to one ulp at most where a rounding boundary is crossed.
// FailedPrecondition in a build without CUDA; InvalidArgument on sizes the kernels cannot take.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::attn {

// o[S][H][Dh] = sparse_attn of each query row q[t] over kv[idx[t][*]] (width entries, -1 =
// none), the sink sink[H] in every denominator. Dh <= 4096.
Status sparse_attn_cuda(const ExecCtx& ctx, const float* q, int64_t S, int H, int64_t Dh, const float* kv,
                        const int32_t* idx, int64_t width, const float* sink, float scale, float* o);

// latent[g][n] = pool_group of k[g], s[g] ([r][n] each) for `groups` groups.
Status pool_cuda(const ExecCtx& ctx, const float* k, const float* s, int64_t groups, int r, int64_t n, float* latent);

// score[S][n_keys] = index_scores of q[t] ([Hi][Di]) with weights w[t] ([Hi]); keys the query
// cannot see yet (j >= (pos0 + t + 1) / ratio, groups completed up to it) get -inf.
Status index_scores_cuda(const ExecCtx& ctx, const float* q, int64_t S, int Hi, int64_t Di, const float* keys,
                         int64_t n_keys, const float* w, int64_t pos0, int ratio, float* score);

// out[rows][k] = topk_ascending of each row of v [rows][n] (0 < k <= n): the k largest, ties
// towards the lower index, listed in ascending index order.
Status topk_cuda(const ExecCtx& ctx, const float* v, int64_t rows, int64_t n, int64_t k, int32_t* out);

// mask[S][n] = candidate_mask of each row of score [S][n] with compress_len (pos0 + t + 1) /
// ratio. Scratch comes from the stream-ordered allocator.
Status candidate_mask_cuda(const ExecCtx& ctx, const float* score, int64_t S, int64_t n, int64_t pos0, int ratio,
                           int64_t topk_blocks, int64_t block, uint8_t* mask);

}  // namespace dsflash::kernels::attn
