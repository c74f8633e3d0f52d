#include <algorithm>
#include <cmath>

#include "common/quant/numeric.h"
#include "kernels/qdq/qdq.h"

namespace dsflash::kernels::qdq {
namespace {

float block_amax(const float* v, int64_t n) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) a = std::fmax(a, std::fabs(v[i]));
  return a;
}

}  // namespace

float pow2_scale(float amax, float inv_max) {
  const uint32_t bits = quant::f32_bits(amax * inv_max);
  const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff);
  const int32_t log2_ceil = exp - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
  return quant::bits_f32(static_cast<uint32_t>(log2_ceil + 127) << 23);
}

void fp8_e8m0_32(float* v, int64_t n) {
  const float inv = 1.0f / 448.0f;
  for (int64_t b = 0; b < n; b += 32) {
    const float s = pow2_scale(std::max(block_amax(v + b, 32), 1e-4f), inv);
    for (int64_t i = b; i < b + 32; ++i) {
      const float q = quant::e4m3_to_f32(quant::f32_to_e4m3(std::clamp(v[i] / s, -448.0f, 448.0f)));
      v[i] = quant::round_bf16(q * s);
    }
  }
}

void fp4_e4m3_16(float* v, int64_t n) {
  for (int64_t b = 0; b < n; b += 16) {
    const float amax = std::max(block_amax(v + b, 16), 6.0f * std::ldexp(1.0f, -9));
    const float s = quant::e4m3_to_f32(quant::f32_to_e4m3(std::min(amax / 6.0f, 448.0f)));
    for (int64_t i = b; i < b + 16; ++i) {
      const float q = quant::e2m1_to_f32(quant::f32_to_e2m1(std::clamp(v[i] / s, -6.0f, 6.0f)));
      v[i] = quant::round_bf16(q * s);
    }
  }
}

void fp4_e8m0_32(float* v, int64_t n) {
  const float inv = 1.0f / 6.0f;
  for (int64_t b = 0; b < n; b += 32) {
    const float s = pow2_scale(std::max(block_amax(v + b, 32), 6.0f * std::ldexp(1.0f, -126)), inv);
    for (int64_t i = b; i < b + 32; ++i) {
      const float q = quant::e2m1_to_f32(quant::f32_to_e2m1(std::clamp(v[i] / s, -6.0f, 6.0f)));
      v[i] = quant::round_bf16(q * s);
    }
  }
}

}  // namespace dsflash::kernels::qdq
