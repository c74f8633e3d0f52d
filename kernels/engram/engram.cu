// Engram kernels (see engram_cuda.h).
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/math.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/engram/engram_cuda.h"
#include "kernels/engram/gate.cuh"

namespace dsflash::kernels::engram {
namespace {

constexpr int kThreads = 256;

// grid (C, S): one stream of one token. Three row sums, the gate, then the update.
__global__ void gate_update_kernel(float* __restrict__ h, const float* __restrict__ kv, const float* __restrict__ qk,
                                   int C, int64_t D, float eps, float* __restrict__ gate) {
  cuda::await_inputs();
  __shared__ float part[kThreads / 32];
  const int c = blockIdx.x;
  const int64_t t = blockIdx.y;
  float* hc = h + (t * C + c) * D;
  const float* key = kv + (t * (C + 1) + c) * D;
  const float* value = kv + (t * (C + 1) + C) * D;
  const float* w = qk + static_cast<int64_t>(c) * D;
  float hh = 0.0f, kk = 0.0f, dot = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    hh = fmaf(hc[d], hc[d], hh);
    kk = fmaf(key[d], key[d], kk);
    dot = fmaf(__fmul_rn(hc[d], w[d]), key[d], dot);
  }
  hh = cuda::block_sum<kThreads>(hh, part);
  kk = cuda::block_sum<kThreads>(kk, part);
  dot = cuda::block_sum<kThreads>(dot, part);
  const float g = gate_of(hh, kk, dot, D, eps);
  if (gate != nullptr && threadIdx.x == 0) gate[t * C + c] = g;
  for (int64_t d = threadIdx.x; d < D; d += kThreads) hc[d] = cuda::round_bf16(__fadd_rn(hc[d], __fmul_rn(g, value[d])));
}

}  // namespace

Status gate_update_cuda(const ExecCtx& ctx, float* h, const float* kv, const float* qk, int C, int64_t D, int64_t S,
                        float norm_eps, float* gate) {
  if (C <= 0 || D <= 0 || S <= 0) return absl::OkStatus();
  return cuda::launch(gate_update_kernel,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(C), static_cast<unsigned>(S)), dim3(kThreads), 0,
                                         cuda::stream_of(ctx)},
                      h, kv, qk, C, D, norm_eps, gate);
}

}  // namespace dsflash::kernels::engram
