// Resident weights of one layer: views into the mapped GGUF for matrices, decoded fp32
// copies for the small vectors (norms, hc parameters, sinks, router bias, Engram q*k).
#pragma once

#include <functional>
#include <vector>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "kernels/linear/linear.h"

namespace dsflash::model {

struct HcWeights {
  std::vector<float> fn;     // [M][C*D]
  std::vector<float> base;   // [M]
  std::vector<float> scale;  // [3]
};

struct LayerWeights {
  HcWeights hc_attn, hc_ffn;
  std::vector<float> attn_norm, ffn_norm, attn_sinks, q_norm, kv_norm;
  kernels::Weight wq_a, wq_b, wkv, wo_a, wo_b;
  // KV sources
  kernels::Weight comp_kv, comp_gate, idx_wk;
  std::vector<float> comp_norm, idx_k_norm;
  // index sources
  kernels::Weight idx_wq_b, idx_proj;
  // MoE
  kernels::Weight gate_inp, sh_gate, sh_up, sh_down;
  std::vector<float> exp_probs_b;
  // Engram
  kernels::Weight engram_embd, engram_wkv;
  std::vector<float> engram_qk;  // q_weight * k_weight [C][D]
};

// Loads layer `l` (validated inventory assumed: config::validate_tensors).
StatusOr<LayerWeights> load_layer(const gguf::Model& m, const config::ModelConfig& c, int l);
// Reads every resident tensor (all but the routed experts and the Engram tables, which are
// fetched on demand) once, so that its pages are in memory before the first request; calls
// progress(done_bytes, total_bytes) after each chunk and stops with CANCELLED when it
// returns false.
Status warm_resident(const gguf::Model& m, const std::function<bool(uint64_t, uint64_t)>& progress);

// Decodes a whole tensor to fp32.
StatusOr<std::vector<float>> load_f32(const gguf::Model& m, const std::string& name);

}  // namespace dsflash::model
