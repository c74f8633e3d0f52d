// Per-forward scratch shared down the layer stack (the reference's SharedAttentionRuntime):
// what index sources publish for the layers after them within one call.
#pragma once

#include <cstdint>
#include <vector>

#include "inference_svc/model/model.h"

namespace dsflash::model {

struct Model::Call {
  int64_t pos0 = 0;   // position of the first token of this call
  int64_t S = 0;      // tokens in this call
  int64_t n_win = 0;  // window rows given to sparse attention (S in prefill, window in decode)
  // Compressed top-k published by the latest index source: [S][topk_width], already + n_win.
  std::vector<int32_t> topk;
  int64_t topk_width = 0;
  // Candidate mask published by the candidate source: [S][n_keys].
  std::vector<uint8_t> candidates;
  int64_t cand_width = 0;
};

}  // namespace dsflash::model
