// The Sinkhorn split of one token's hyper-connection mixes (spec §2.3, the reference's
// hc_split_sinkhorn order), one definition compiled for the CPU reference and the CUDA kernel.
#pragma once

#include <math.h>

#include "kernels/hd.h"

namespace dsflash::kernels::hc::detail {

// pre[C], post[C] and comb[C][C] (row-major, comb[i][j] sends stream i to stream j) from the
// mixes m[(2 + C) C]: sigmoid gates, a row softmax + eps, then one column normalisation and
// iters - 1 further (row, column) pairs.
DSF_HD inline void split_token(const float* m, const float* scale, const float* base, int C, int iters, float eps,
                               float* pre, float* post, float* comb) {
  for (int i = 0; i < C; ++i) {
    pre[i] = 1.0f / (1.0f + expf(-(m[i] * scale[0] + base[i]))) + eps;
    post[i] = 2.0f * (1.0f / (1.0f + expf(-(m[C + i] * scale[1] + base[C + i]))));
  }
  for (int i = 0; i < C; ++i) {
    float* row = comb + i * C;
    float mx = -INFINITY;
    for (int j = 0; j < C; ++j) {
      row[j] = m[2 * C + i * C + j] * scale[2] + base[2 * C + i * C + j];
      mx = fmaxf(mx, row[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < C; ++j) sum += (row[j] = expf(row[j] - mx));
    for (int j = 0; j < C; ++j) row[j] = row[j] / sum + eps;
  }
  const int passes = iters > 1 ? 2 * iters - 1 : 1;
  for (int it = 0; it < passes; ++it) {
    const bool columns = it % 2 == 0;  // column pass first, then row and column alternately
    for (int a = 0; a < C; ++a) {
      float sum = 0.0f;
      for (int b = 0; b < C; ++b) sum += columns ? comb[b * C + a] : comb[a * C + b];
      for (int b = 0; b < C; ++b) {
        float& v = columns ? comb[b * C + a] : comb[a * C + b];
        v = v / (sum + eps);
      }
    }
  }
}

}  // namespace dsflash::kernels::hc::detail
