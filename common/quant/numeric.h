// Scalar number formats used by GGUF blocks and the model's rounding points: IEEE fp16,
// bfloat16 (round-to-nearest-even), FP8 E4M3 (fn variant: no inf, 0x7F/0xFF = NaN, max 448),
// E8M0 power-of-two scales and FP4 E2M1. Header-only, host-only, bit-exact; no tables in
// memory so that every translation unit may inline them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace dsflash::quant {

inline uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// ---- bfloat16 -------------------------------------------------------------------------
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// bf16(x) as a float: the rounding point of every bf16 activation.
inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// ---- IEEE half --------------------------------------------------------------------------
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
// Round to nearest even, overflow to inf, subnormals kept.
inline uint16_t f32_to_f16(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;         // >= 65520: rounds to inf
  if (a < 0x38800000u) {                               // below 2^-14: subnormal half
    const float v = bits_f32(a);
    const float q = std::nearbyint(std::ldexp(v, 24)); // units of 2^-24, RNE
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = a - 0x38000000u;                         // rebias 127 -> 15 (shifted by 13)
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

// ---- FP8 E4M3 (fn) ----------------------------------------------------------------------
inline float e4m3_to_f32(uint8_t c) {
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  const int exp = (c >> 3) & 0xf;
  const int man = c & 0x7;
  if (exp == 15 && man == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);
  return sign * std::ldexp(1.0f + man / 8.0f, exp - 7);
}
// Saturating round-to-nearest-even; |x| >= 448 gives ±448, NaN gives 0x7F.
inline uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (q == 8 is the min normal)
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int q = static_cast<int>(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));
  int ex = e - 1;
  if (q == 8) {
    q = 0;
    ++ex;
  }
  return sign | static_cast<uint8_t>(((ex + 7) << 3) | q);
}

// ---- E8M0 scales ------------------------------------------------------------------------
// 2^(e-127); 255 is NaN.
inline float e8m0_to_f32(uint8_t e) {
  if (e == 255) return std::nanf("");
  if (e == 0) return bits_f32(0x00400000u);  // 2^-127 (subnormal fp32)
  return bits_f32(static_cast<uint32_t>(e) << 23);
}

// ---- FP4 E2M1 ---------------------------------------------------------------------------
// code = sign << 3 | index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[code & 7];
  return (code & 8) ? -v : v;
}
// Nearest E2M1 code, saturating at ±6, ties to the even code (up only at 0.75, 1.75, 3.5).
inline uint8_t f32_to_e2m1(float x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const float a = std::fabs(x);
  uint8_t i;
  if (!(a > 0.25f)) i = 0;  // also NaN -> 0
  else if (a < 0.75f) i = 1;
  else if (a <= 1.25f) i = 2;
  else if (a < 1.75f) i = 3;
  else if (a <= 2.5f) i = 4;
  else if (a < 3.5f) i = 5;
  else if (a <= 5.0f) i = 6;
  else i = 7;
  return sign | i;
}

}  // namespace dsflash::quant
