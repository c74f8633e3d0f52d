// Block encoders for the types the synthetic-model writer emits. They are simple
// min/max (or max-abs) quantisers, not GGML's error-minimising searches: their job is to
// produce valid blocks whose decode is close to the input, with the bounds the tests state.
// Every encoder quantises against the *stored* (fp16-rounded, integer) scales, so decoding
// reproduces exactly what the encoder intended.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/quant/quant.h"

namespace dsflash::quant::block {
namespace {

inline void put_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
inline float stored_half(float v) { return f16_to_f32(f32_to_f16(v)); }
// Smallest half >= v (v >= 0): a min scale rounded up keeps every sub-block min representable.
inline float stored_half_up(float v) {
  uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) < v) ++h;
  return f16_to_f32(h);
}

inline int clampi(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
inline int round_div(float x, float d) { return d == 0.0f ? 0 : static_cast<int>(std::lround(x / d)); }

// Affine sub-block statistics: scale = (max - min) / levels and a non-negative min offset
// (GGML's K-quants subtract dmin*m, so the representable offset is <= 0).
struct Affine {
  float scale;
  float neg_min;
};
Affine affine(const float* x, int n, int levels) {
  float lo = 0.0f, hi = 0.0f;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  return {(hi - lo) / static_cast<float>(levels), -lo};
}

// Signed sub-block scale such that the largest-magnitude value maps to the code -qmax_neg
// (the symmetric K-quants have one more negative level than positive).
float signed_scale(const float* x, int n, int qmax_neg) {
  float best = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
  }
  return -best / static_cast<float>(qmax_neg);
}

}  // namespace

void encode_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = stored_half(amax / 127.0f);
  put_half(b, d);
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(clampi(round_div(x[i], d), -127, 127)));
}

// Q2_K: 16 sub-blocks of 16, 4-bit scale and min each, 2-bit codes.
void encode_q2_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 84);
  Affine sub[16];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 16; ++s) {
    sub[s] = affine(x + 16 * s, 16, 3);
    max_scale = std::max(max_scale, sub[s].scale);
    max_min = std::max(max_min, sub[s].neg_min);
  }
  const float d = stored_half(max_scale / 15.0f);
  const float dmin = stored_half_up(max_min / 15.0f);
  put_half(b + 80, d);
  put_half(b + 82, dmin);
  for (int s = 0; s < 16; ++s) {
    const int sc = clampi(round_div(sub[s].scale, d), 0, 15);
    const int m = clampi(static_cast<int>(std::ceil(dmin == 0.0f ? 0.0f : sub[s].neg_min / dmin)), 0, 15);
    b[s] = static_cast<uint8_t>(sc | (m << 4));
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * s + l;  // value index: n = e/128, j = (e%128)/32, l = e%32
      const int q = clampi(round_div(x[e] + ml, dl), 0, 3);
      const int n = e / 128, j = (e % 128) / 32, ll = e % 32;
      b[16 + 32 * n + ll] |= static_cast<uint8_t>(q << (2 * j));
    }
  }
}

// Q3_K: 16 sub-blocks of 16, signed 6-bit scales, codes -4..3 (2 low bits + high-mask bit).
void encode_q3_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 110);
  float scale[16];
  float max_abs = 0.0f;
  for (int s = 0; s < 16; ++s) {
    scale[s] = signed_scale(x + 16 * s, 16, 4);
    max_abs = std::max(max_abs, std::fabs(scale[s]));
  }
  const float d = stored_half(max_abs / 31.0f);
  put_half(b + 108, d);
  uint8_t* hm = b;
  uint8_t* qs = b + 32;
  uint8_t* sc6 = b + 96;
  for (int s = 0; s < 16; ++s) {
    const int sc = clampi(round_div(scale[s], d), -32, 31);
    const int u = sc + 32;  // 6-bit biased
    if (s < 8) sc6[s] |= static_cast<uint8_t>(u & 0xf);
    else sc6[s - 8] |= static_cast<uint8_t>((u & 0xf) << 4);
    sc6[8 + (s % 4)] |= static_cast<uint8_t>(((u >> 4) & 3) << (2 * (s / 4)));
    const float dl = d * static_cast<float>(sc);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * s + l;
      const int q = clampi(round_div(x[e], dl), -4, 3) + 4;  // 0..7
      const int n = e / 128, j = (e % 128) / 32, ll = e % 32;
      qs[32 * n + ll] |= static_cast<uint8_t>((q & 3) << (2 * j));
      if (q & 4) hm[ll] |= static_cast<uint8_t>(1u << (4 * n + j));
    }
  }
}

