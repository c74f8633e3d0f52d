// Sparse attention on the tensor cores (sparse_tc.cu), for attn.cu's sparse_attn_cuda: every
// call it takes, a decode step's row and a prefill chunk's rows alike; the split kernels the
// rest, every call under DSF_ATTN_TC=0 and every call of more than one row under
// DSF_ATTN_TC_ROWS=0 (docs/cuda-backend.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/attn/attn_args.cuh"

namespace dsflash::kernels::attn::detail {

// Whether it takes a call: not DSF_ATTN_TC=0, a device that runs it (clusters of 8 CTAs of
// ~98 KB of shared memory), up to 65,535 query rows, head dim 64 or 512, any head count (a
// CTA takes sixteen, padded), at most 16 chunks of 64 entries, at most 64 RoPE dims (rope_half
// pairs; 0: no RoPE), 16-byte aligned q and rows.
bool tc_applies(int64_t S, int H, int64_t Dh, int64_t width, int rope_half, const float* q, const float* kv_a,
                const float* kv_b);

// sparse_attn_cuda's result for such a call: one launch of clusters on st (a row's own).
Status sparse_attn_tc(cudaStream_t st, const float* q, int64_t S, int H, int64_t Dh, const float* kv_a, int64_t n_a,
                      const float* kv_b, const int32_t* idx, int64_t width, const float* sink, float scale, float* o,
                      const RopeArgs& rope, const WindowArgs& win);

}  // namespace dsflash::kernels::attn::detail
