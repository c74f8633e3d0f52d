// Dequantisation of GGML blocks to fp32 on either backend. The CPU path is the reference
// (common/quant decoders); the CUDA path is bit-identical to it (tests/kernels/dequant_test).
#pragma once

#include <cstdint>

#include "common/quant/quant.h"
#include "common/status.h"
#include "kernels/exec.h"

namespace dsflash::kernels::dequant {

// Decodes n_elems values (whole blocks) of `type` from `src` into `dst`. With kCuda both
// pointers are device memory and the work is queued on ctx.cuda_stream.
Status dequantize(const ExecCtx& ctx, quant::GgmlType type, const void* src, float* dst, int64_t n_elems);

// dst[i][:] = row ids[i] of a `type` matrix (`cols` values per row, rows row_bytes apart,
// n_rows rows), rounded to bf16 when round_bf16 (embedding and Engram rows); an id outside
// [0, n_rows) gives a NaN row. Device pointers, on ctx.cuda_stream (kCuda only).
Status gather_rows_cuda(const ExecCtx& ctx, quant::GgmlType type, const void* table, int64_t cols, uint64_t row_bytes,
                        int64_t n_rows, const int64_t* ids, int64_t n_ids, bool round_bf16, float* dst);

// Types the CUDA path supports.
bool cuda_supports(quant::GgmlType type);

}  // namespace dsflash::kernels::dequant
