// Linear layers on the CUDA backend (host-only header): y[t][o] = sum_i x[t][i] * W[o][i]
// with W in a GGML type read and decoded inside the kernel, fp32 accumulation, output rounded
// to bf16 or kept in fp32, exactly as kernels::linear on the CPU (up to summation order).
#pragma once

#include "kernels/exec.h"
#include "kernels/linear/linear.h"

namespace dsflash::kernels {

// w.data, x [n_tok][w.cols] and y [n_tok][w.rows] are device pointers; runs on ctx.cuda_stream.
// Unimplemented for types without a device decoder; FailedPrecondition in a build without CUDA.
Status linear_cuda(const ExecCtx& ctx, const Weight& w, const float* x, int64_t n_tok, float* y,
                   OutRound round = OutRound::kBf16);

// Weights in the tile layout (WeightLayout::kTiles16, linear/tiles.h): the same bytes as the
// GGUF rows, ordered so that the tensor-core GEMVs' loads are contiguous 16-byte runs. Every
// linear above takes such a weight (on the tensor-core kernels; Unimplemented, naming it,
// where they cannot), the 8-bit-activation GEMVs do not.
// Whether w's type and shape have a tile layout the routed experts' kernels read (and so
// linear_cuda): Q2_K or Q3_K, rows a multiple of 16, columns the tensor-core kernels hold (its
// layout and data are not looked at).
bool tile_layout_exists(const Weight& w);
// Whether this process stores w (GGUF order) so and reads such weights: tile_layout_exists,
// and neither DSF_WEIGHT_TILES=0 nor the measurement switches DSF_GEMV_MMA / DSF_GEMM_MMA
// sending products to kernels that read the GGUF order only.
bool tiles_apply(const Weight& w);
// As tiles_apply for a weight read by linear_cuda alone (the head): also Q6_K, whose tiles the
// tensor-core GEMV (one token) and GEMM (more) read; not linear_batch_cuda's or the experts'.
bool linear_tiles_apply(const Weight& w);
// w's rows (device memory, GGUF order, Q2_K, Q3_K or Q6_K, w.rows a multiple of 16) into the
// tile order at dst (device, w.rows x w.row_bytes bytes, 16-byte aligned, not overlapping w),
// on ctx's stream. The result is w with data dst and layout kTiles16.
Status to_tiles_cuda(const ExecCtx& ctx, const Weight& w, uint8_t* dst);

// One single-token product y = W x of a batch (the routed experts of a layer at decode).
struct LinearJob {
  Weight w;  // device data
  const float* x = nullptr;
  float* y = nullptr;
};

// Runs n single-token products; one launch when they share type and shape (n <= kMaxLinearBatch,
// a type with a decode GEMV), else one linear_cuda each.
constexpr int kMaxLinearBatch = 16;
Status linear_batch_cuda(const ExecCtx& ctx, const LinearJob* jobs, int n, OutRound round = OutRound::kBf16);

// y + k y_stride = W_{ids[k]} (x + k x_stride) for k < n, one token, the expert ids in device
// memory (no host round trip): expert e's rows start at w.data + e * expert_bytes (w: one
// expert's shape). Unimplemented where linear_experts_supported is false.
Status linear_experts_cuda(const ExecCtx& ctx, const Weight& w, int64_t expert_bytes, const int32_t* ids, int n,
                           const float* x, int64_t x_stride, float* y, int64_t y_stride,
                           OutRound round = OutRound::kBf16);
// Types with a decode GEMV (Q2_K, Q3_K, Q4_K, Q6_K) at an alignment it takes (x must be 16-byte
// aligned too).
bool linear_experts_supported(const Weight& w, int64_t expert_bytes);

// Activations quantised to 8 bits for the dp4a expert GEMVs (opt-in, LoadOptions::expert_act_q8):
// per run of 32 values d = max|x| / 127 and q = rint(x / d); s16 = d x the sum of q over each
// run of 16 (the K-quants' min and offset terms). Device arrays of n x cols, n x cols / 32 and
// n x cols / 16, q 16-byte aligned.
struct ActQ8 {
  int8_t* q = nullptr;
  float* d = nullptr;
  float* s16 = nullptr;
};
// x [n][x_stride] (cols used of each) into out, products packed (product k at k * cols).
Status quantize_act_q8_cuda(const ExecCtx& ctx, const float* x, int64_t cols, int n, int64_t x_stride, ActQ8 out);
// As linear_experts_cuda over 8-bit x: product k reads run k of x (one_x: run 0 for all).
// Q2_K and Q3_K (where linear_experts_q8_supported); the rest is unimplemented.
Status linear_experts_q8_cuda(const ExecCtx& ctx, const Weight& w, int64_t expert_bytes, const int32_t* ids, int n,
                              const ActQ8& x, bool one_x, float* y, int64_t y_stride,
                              OutRound round = OutRound::kBf16);
bool linear_experts_q8_supported(const Weight& w, int64_t expert_bytes);

// The Q4_K / Q6_K decode GEMVs and Q2_K / Q3_K expert GEMVs run on the integer tensor cores (x
// as four exact radix-128 digits, fp32 accuracy; linear/gemv_mma.cu); for measurement,
// DSF_GEMV_MMA=0 keeps the fp32 kernels and DSF_GEMV_MMA=1 takes the tensor cores for large
// products only (by default they take every size their shared memory holds).
// As linear_batch_cuda on the integer tensor cores whatever DSF_GEMV_MMA says: Q4_K or Q6_K,
// one token, aligned; else Unimplemented.
Status linear_batch_mma_cuda(const ExecCtx& ctx, const LinearJob* jobs, int n, OutRound round = OutRound::kBf16);

// As linear_experts_cuda on the integer tensor cores whatever DSF_GEMV_MMA says: Q2_K (4-byte
// aligned blocks) and Q3_K, n <= 16; else Unimplemented.
Status linear_experts_mma_cuda(const ExecCtx& ctx, const Weight& w, int64_t expert_bytes, const int32_t* ids, int n,
                               const float* x, int64_t x_stride, float* y, int64_t y_stride,
                               OutRound round = OutRound::kBf16);

// As linear_cuda on the prefill GEMM on the integer tensor cores whatever the token count
// (linear_cuda takes it from 4 tokens): Q4_K, Q2_K, Q3_K and Q6_K, 16-byte aligned x; else
// Unimplemented naming why.
Status linear_gemm_mma_cuda(const ExecCtx& ctx, const Weight& w, const float* x, int64_t n_tok, float* y,
                            OutRound round = OutRound::kBf16);

// Gate and up of n routed experts on one x (a decode token): y_gate + k y_stride = G_{ids[k]} x
// and y_up + k y_stride = U_{ids[k]} x, as linear_experts_cuda twice; one launch (and one digit
// split of x) where the tensor-core GEMV takes them.
Status linear_experts_gate_up_cuda(const ExecCtx& ctx, const Weight& gate, int64_t gate_bytes, const Weight& up,
                                   int64_t up_bytes, const int32_t* ids, int n, const float* x, float* y_gate, float* y_up,
                                   int64_t y_stride, OutRound round = OutRound::kBf16);

}  // namespace dsflash::kernels
