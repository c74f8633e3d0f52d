// QDQ kernels (see qdq_cuda.h): one thread per value, the block's amax by warp shuffles
// (16- or 32-lane groups), then the CPU reference's arithmetic (qdq_math.cuh).
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/qdq/qdq_cuda.h"
#include "kernels/qdq/qdq_math.cuh"

namespace dsflash::kernels::qdq {
namespace {

using namespace detail;

template <Kind K>
__global__ void qdq_kernel(float* __restrict__ v, int64_t n) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const float q = qdq_lane<K>(i < n ? v[i] : 0.0f);
  if (i < n) v[i] = q;
}

template <Kind K>
Status run(const ExecCtx& ctx, float* v, int64_t n, int block) {
  if (n % block != 0) return absl::InvalidArgumentError(absl::StrCat("qdq: ", n, " values are not whole blocks of ", block));
  if (n <= 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  return cuda::launch(qdq_kernel<K>, cuda::LaunchParams{dim3(blocks), dim3(256), 0, cuda::stream_of(ctx)},
                      v, n);
}

}  // namespace

Status fp8_e8m0_32_cuda(const ExecCtx& ctx, float* v, int64_t n) { return run<Kind::kFp8E8m0>(ctx, v, n, 32); }
Status fp4_e4m3_16_cuda(const ExecCtx& ctx, float* v, int64_t n) { return run<Kind::kFp4E4m3>(ctx, v, n, 16); }
Status fp4_e8m0_32_cuda(const ExecCtx& ctx, float* v, int64_t n) { return run<Kind::kFp4E8m0>(ctx, v, n, 32); }

}  // namespace dsflash::kernels::qdq
