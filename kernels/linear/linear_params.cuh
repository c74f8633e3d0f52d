// Shared by the linear kernels (linear.cu, gemv.cu): the parameters of one product and the
// decode GEMV entry points.
#pragma once

#include <cstdint>

#include "common/quant/quant.h"
#include "common/status.h"
#include "kernels/exec.h"
#include "kernels/linear/linear.h"

namespace dsflash::kernels {

constexpr int kWarps = 8;  // warps per CUDA block (one row each in linear.cu)
constexpr int kTok = 4;    // tokens per pass (16 measured no faster at prefill: 26.6 -> 27.4 tok/s)

struct LinearParams {
  const uint8_t* w;  // [rows][row_bytes]
  const float* x;    // [n_tok][cols]
  float* y;          // [n_tok][rows]
  int64_t rows, cols, row_bytes, n_tok;
  int block_elems, block_bytes;
  bool round_bf16;
  bool tiles;  // w in WeightLayout::kTiles16 (linear/tiles.h): only the tensor-core kernels read it
};

// The product of w with n_tok rows of x into y (x, y may be null where only the shape is asked
// about).
inline LinearParams params_of(const Weight& w, const float* x, float* y, int64_t n_tok, OutRound round) {
  const quant::TypeTraits& t = quant::traits(w.type);
  return LinearParams{w.data, x, y, w.rows, w.cols, static_cast<int64_t>(w.row_bytes), n_tok,
                      static_cast<int>(t.block_elems), static_cast<int>(t.block_bytes), round == OutRound::kBf16,
                      w.layout == WeightLayout::kTiles16};
}

// The decode GEMVs (one token, Q2_K / Q3_K / Q4_K / Q6_K, gemv.cu): whether they take these
// n products (same type and shape, aligned), and their launch (one launch for all n, n <= 16).
constexpr int kMaxGemvBatch = 16;  // == kMaxLinearBatch (linear_cuda.h)
bool decode_gemv_applies(quant::GgmlType type, const LinearParams* p, int n);
Status launch_decode_gemv(const ExecCtx& ctx, quant::GgmlType type, const LinearParams* p, int n);

// The Q4_K and Q6_K decode GEMVs on the integer tensor cores (gemv_mma.cu), for products
// decode_gemv_applies takes; launch_decode_gemv uses them where gemv_mma_applies (every size
// x's digits fit by default; DSF_GEMV_MMA, linear_cuda.h).
Status launch_dense_mma(const ExecCtx& ctx, quant::GgmlType type, const LinearParams* p, int n);
bool gemv_mma_applies(const LinearParams* p, int n);
// The routed experts' Q2_K / Q3_K GEMV on the integer tensor cores (linear_experts_cuda's
// arguments; p: expert 0's rows, product 0's x and y), where experts_mma_applies; with w2
// (x_stride 0), a second weight of p's shape over the same ids and x into y2, in one launch.
Status launch_experts_mma(const ExecCtx& ctx, quant::GgmlType type, const LinearParams& p, const int32_t* ids,
                          int64_t expert_bytes, int n, int64_t x_stride, int64_t y_stride, const uint8_t* w2 = nullptr,
                          float* y2 = nullptr, int64_t expert_bytes2 = 0);
bool experts_mma_applies(quant::GgmlType type, int64_t rows, int64_t cols, int n);
// Whether x of `cols` columns fits the tensor-core GEMVs (whole blocks that their shared memory
// holds), whatever DSF_GEMV_MMA says.
bool mma_columns_fit(int64_t cols);

// Prefill GEMMs of Q4_K, Q2_K, Q3_K and Q6_K on the integer tensor cores at fp32 accuracy
// (gemm_mma.cu): whether they take p (any number of tokens; 16-byte aligned x, the type's
// alignment of W; DSF_GEMM_MMA=0 keeps the SIMT GEMM), and the launch.
bool gemm_mma_applies(quant::GgmlType type, const LinearParams& p);
Status launch_gemm_mma(const ExecCtx& ctx, quant::GgmlType type, const LinearParams& p);

}  // namespace dsflash::kernels
