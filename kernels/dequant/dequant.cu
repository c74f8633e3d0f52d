// GGML block dequantisation on the GPU: one thread per output value, grid-stride.
// Layout conventions are those of common/quant/decode.cc (spec/model-v41.md §4.3); every
// product and difference is explicitly rounded (__fmul_rn/__fsub_rn, no FMA contraction)
// in the same order as the CPU reference, so results are bit-identical to it.
// Not the decode hot path (fused GEMV kernels read blocks directly); used to materialise
// weights and as the ground truth those kernels are tested against on the device.

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/ggml_blocks.cuh"
#include "kernels/dequant/dequant.h"

namespace dsflash::kernels::dequant {
namespace {

using quant::GgmlType;
using namespace dsflash::kernels::cuda;

constexpr int kThreads = 256;

template <GgmlType kType>
__global__ void __launch_bounds__(kThreads) dequant_kernel(const uint8_t* __restrict__ src, float* __restrict__ dst,
                                                           int64_t n, int block_elems, int block_bytes) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* b = src + (i / block_elems) * block_bytes;
    const int e = static_cast<int>(i % block_elems);
    dst[i] = block_value<kType>(b, e);  // element types: one-element blocks, e = 0
  }
}

template <GgmlType kType>
Status launch_type(const ExecCtx& ctx, const void* src, float* dst, int64_t n) {
  const quant::TypeTraits& t = quant::traits(kType);
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535LL * 8);
  return cuda::launch(dequant_kernel<kType>,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                                         static_cast<cudaStream_t>(ctx.cuda_stream)},
                      static_cast<const uint8_t*>(src), dst, n, static_cast<int>(t.block_elems),
                      static_cast<int>(t.block_bytes));
}

}  // namespace

bool cuda_supports(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16: case GgmlType::kQ8_0: case GgmlType::kQ2_K:
    case GgmlType::kQ3_K: case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K: case GgmlType::kMXFP4:
      return true;
    default:
      return false;
  }
}

Status dequantize_cuda(const ExecCtx& ctx, GgmlType type, const void* src, float* dst, int64_t n) {
  const quant::TypeTraits& t = quant::traits(type);
  if (n < 0 || n % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("dequantize %s: %d is not a whole number of blocks", t.name, n));
  }
  switch (type) {
    case GgmlType::kF32: return launch_type<GgmlType::kF32>(ctx, src, dst, n);
    case GgmlType::kF16: return launch_type<GgmlType::kF16>(ctx, src, dst, n);
    case GgmlType::kBF16: return launch_type<GgmlType::kBF16>(ctx, src, dst, n);
    case GgmlType::kQ8_0: return launch_type<GgmlType::kQ8_0>(ctx, src, dst, n);
    case GgmlType::kQ2_K: return launch_type<GgmlType::kQ2_K>(ctx, src, dst, n);
    case GgmlType::kQ3_K: return launch_type<GgmlType::kQ3_K>(ctx, src, dst, n);
    case GgmlType::kQ4_K: return launch_type<GgmlType::kQ4_K>(ctx, src, dst, n);
    case GgmlType::kQ5_K: return launch_type<GgmlType::kQ5_K>(ctx, src, dst, n);
    case GgmlType::kQ6_K: return launch_type<GgmlType::kQ6_K>(ctx, src, dst, n);
    case GgmlType::kMXFP4: return launch_type<GgmlType::kMXFP4>(ctx, src, dst, n);
    default: return absl::UnimplementedError(absl::StrCat("no CUDA dequantiser for GGML type ", t.name));
  }
}

}  // namespace dsflash::kernels::dequant
