// Sparse attention split over its lists' chunks (sparse_split.cu), for attn.cu's
// sparse_attn_cuda: the launch it takes for a few query rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/attn/attn_args.cuh"

namespace dsflash::kernels::attn::detail {

// Whether the split takes a call: heads in fours, Dh a multiple of 4 up to 1024, 16-byte
// aligned rows, at most 512 chunks (32,768 entries) and 32 MB of partial results (decode steps
// and short prefill chunks), and DSF_ATTN_SPLIT not 0 (measurement).
bool split_applies(int64_t S, int H, int64_t Dh, int64_t width, const float* q, const float* kv_a, const float* kv_b,
                   const float* o);

// sparse_attn_cuda's result for such a call: two launches on st (the chunks' logits, then their
// values and the merge), their scratch stream-ordered.
Status sparse_attn_split(cudaStream_t st, const float* q, int64_t S, int H, int64_t Dh, const float* kv_a, int64_t n_a,
                         const float* kv_b, const int32_t* idx, int64_t width, const float* sink, float scale, float* o,
                         const RopeArgs& rope, const WindowArgs& win);

}  // namespace dsflash::kernels::attn::detail
