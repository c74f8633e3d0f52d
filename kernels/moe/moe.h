// MoE routing and the clamped SwiGLU (spec §2.9).
#pragma once

#include <cstdint>
#include <vector>

namespace dsflash::kernels::moe {

struct Route {
  std::vector<int32_t> experts;  // top-k by score + bias, descending (ties: lower index)
  std::vector<float> weights;    // sqrt-softplus scores, normalised (+1e-20), x route_scale
};

// logits [E] fp32 (x . W_g, gate_temp 1) -> route.
Route route(const float* logits, const float* bias, int64_t E, int64_t k, bool norm_topk, float route_scale);

// a = w1 x, b = w3 x (bf16 values), in place into `a`: bf16(weight * (silu(min(a, lim)) * clamp(b, ±lim))).
void swiglu(float* a, const float* b, int64_t n, float limit, float weight);

}  // namespace dsflash::kernels::moe
