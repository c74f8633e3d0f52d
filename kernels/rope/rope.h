// Rotary embeddings on the last `dims` values of a vector, adjacent pairs (2i, 2i+1), fp32
// angles fp32(p) * f_i, results rounded to bf16 (spec §2.4). Ratio-0 layers use plain theta;
// compressed layers theta + YaRN. `inverse` rotates by the conjugate.
#pragma once

#include <cstdint>
#include <vector>

namespace dsflash::kernels::rope {

struct Table {
  int dims = 0;                // rotary dims (even)
  std::vector<float> freqs;    // dims / 2 frequencies
};

// Frequencies as the reference computes them (reciprocal of the fp32 power; YaRN blend in
// fp32 order when orig_ctx > 0).
Table make_table(int dims, float theta, int orig_ctx, float factor, float beta_fast, float beta_slow);

// Rotates v[len - dims .. len) at position p.
void apply(const Table& t, float* v, int64_t len, int64_t pos, bool inverse = false);

}  // namespace dsflash::kernels::rope
