// The dot product of one 16-bit float row (bf16 or f16) with x by a block, 8 values a thread a
// load (16 bytes of weights, two float4 of x): a 5,120-column row is three rounds of loads
// instead of twenty 2-byte ones. Shared by linear_wide16_kernel (the MoE router's GEMV) and the
// fused router + routing (moe.cu), so both give the same logits bit for bit.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "common/quant/quant.h"
#include "kernels/cuda/reduce.cuh"

namespace dsflash::kernels {

// sum_i w[i] x[i] over `cols` (a multiple of 8; w and x 16-byte aligned): each thread an fmaf
// chain over its runs of 8 in order, then block_sum<kThreads> (`part`: kThreads / 32 floats of
// shared memory). Every thread gets the sum.
template <quant::GgmlType kType, int kThreads>
__device__ __forceinline__ float wide16_row_dot(const uint8_t* w_row, const float* x, int64_t cols, float* part) {
  static_assert(kType == quant::GgmlType::kBF16 || kType == quant::GgmlType::kF16);
  const uint4* wr = reinterpret_cast<const uint4*>(w_row);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const auto lo = [](uint32_t w) {
    if constexpr (kType == quant::GgmlType::kBF16) return __uint_as_float(w << 16);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  };
  const auto hi = [](uint32_t w) {
    if constexpr (kType == quant::GgmlType::kBF16) return __uint_as_float(w & 0xffff0000u);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  };
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < cols / 8; i += kThreads) {
    const uint4 w = wr[i];
    const float4 a = x4[2 * i], b = x4[2 * i + 1];
    acc = fmaf(lo(w.x), a.x, acc);
    acc = fmaf(hi(w.x), a.y, acc);
    acc = fmaf(lo(w.y), a.z, acc);
    acc = fmaf(hi(w.y), a.w, acc);
    acc = fmaf(lo(w.z), b.x, acc);
    acc = fmaf(hi(w.z), b.y, acc);
    acc = fmaf(lo(w.w), b.z, acc);
    acc = fmaf(hi(w.w), b.w, acc);
  }
  return cuda::block_sum<kThreads>(acc, part);
}

}  // namespace dsflash::kernels
