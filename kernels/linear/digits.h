// The split of a GEMV input into exact integer digits for the tensor-core decode GEMVs
// (gemv_mma.cu), one definition compiled for the CUDA kernel and the CPU test
// (tests/kernels/digits_test.cc).
//
// Per block of 256 values with largest magnitude amax (finite): S = 2^(e - 5), e = ilogb(amax),
// so amax / S lies in [32, 64); each value v gives four signed radix-128 digits with
//   v = S (q0 + q1 / 128 + q2 / 128^2 + q3 / 128^3) + err,  |q| <= 64,  |err| <= S 2^-22,
// every step exact in fp32 (a power-of-two scaling, an integer's subtraction, a multiplication
// by 128). err is zero for |v| >= 2^(e - 3), so for |v| >= amax / 8 (its 24 bits end at or above
// S 2^-21), and at most amax 2^-27 for any v.
#pragma once

#include <math.h>

#include "kernels/hd.h"

namespace dsflash::kernels::digits {

constexpr int kDigits = 4;

// e of a block's scale S = 2^(e - 5) (amax finite and >= 0; 0 for an all-zero block).
DSF_HD inline int scale_exponent(float amax) { return amax > 0.0f ? ilogbf(amax) : 0; }

// v's digits under the block exponent e: N = rint(v / S 128^3) (|N| <= 2^27, exact in fp32
// and int32), then balanced radix-128 digits of N from the last (q3, q2, q1 in [-64, 63], q0 =
// what is left, |q0| <= 64). One rounding conversion a value; the digits are integer masks and
// shifts. (The same N as rounding v / S to the nearest 128^-3 digit by digit: the last digit's
// rounding sees the same value and parity.)
DSF_HD inline void split(float v, int e, int (&q)[kDigits]) {
  int n = static_cast<int>(rintf(ldexpf(v, 26 - e)));
  for (int j = kDigits - 1; j > 0; --j) {
    q[j] = ((n + 64) & 127) - 64;
    n = (n - q[j]) >> 7;
  }
  q[0] = n;
}

// The same digits of four values at once, as the CUDA kernel packs them (byte i of word j is
// value i's digit j, two's complement). n + kBias holds q3, q2, q1 as 7-bit fields offset by 64
// (at bits 0, 7, 14) and q0 above them: the balanced digits above are exactly those fields,
// found without the digit-by-digit subtractions.
constexpr int kBias = 64 + 64 * 128 + 64 * 128 * 128;

// v / S 128^3 = v 2^(26 - e) as two exact power-of-two products m1 m2 (2^(26 - e) overflows a
// float for e < -101, where v is so small that v 2^127 is still exact).
struct Scale {
  float m1, m2;
};
DSF_HD inline Scale scale_of(int e) {
  const int k = 26 - e, k1 = k < 127 ? k : 127;
  return Scale{ldexpf(1.0f, k1), ldexpf(1.0f, k - k1)};
}

// n + kBias for v (n as in split: the same rounding of the same product).
DSF_HD inline int biased(float v, Scale s) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v * s.m1 * s.m2) + kBias;
#else
  return static_cast<int>(rintf(v * s.m1 * s.m2)) + kBias;
#endif
}

// Digit j of four values from their biased n.
DSF_HD inline unsigned pack_digit(const int (&nb)[4], int j) {
  unsigned w = 0;
  if (j == 0) {
    for (int i = 0; i < 4; ++i) w |= (static_cast<unsigned>(nb[i] >> 21) & 0xffu) << (8 * i);
    return w;
  }
  const int shift = 7 * (kDigits - 1 - j);
  for (int i = 0; i < 4; ++i) w |= (static_cast<unsigned>(nb[i] >> shift) & 0x7fu) << (8 * i);
  // Each byte f in [0, 128) to f - 64 as a signed byte: bit 6 flipped, bit 7 = not bit 6.
  return (w ^ 0x40404040u) | ((~w & 0x40404040u) << 1);
}

// The sum of a word's four signed bytes.
DSF_HD inline int sum_bytes(unsigned w) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(w), 0x01010101, 0);
#else
  int s = 0;
  for (int i = 0; i < 4; ++i) s += static_cast<signed char>(static_cast<unsigned char>(w >> (8 * i)));
  return s;
#endif
}

}  // namespace dsflash::kernels::digits
