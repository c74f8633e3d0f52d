// GGML block dequantisation on the GPU: one thread per output value, grid-stride.
// Layout conventions are those of common/quant/decode.cc (spec/model-v41.md §4.3); every
// product and difference is explicitly rounded (__fmul_rn/__fsub_rn, no FMA contraction)
// in the same order as the CPU reference, so results are bit-identical to it.
// Not the decode hot path (fused GEMV kernels read blocks directly); used to materialise
// weights and as the ground truth those kernels are tested against on the device.

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/ggml_blocks.cuh"
#include "kernels/cuda/math.cuh"
#include "kernels/dequant/dequant.h"

namespace dsflash::kernels::dequant {
namespace {

using quant::GgmlType;
using namespace dsflash::kernels::cuda;

constexpr int kThreads = 256;

template <GgmlType kType>
__global__ void __launch_bounds__(kThreads) dequant_kernel(const uint8_t* __restrict__ src, float* __restrict__ dst,
                                                           int64_t n, int block_elems, int block_bytes) {
  cuda::await_inputs();
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
                                         cuda::stream_of(ctx)},
                      static_cast<const uint8_t*>(src), dst, n, static_cast<int>(t.block_elems),
                      static_cast<int>(t.block_bytes));
}

template <GgmlType kType>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const uint8_t* __restrict__ table, int64_t cols, uint64_t row_bytes, int64_t n_rows,
                  const int64_t* __restrict__ ids, int64_t n, int block_elems, int block_bytes, bool round,
                  float* __restrict__ dst) {
  cuda::await_inputs();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t id = ids[i / cols], e = i % cols;
  if (id < 0 || id >= n_rows) {
    dst[i] = __int_as_float(0x7fc00000);
    return;
  }
  const float v = block_value<kType>(table + id * row_bytes + (e / block_elems) * block_bytes,
                                     static_cast<int>(e % block_elems));
  dst[i] = round ? round_bf16(v) : v;
}

template <GgmlType kType>
Status gather_type(const ExecCtx& ctx, const void* table, int64_t cols, uint64_t row_bytes, int64_t n_rows,
                   const int64_t* ids, int64_t n_ids, bool round, float* dst) {
  const quant::TypeTraits& t = quant::traits(kType);
  const int64_t n = n_ids * cols;
  return cuda::launch(gather_kernel<kType>,
                      cuda::LaunchParams{dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)), dim3(kThreads), 0,
                                         cuda::stream_of(ctx)},
                      static_cast<const uint8_t*>(table), cols, row_bytes, n_rows, ids, n,
                      static_cast<int>(t.block_elems), static_cast<int>(t.block_bytes), round, dst);
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

Status gather_rows_cuda(const ExecCtx& ctx, GgmlType type, const void* table, int64_t cols, uint64_t row_bytes,
                        int64_t n_rows, const int64_t* ids, int64_t n_ids, bool round_bf16, float* dst) {
  const quant::TypeTraits& t = quant::traits(type);
  if (n_ids <= 0 || cols <= 0) return absl::OkStatus();
  if (cols % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("gather %s rows: %d columns is not whole blocks", t.name, cols));
  }
  switch (type) {
    case GgmlType::kF32: return gather_type<GgmlType::kF32>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kF16: return gather_type<GgmlType::kF16>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kBF16: return gather_type<GgmlType::kBF16>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kQ8_0: return gather_type<GgmlType::kQ8_0>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kQ2_K: return gather_type<GgmlType::kQ2_K>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kQ3_K: return gather_type<GgmlType::kQ3_K>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kQ4_K: return gather_type<GgmlType::kQ4_K>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kQ5_K: return gather_type<GgmlType::kQ5_K>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kQ6_K: return gather_type<GgmlType::kQ6_K>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    case GgmlType::kMXFP4: return gather_type<GgmlType::kMXFP4>(ctx, table, cols, row_bytes, n_rows, ids, n_ids, round_bf16, dst);
    default: return absl::UnimplementedError(absl::StrCat("no CUDA row decoder for GGML type ", t.name));
  }
}

}  // namespace dsflash::kernels::dequant
