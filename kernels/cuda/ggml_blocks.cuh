// Device-side GGML block decoders shared by the CUDA kernels: value e of one block, with the
// CPU reference's rounding order (explicit __fmul_rn / __fsub_rn, no FMA contraction), so a
// kernel that decodes with these reproduces common/quant/decode.cc bit for bit.
// Layouts: spec/model-v41.md §4.3.
#pragma once

#include <cuda_fp16.h>
#include <cstdint>

#include "common/quant/quant.h"

namespace dsflash::kernels::cuda {

__device__ __forceinline__ float half_at(const uint8_t* p) {
  const unsigned short h = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ void scale_min_k4(int k, const uint8_t* s, int* sc, int* m) {
  if (k < 4) {
    *sc = s[k] & 63;
    *m = s[k + 4] & 63;
  } else {
    *sc = (s[k + 4] & 0xf) | ((s[k - 4] >> 6) << 4);
    *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
}

// Value e (0..255) of a Q2_K block b: scales[16] | qs[64] | d | dmin.
__device__ inline float q2_k(const uint8_t* b, int e) {
  const int n = e / 128, r = e % 128, j = r / 32, l = r % 32;
  const int sc = b[8 * n + 2 * j + l / 16];
  const int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
  const float dl = __fmul_rn(half_at(b + 80), static_cast<float>(sc & 0xf));
  const float ml = __fmul_rn(half_at(b + 82), static_cast<float>(sc >> 4));
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
}

// Q3_K: hmask[32] | qs[64] | scales[12] | d.
__device__ inline float q3_k(const uint8_t* b, int e) {
  const int n = e / 128, r = e % 128, j = r / 32, l = r % 32;
  const int s = 8 * n + 2 * j + l / 16;
  const uint8_t* sc = b + 96;
  const int lo4 = s < 8 ? (sc[s] & 0xf) : (sc[s - 8] >> 4);
  const int hi2 = (sc[8 + (s % 4)] >> (2 * (s / 4))) & 3;
  const int scale = (lo4 | (hi2 << 4)) - 32;
  const int q = ((b[32 + 32 * n + l] >> (2 * j)) & 3) - (((b[l] >> (4 * n + j)) & 1) ? 0 : 4);
  return __fmul_rn(__fmul_rn(half_at(b + 108), static_cast<float>(scale)), static_cast<float>(q));
}

// Q4_K: d | dmin | scales[12] | qs[128]; Q5_K adds qh[32] before qs.
template <bool kHigh>
__device__ float q45_k(const uint8_t* b, int e) {
  const int c = e / 64, hi = (e % 64) / 32, l = e % 32;
  int sc, m;
  scale_min_k4(2 * c + hi, b + 4, &sc, &m);
  const uint8_t* qs = b + (kHigh ? 48 : 16);
  int q = hi ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0xf);
  if (kHigh && ((b[16 + l] >> (2 * c + hi)) & 1)) q += 16;
  const float d1 = __fmul_rn(half_at(b), static_cast<float>(sc));
  const float m1 = __fmul_rn(half_at(b + 2), static_cast<float>(m));
  return __fsub_rn(__fmul_rn(d1, static_cast<float>(q)), m1);
}

// Q6_K: ql[128] | qh[64] | scales[16] | d.
__device__ inline float q6_k(const uint8_t* b, int e) {
  const int n = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
  const uint8_t ql = b[64 * n + l + ((quarter & 1) ? 32 : 0)];
  const int lo = (quarter & 2) ? (ql >> 4) : (ql & 0xf);
  const int hi = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
  const int sc = static_cast<int8_t>(b[192 + 8 * n + l / 16 + 2 * quarter]);
  return __fmul_rn(__fmul_rn(half_at(b + 208), static_cast<float>(sc)), static_cast<float>((lo | (hi << 4)) - 32));
}

__device__ inline float q8_0(const uint8_t* b, int e) {
  return __fmul_rn(half_at(b), static_cast<float>(static_cast<int8_t>(b[2 + e])));
}

// Doubled E2M1 values, in constant memory (a local array would spill to local memory).
__constant__ int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

__device__ inline float mxfp4(const uint8_t* b, int e) {
  const uint32_t x = b[0];
  const float scale = __uint_as_float(x < 2 ? (0x00200000u << x) : ((x - 1) << 23));
  const uint8_t q = b[1 + (e % 16)];
  return __fmul_rn(static_cast<float>(kMxfp4Values[e < 16 ? (q & 0xf) : (q >> 4)]), scale);
}


// Value e of one block of type kType.
template <quant::GgmlType kType>
__device__ __forceinline__ float block_value(const uint8_t* b, int e) {
  using quant::GgmlType;
  if constexpr (kType == GgmlType::kQ8_0) return q8_0(b, e);
  else if constexpr (kType == GgmlType::kQ2_K) return q2_k(b, e);
  else if constexpr (kType == GgmlType::kQ3_K) return q3_k(b, e);
  else if constexpr (kType == GgmlType::kQ4_K) return q45_k<false>(b, e);
  else if constexpr (kType == GgmlType::kQ5_K) return q45_k<true>(b, e);
  else if constexpr (kType == GgmlType::kQ6_K) return q6_k(b, e);
  else if constexpr (kType == GgmlType::kMXFP4) return mxfp4(b, e);
  else if constexpr (kType == GgmlType::kF16) return half_at(b + 2 * e);
  else if constexpr (kType == GgmlType::kBF16) return __uint_as_float(static_cast<uint32_t>(b[2 * e] | (b[2 * e + 1] << 8)) << 16);
  else return reinterpret_cast<const float*>(b)[e];
}

}  // namespace dsflash::kernels::cuda
