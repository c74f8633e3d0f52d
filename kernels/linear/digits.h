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

}  // namespace dsflash::kernels::digits
