// Hyper-connections (spec §2.3): the mixes of a sub-layer and their Sinkhorn split, the
// collapse of the streams into one sub-layer input (hc_pre) and the expansion back (hc_post).
// Layouts: streams h [C][D] (stream-major), fn [M = (2 + C) C][C*D] fp32, comb[i][j] sends
// stream i to stream j.
#pragma once

#include <cstdint>

namespace dsflash::kernels::hc {

struct Split {
  static constexpr int kMaxC = 8;
  float pre[kMaxC];
  float post[kMaxC];
  float comb[kMaxC][kMaxC];
};

// m[M] = (fn . flatten(h)) * rsqrt(mean(h^2) + norm_eps), all fp32. fn rows decoded by the caller.
void mixes(const float* h, const float* fn, int C, int64_t D, float norm_eps, float* m);
// pre / post / comb from the mixes (sigmoid, softmax, Sinkhorn with hc_eps).
Split split(const float* m, const float* scale, const float* base, int C, int iters, float hc_eps);
// y[D] = bf16(sum_c w[c] h[c][:]).
void pre(const float* h, const float* w, int C, int64_t D, float* y);
// y[C][D] = bf16(post[j] x + sum_i comb[i][j] res[i][:]).
void post(const float* x, const float* res, const Split& s, int C, int64_t D, float* y);

}  // namespace dsflash::kernels::hc
