// QDQ arithmetic of one value on the CUDA backend (qdq.cu's kernels and the fused attention
// row kernel): the CPU reference's scale and code arithmetic (IEEE division, round-to-nearest-
// even, saturation, NaN handling).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dsflash::kernels::qdq::detail {

enum class Kind { kFp8E8m0, kFp4E4m3, kFp4E8m0 };

// std::clamp / std::max semantics (a NaN x passes through clamp; max(x, c) is x unless x < c).
__device__ __forceinline__ float clamp_like_std(float x, float lo, float hi) { return x < lo ? lo : (hi < x ? hi : x); }
__device__ __forceinline__ float max_like_std(float a, float b) { return a < b ? b : a; }

__device__ __forceinline__ float e4m3_decode(uint32_t c) {
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  const int exp = (c >> 3) & 0xf, man = c & 0x7;
  if (exp == 15 && man == 7) return __int_as_float(0x7fc00000);
  if (exp == 0) return sign * ldexpf(static_cast<float>(man), -9);
  return sign * ldexpf(1.0f + man / 8.0f, exp - 7);
}

__device__ __forceinline__ uint32_t e4m3_encode(float x) {
  if (isnan(x)) return 0x7f;
  const uint32_t sign = signbit(x) ? 0x80 : 0x00;
  const float a = fabsf(x);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) return sign | static_cast<uint32_t>(rintf(ldexpf(a, 9)));
  int e;
  const float m = frexpf(a, &e);
  int q = static_cast<int>(rintf((m * 2.0f - 1.0f) * 8.0f));
  int ex = e - 1;
  if (q == 8) {
    q = 0;
    ++ex;
  }
  return sign | static_cast<uint32_t>(((ex + 7) << 3) | q);
}

__device__ __forceinline__ float e2m1_round(float x) {  // encode then decode
  const float a = fabsf(x);
  float m;
  if (!(a > 0.25f)) m = 0.0f;
  else if (a < 0.75f) m = 0.5f;
  else if (a <= 1.25f) m = 1.0f;
  else if (a < 1.75f) m = 1.5f;
  else if (a <= 2.5f) m = 2.0f;
  else if (a < 3.5f) m = 3.0f;
  else if (a <= 5.0f) m = 4.0f;
  else m = 6.0f;
  return signbit(x) ? -m : m;
}

__device__ __forceinline__ float pow2_scale(float amax, float inv_max) {
  const uint32_t bits = __float_as_uint(amax * inv_max);
  const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff);
  const int32_t log2_ceil = exp - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
  return __uint_as_float(static_cast<uint32_t>(log2_ceil + 127) << 23);
}

// x's QDQ result in a block of largest magnitude amax.
template <Kind K>
__device__ __forceinline__ float qdq_value(float x, float amax) {
  float q, s;
  if constexpr (K == Kind::kFp8E8m0) {
    s = pow2_scale(max_like_std(amax, 1e-4f), 1.0f / 448.0f);
    q = e4m3_decode(e4m3_encode(clamp_like_std(x / s, -448.0f, 448.0f)));
  } else if constexpr (K == Kind::kFp4E4m3) {
    const float a = max_like_std(amax, 6.0f * ldexpf(1.0f, -9));
    const float r = a / 6.0f;
    s = e4m3_decode(e4m3_encode(448.0f < r ? 448.0f : r));  // std::min(r, 448)
    q = e2m1_round(clamp_like_std(x / s, -6.0f, 6.0f));
  } else {
    s = pow2_scale(max_like_std(amax, 6.0f * ldexpf(1.0f, -126)), 1.0f / 6.0f);
    q = e2m1_round(clamp_like_std(x / s, -6.0f, 6.0f));
  }
  return __bfloat162float(__float2bfloat16_rn(q * s));
}

// qdq_value of x in its block: lanes of kBlock (16 or 32) consecutive lanes hold one block,
// whose amax they share by shuffles (every lane of the warp calls this; a lane past the data
// passes 0 and ignores the result).
template <Kind K>
__device__ __forceinline__ float qdq_lane(float x) {
  constexpr int kBlock = K == Kind::kFp4E4m3 ? 16 : 32;
  float amax = fabsf(x);
  for (int o = kBlock / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  return qdq_value<K>(x, amax);
}

}  // namespace dsflash::kernels::qdq::detail
