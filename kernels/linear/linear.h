// Linear layers over GGUF weights: y[t][o] = sum_i x[t][i] * W[o][i], weights in any type
// with a decoder (decoded row by row on the fly), fp32 accumulation, output either rounded
// to bf16 (every bf16 Linear of the reference) or kept in fp32 (router, ratio-2 compressor,
// head). Activations are float arrays holding bf16 values. Multithreaded over output rows.
#pragma once

#include <cstdint>

#include "common/gguf/gguf.h"
#include "common/quant/quant.h"
#include "common/status.h"

namespace dsflash::kernels {

// How a weight's bytes are ordered: as the GGUF file's rows, or (on the device only, Q2_K and
// Q3_K, rows a multiple of 16) in the tiles of linear/tiles.h that the tensor-core GEMVs read.
enum class WeightLayout : uint8_t { kGguf, kTiles16 };

// A 2-D view of weight rows: `rows` rows of `cols` values each (ggml ne[0] = cols).
struct Weight {
  quant::GgmlType type = quant::GgmlType::kF32;
  int64_t cols = 0;
  int64_t rows = 0;
  const uint8_t* data = nullptr;  // rows * row_bytes bytes
  uint64_t row_bytes = 0;
  WeightLayout layout = WeightLayout::kGguf;

  // Rows [first, first + n) as their own Weight (expert slices, grouped projections); for
  // kTiles16, whole tiles (first and n multiples of 16).
  Weight slice_rows(int64_t first, int64_t n) const;
  bool valid() const { return data != nullptr; }
};

// A view over a mapped tensor; rows = n_elems / ne[0].
StatusOr<Weight> weight_view(const gguf::Model& model, const gguf::TensorInfo& t);

enum class OutRound { kBf16, kF32 };

// x: [n_tok, w.cols]; y: [n_tok, w.rows].
void linear(const Weight& w, const float* x, int64_t n_tok, float* y, OutRound round = OutRound::kBf16);

// Decodes row r of w into out[w.cols].
void decode_weight_row(const Weight& w, int64_t r, float* out);

}  // namespace dsflash::kernels
