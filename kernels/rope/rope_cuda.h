// Rotary embeddings on the CUDA backend (host-only header): as kernels::rope::apply on the
// last `dims` values of each row, row r at position pos0 + (r / rows_per_pos) * pos_stride (the
// heads of one token share a position; compressed groups stand `ratio` positions apart), fp32
// angles, bf16 results.
#pragma once

#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::rope {

// pos0 may be read from device memory (DevScalar) when the op runs.
// freqs: device pointer to the table's dims / 2 frequencies; v: device [n_rows][len], rotated
// in place; runs on ctx.cuda_stream. FailedPrecondition in a build without CUDA.
Status apply_cuda(const ExecCtx& ctx, const float* freqs, int dims, float* v, int64_t n_rows, int64_t len, DevScalar pos0,
                  int64_t rows_per_pos, bool inverse = false, int64_t pos_stride = 1);

}  // namespace dsflash::kernels::rope
