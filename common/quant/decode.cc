// Exact GGML block decoders (spec/model-v41.md §4.3). Each reads one block of bytes and
// writes its fp32 values; the arithmetic order matches ggml-quants.c so results are
// bit-identical to GGML's reference dequantisation.
#include <cstring>

#include "common/quant/quant.h"

namespace dsflash::quant::block {
namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// 6-bit (scale, min) pair k of a Q4_K / Q5_K scales[12] array.
inline void scale_min_k4(int k, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (k < 4) {
    *sc = s[k] & 63;
    *m = s[k + 4] & 63;
  } else {
    *sc = (s[k + 4] & 0xf) | ((s[k - 4] >> 6) << 4);
    *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
}

}  // namespace

// Q8_0: d fp16, then 32 int8.
void decode_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
}

// Q2_K: scales[16] | qs[64] | d | dmin.
void decode_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half_at(b + 80);
  const float dmin = half_at(b + 82);
  int is = 0;
  for (int n = 0; n < 2; ++n, q += 32) {
    for (int j = 0; j < 4; ++j) {
      const int shift = 2 * j;
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xf);
        const float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[16 * half + l] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K: hmask[32] | qs[64] | scales[12] | d.
void decode_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const uint8_t* s = b + 96;
  const float d = half_at(b + 108);
  int8_t sc[16];
  for (int i = 0; i < 16; ++i) {
    const int lo4 = i < 8 ? (s[i] & 0xf) : (s[i - 8] >> 4);
    const int hi2 = (s[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    sc[i] = static_cast<int8_t>((lo4 | (hi2 << 4)) - 32);
  }
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < 2; ++n, q += 32) {
    for (int j = 0; j < 4; ++j, m <<= 1) {
      const int shift = 2 * j;
      for (int half = 0; half < 2; ++half) {
        const float dl = d * static_cast<float>(sc[is++]);
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          const int v = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
    }
  }
}

// Q4_K: d | dmin | scales[12] | qs[128].
void decode_q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const float dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* q = b + 16;
  for (int c = 0; c < 4; ++c, q += 32) {
    uint8_t sc, m;
    scale_min_k4(2 * c, s, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(2 * c + 1, s, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xf) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

// Q5_K: d | dmin | scales[12] | qh[32] | qs[128].
void decode_q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const float dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int c = 0; c < 4; ++c, ql += 32, u1 <<= 2, u2 <<= 2) {
    uint8_t sc, m;
    scale_min_k4(2 * c, s, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(2 * c + 1, s, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xf) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
  }
}

// Q6_K: ql[128] | qh[64] | scales[16] (int8) | d.
void decode_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int n = 0; n < 2; ++n, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// MXFP4: e (E8M0) | qs[16]; element j in the low nibble of byte j, j+16 in its high nibble.
// Values are doubled E2M1 times 2^(e-128), which equals e2m1 * 2^(e-127).
void decode_mxfp4(const uint8_t* b, float* y) {
  static constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  // 2^(e-128), exact for every byte (fp32 subnormals for e < 2; e = 255 is 2^127 as in GGML).
  const uint8_t e = b[0];
  const float scale = bits_f32(e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23));
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(kValues[b[1 + j] & 0xf]) * scale;
    y[j + 16] = static_cast<float>(kValues[b[1 + j] >> 4]) * scale;
  }
}

}  // namespace dsflash::quant::block
