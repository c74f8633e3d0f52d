// Attention ops of V4.1 (spec §2.4-2.7): sparse attention with a sink over index lists,
// ratio-2 compressor pooling, indexer scores, candidate blocks and the top-k rule.
// Layouts: q [H][Dh] per query row; kv rows [n][Dh] (K = V); index lists int32, -1 = none.
#pragma once

#include <cstdint>
#include <vector>

namespace dsflash::kernels::attn {

// o[H][Dh] = bf16 of the online-softmax attention of one query row over kv[idx[k]] (chunks
// of 64 entries, bf16 probabilities relative to the running max, sink in the denominator).
void sparse_attn(const float* q, int H, int64_t Dh, const float* kv, const int32_t* idx, int64_t n_idx,
                 const float* sink, float scale, float* o);

// Ratio-r pooling of one group: latent[c] = sum_t k[t][c] * softmax_t(s[t][c]), fp32, then
// rounded to bf16. k, s: [r][n] fp32.
void pool_group(const float* k, const float* s, int r, int64_t n, float* latent);

// Indexer score of one query against `n_keys` keys: bf16(sum_h bf16(relu(bf16(q_h . k)) * w_h)).
// q [Hi][Di], keys [n_keys][Di], w [Hi]; writes score[n_keys].
void index_scores(const float* q, int Hi, int64_t Di, const float* keys, int64_t n_keys, const float* w,
                  float* score);

// Indices of the k largest values (ties: lower index first), returned in ascending index order.
std::vector<int32_t> topk_ascending(const float* v, int64_t n, int64_t k);

// Candidate mask of one query (spec §2.6 step 5): block max over `block` positions (the last
// block padded with -inf), the block holding position compress_len - 1 pinned to +inf, top
// `topk_blocks` blocks with score > -inf kept; mask[n] per position.
std::vector<uint8_t> candidate_mask(const float* score, int64_t n, int64_t compress_len, int64_t topk_blocks,
                                    int64_t block);

}  // namespace dsflash::kernels::attn
