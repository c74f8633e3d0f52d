// Attention ops on the CUDA backend (host-only header): the ops of kernels/attn for S query
// rows at once, device pointers, on ctx.cuda_stream. Each follows the CPU reference's order of
// operations; sums over a row's elements (dot products) reduce in a tree, so fp32 results agree
// to rounding and bf16 results to one ulp at most where a rounding boundary is crossed.
// FailedPrecondition in a build without CUDA; InvalidArgument on sizes the kernels cannot take.
// A position argument (pos0, a DevScalar) may be read from device memory when the op runs (graph
// replays); host-side sizing uses its value (window_index_cuda: whether it is 0). With a position
// read at run time, rows of n keys may be a capacity: keys at or beyond (pos0 + t + 1) / ratio
// score -inf and are never selected ahead of a visible key.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::attn {

// RoPE fused into sparse attention (rope::apply_cuda's rotation of a row's last `dims` values at
// position pos0 + t for query row t): the query rows are rotated as they are read, the output
// rows rotated back (inverse) before they are written.
struct AttnRope {
  const float* freqs = nullptr;  // [dims / 2]
  int dims = 0;
  DevScalar pos0;
};

// The window part of sparse attention's index lists made where they are read: the first ww
// entries of row t's list (ww = pos0 == 0 ? min(S, W) : W) are what window_index_cuda would
// write at pos0 with window W, the rest come from idx.
struct AttnWindow {
  DevScalar pos0;
  int64_t W = 0;
};

// o[S][H][Dh] = sparse_attn of each query row q[t] over the rows idx[t][*] (width entries,
// -1 = none) of [kv_a (n_a rows) ; kv_b]: index j < n_a reads kv_a[j], else kv_b[j - n_a] (the
// window rows and the compressed cache, without joining them). The sink sink[H] is in every
// denominator. Dh <= 4096. With `rope`, q's rows are used rotated (q itself is not written)
// and o's rows are rotated back: the same values as rope, attention, inverse rope. With
// `window`, row t's list is its ww window entries followed by idx[t][0 .. width - ww) (idx's
// rows width - ww apart; idx may be null when that is 0): the same values as the lists
// window_index_cuda and a copy of idx would make.
Status sparse_attn_cuda(const ExecCtx& ctx, const float* q, int64_t S, int H, int64_t Dh, const float* kv_a,
                        int64_t n_a, const float* kv_b, const int32_t* idx, int64_t width, const float* sink,
                        float scale, float* o, const AttnRope* rope = nullptr, const AttnWindow* window = nullptr);

// latent[g][n] = pool_group of k[g], s[g] ([r][n] each) for `groups` groups.
Status pool_cuda(const ExecCtx& ctx, const float* k, const float* s, int64_t groups, int r, int64_t n, float* latent);

// score[S][n_keys] = index_scores of q[t] ([Hi][Di]) with weights bf16(w[t][h] * w_scale); keys
// the query cannot see yet (j >= (pos0 + t + 1) / ratio, groups completed up to it) get -inf.
Status index_scores_cuda(const ExecCtx& ctx, const float* q, int64_t S, int Hi, int64_t Di, const float* keys,
                         int64_t n_keys, const float* w, float w_scale, DevScalar pos0, int ratio, float* score);

// out[rows][k] = topk_ascending of each row of v [rows][n] (0 < k <= n): the k largest, ties
// towards the lower index, listed in ascending index order.
Status topk_cuda(const ExecCtx& ctx, const float* v, int64_t rows, int64_t n, int64_t k, int32_t* out);
// topk_cuda with every key j >= (pos0 + t + 1) / ratio of row t (ratio > 0; 0: no limit) counted as -inf
// and not read: the keys a query cannot see yet, which index_scores_cuda scores -inf (a graph's
// step scores a capacity's keys, most of them beyond the position).
Status topk_visible_cuda(const ExecCtx& ctx, const float* v, int64_t rows, int64_t n, int64_t k, DevScalar pos0,
                         int ratio, int32_t* out);

// mask[S][n] = candidate_mask of each row of score [S][n] with compress_len (pos0 + t + 1) /
// ratio. Scratch comes from the stream-ordered allocator.
Status candidate_mask_cuda(const ExecCtx& ctx, const float* score, int64_t S, int64_t n, DevScalar pos0, int ratio,
                           int64_t topk_blocks, int64_t block, uint8_t* mask);

// The index plumbing of the model's attention (inference_svc/model/attention.cc, window_kv and
// indexer), on the device:
// Window index lists for a call of S tokens at pos0 with window W into idx [S][ld] (columns
// [0, width), width = pos0 == 0 ? min(S, W) : W): a prefill at 0 lists max(0, t-W+1)..t of this
// call's rows; a decode step (pos0 > 0, S == 1) the ring oldest slot first; a later chunk the last
// W positions in [ring ; this call's rows]; -1 padded. (The model's attention has sparse_attn_cuda
// make these entries itself, AttnWindow; this op is their definition and the tests' oracle.)
Status window_index_cuda(const ExecCtx& ctx, DevScalar pos0, int64_t S, int64_t W, int32_t* idx, int64_t ld);
// ring[(pos0 + t) mod W] = kv[t] for the last min(S, W) rows of kv [S][Dh].
Status ring_write_cuda(const ExecCtx& ctx, const float* kv, DevScalar pos0, int64_t S, int64_t W, int64_t Dh,
                       float* ring);
// The window rows' finish in one launch, equal to rms_norm_cuda(kv, norm_w), then
// rope::apply_cuda(freqs, dims, kv, S, Dh, pos0, 1), then qdq::fp8_e8m0_32_cuda(kv), in place
// on kv [S][Dh] (Dh a multiple of 32), and with a ring (one row: a decode step) also
// ring_write_cuda of the result.
Status kv_rows_cuda(const ExecCtx& ctx, float* kv, int64_t S, int64_t Dh, const float* norm_w, float eps,
                    const float* freqs, int dims, DevScalar pos0, float* ring, int64_t W);
// out[t][i] (row stride ld) = top[t][i] < (pos0 + t + 1) / ratio ? top[t][i] + n_win : -1; top
// null stands for i (the top-k of k keys: every key in index order).
Status publish_topk_cuda(const ExecCtx& ctx, const int32_t* top, int64_t S, int64_t k, DevScalar pos0, int ratio,
                         int64_t n_win, int32_t* out, int64_t ld);
// score[t][j] = -inf where !cand[t][j] (score [S][n], cand [S][cand_ld]).
Status mask_candidates_cuda(const ExecCtx& ctx, float* score, const uint8_t* cand, int64_t S, int64_t n,
                            int64_t cand_ld);

}  // namespace dsflash::kernels::attn
