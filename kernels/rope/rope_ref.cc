#include <algorithm>
#include <cmath>

#include "common/quant/numeric.h"
#include "kernels/rope/rope.h"

namespace dsflash::kernels::rope {

Table make_table(int dims, float theta, int orig_ctx, float factor, float beta_fast, float beta_slow) {
  Table t;
  t.dims = dims;
  t.freqs.resize(dims / 2);
  for (int i = 0; i < dims / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dims);
    t.freqs[i] = 1.0f / std::pow(theta, e);
  }
  if (orig_ctx > 0) {
    auto corr = [&](double rotations) {
      return dims * std::log(orig_ctx / (rotations * 2 * M_PI)) / (2 * std::log(static_cast<double>(theta)));
    };
    const int lo = std::max(static_cast<int>(std::floor(corr(beta_fast))), 0);
    const int hi = std::min(static_cast<int>(std::ceil(corr(beta_slow))), dims - 1);
    const float span = std::max(static_cast<float>(hi - lo), 0.001f);
    for (int i = 0; i < dims / 2; ++i) {
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(lo)) / span, 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      const float f = t.freqs[i];
      t.freqs[i] = f / factor * (1.0f - smooth) + f * smooth;
    }
  }
  return t;
}

void apply(const Table& t, float* v, int64_t len, int64_t pos, bool inverse) {
  float* tail = v + (len - t.dims);
  for (int i = 0; i < t.dims / 2; ++i) {
    const float a = static_cast<float>(pos) * t.freqs[i];
    const float c = std::cos(a);
    const float s = inverse ? -std::sin(a) : std::sin(a);
    const float re = tail[2 * i], im = tail[2 * i + 1];
    tail[2 * i] = quant::round_bf16(re * c - im * s);
    tail[2 * i + 1] = quant::round_bf16(re * s + im * c);
  }
}

}  // namespace dsflash::kernels::rope
