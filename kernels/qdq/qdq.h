// The model's simulated-quantisation points (spec §2.8), bit-exact with the reference:
// window KV FP8 E4M3 (block 32, E8M0 scales), compressed KV FP4 E2M1 (block 16, E4M3
// scales), indexer q/k FP4 E2M1 (block 32, E8M0 scales). In place on bf16 values.
#pragma once

#include <cstdint>

namespace dsflash::kernels::qdq {

void fp8_e8m0_32(float* v, int64_t n);
void fp4_e4m3_16(float* v, int64_t n);
void fp4_e8m0_32(float* v, int64_t n);

// 2^ceil(log2(amax * inv_max)) from the fp32 bits of the product (the reference's fast_round_scale).
float pow2_scale(float amax, float inv_max);

}  // namespace dsflash::kernels::qdq
