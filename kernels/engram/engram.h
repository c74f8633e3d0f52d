// Engram (spec §3): n-gram hash row ids over compressed token ids (integer-exact), and the
// gate + update of the residual streams from the projected rows.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config/config.h"

namespace dsflash::kernels::engram {

// Row ids of Engram layer slot `e` (index into cfg.layer_ids) for the token at the end of
// `history` (compressed ids, oldest first; only the last max_ngram matter; missing look-backs
// use the mapped pad). Writes cfg.cols() ids in (n, head) order.
void hash_ids(const config::EngramConfig& cfg, size_t e, const int64_t* history, int64_t n_history, int64_t* out);

// Gate and update for one token: kv [(C+1)*D] (keys stream-major, then the shared value),
// h [C][D] updated in place: h_c = bf16(h_c + gate_c * value). qk = q_weight * k_weight [C][D].
// Writes the C gates to `gate` (may be null).
void gate_update(float* h, const float* kv, const float* qk, int C, int64_t D, float norm_eps, float* gate);

}  // namespace dsflash::kernels::engram
