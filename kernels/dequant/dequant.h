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

// Types the CUDA path supports.
bool cuda_supports(quant::GgmlType type);

}  // namespace dsflash::kernels::dequant