// Q4_K: 8 sub-blocks of 32, 6-bit scale and min each, 4-bit codes.
void encode_q4_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 144);
  Affine sub[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    sub[s] = affine(x + 32 * s, 32, 15);
    max_scale = std::max(max_scale, sub[s].scale);
    max_min = std::max(max_min, sub[s].neg_min);
  }
  const float d = stored_half(max_scale / 63.0f);
  const float dmin = stored_half_up(max_min / 63.0f);
  put_half(b, d);
  put_half(b + 2, dmin);
  uint8_t* s12 = b + 4;
  uint8_t* qs = b + 16;
  for (int s = 0; s < 8; ++s) {
    const int sc = clampi(round_div(sub[s].scale, d), 0, 63);
    const int m = clampi(static_cast<int>(std::ceil(dmin == 0.0f ? 0.0f : sub[s].neg_min / dmin)), 0, 63);
    if (s < 4) {
      s12[s] |= static_cast<uint8_t>(sc);
      s12[s + 4] |= static_cast<uint8_t>(m);
    } else {
      s12[s + 4] = static_cast<uint8_t>((sc & 0xf) | ((m & 0xf) << 4));
      s12[s - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
      s12[s] |= static_cast<uint8_t>((m >> 4) << 6);
    }
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    const int c = s / 2;
    for (int l = 0; l < 32; ++l) {
      const int q = clampi(round_div(x[32 * s + l] + ml, dl), 0, 15);
      qs[32 * c + l] |= static_cast<uint8_t>((s % 2) ? (q << 4) : q);
    }
  }
}

// Q6_K: 16 sub-blocks of 16, int8 scales, codes -32..31.
void encode_q6_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 210);
  float scale[16];
  float max_abs = 0.0f;
  for (int s = 0; s < 16; ++s) {
    scale[s] = signed_scale(x + 16 * s, 16, 32);
    max_abs = std::max(max_abs, std::fabs(scale[s]));
  }
  const float d = stored_half(max_abs / 127.0f);
  put_half(b + 208, d);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  auto* sc8 = reinterpret_cast<int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s) {
    const int sc = clampi(round_div(scale[s], d), -128, 127);
    sc8[s] = static_cast<int8_t>(sc);
    const float dl = d * static_cast<float>(sc);
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * s + i;
      const int q = clampi(round_div(x[e], dl), -32, 31) + 32;  // 0..63
      const int n = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
      // quarter 0: ql[l] low, 1: ql[l+32] low, 2: ql[l] high, 3: ql[l+32] high.
      uint8_t& lo = ql[64 * n + l + ((quarter & 1) ? 32 : 0)];
      lo |= static_cast<uint8_t>((quarter & 2) ? ((q & 0xf) << 4) : (q & 0xf));
      qh[32 * n + l] |= static_cast<uint8_t>((q >> 4) << (2 * quarter));
    }
  }
}

// MXFP4: shared E8M0 exponent so that amax / 2^(e-127) <= 6, then nearest E2M1 per value.
void encode_mxfp4(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  int e = 0;
  if (amax > 0.0f) {
    int ex;
    std::frexp(amax / 6.0f, &ex);  // amax/6 in [2^(ex-1), 2^ex)
    e = std::clamp(ex + 127, 0, 254);
    if (std::ldexp(1.0f, ex - 1) == amax / 6.0f) e = std::clamp(ex - 1 + 127, 0, 254);  // exact power of two
  }
  b[0] = static_cast<uint8_t>(e);
  const float inv = std::ldexp(1.0f, 127 - e);  // 1 / 2^(e-127)
  for (int j = 0; j < 16; ++j) {
    const uint8_t lo = f32_to_e2m1(x[j] * inv);
    const uint8_t hi = f32_to_e2m1(x[j + 16] * inv);
    b[1 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace dsflash::quant::block
