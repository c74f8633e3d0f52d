// Synthetic DeepSeek-V4.1 GGUF files in Family-A naming: seeded weights with realistic
// magnitudes, a real byte-level BPE vocabulary trained on text in the repository, Engram
// constants built the way the official code builds them (token map from the tokenizer,
// consecutive primes, odd in-range multipliers). Presets: `tiny` (a few MB, for the demo and
// tests), `mid` (~0.8 GB, CPU benchmarks) and `perf` (the released dimensions, fewer routed
// experts, Q2_K-rung types).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/status.h"

namespace dsflash::tools {

struct SynthOptions {
  std::string preset = "tiny";   // tiny | mid | perf
  uint64_t seed = 1;
  uint32_t n_expert = 0;         // 0: the preset's default (tiny 8, perf 16)
  // Skewed expert popularity: each layer's routing bias exp_probs_b is -skew * ln(1 + rank)
  // over a random order of its experts (a Zipf-like preference, as trained routers show);
  // 0: a small random bias (nearly even popularity).
  float routing_skew = 0;
  // Routed experts written fast: each expert tensor draws and encodes the rows of two experts
  // and fills the rest with copies of them picked by row (same magnitudes, the same bytes per
  // expert to stream; an order of magnitude faster for the perf preset). For benchmarks.
  bool pooled_experts = false;
  uint32_t threads = 0;          // 0: hardware concurrency
};

// A model ready to be written: the writer holds every key and a lazy fill per tensor.
struct SynthPlan {
  std::unique_ptr<gguf::Writer> writer;
  uint64_t total_bytes = 0;
  size_t n_tensors = 0;
};

// Builds the plan (metadata, tokenizer, tensor list) without generating any weight.
StatusOr<SynthPlan> plan_synthetic_model(const SynthOptions& options);

// Plans and writes the model to `path` (one file) or, with n_shards > 1, to the split set
// `<path without .gguf>-0000k-of-0000n.gguf`. Returns the paths written.
StatusOr<std::vector<std::string>> write_synthetic_model(const SynthOptions& options, const std::string& path,
                                                         uint32_t n_shards,
                                                         std::function<void(uint64_t, uint64_t)> progress = {});

// The BPE training corpus shipped with the tool (tools/dsflash/data/bpe_corpus.txt).
std::string_view bpe_corpus();

}  // namespace dsflash::tools
