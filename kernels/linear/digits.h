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

// v's digits under the block exponent e.
DSF_HD inline void split(float v, int e, int (&q)[kDigits]) {
  float r = ldexpf(v, 5 - e);
  for (int j = 0; j < kDigits; ++j) {
    const float d = rintf(r);
    r = (r - d) * 128.0f;
    q[j] = static_cast<int>(d);
  }
}

}  // namespace dsflash::kernels::digits
