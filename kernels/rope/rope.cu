// Rotary embedding kernel (see rope_cuda.h): one thread per rotated pair.
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/rope/rope_cuda.h"
#include "kernels/rope/rope_math.cuh"

namespace dsflash::kernels::rope {
namespace {

__global__ void rope_kernel(const float* __restrict__ freqs, int half, float* __restrict__ v, int64_t n_rows,
                            int64_t len, int64_t pos0_value, const int64_t* pos0_dev, int64_t rows_per_pos,
                            int64_t pos_stride, bool inverse) {
  cuda::await_inputs();
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n_rows * half) return;
  const int64_t row = k / half, pos0 = cuda::scalar_value(pos0_value, pos0_dev);
  const int i = static_cast<int>(k % half);
  float* tail = v + row * len + (len - 2 * half);
  detail::rotate_pair(tail, i, static_cast<float>(pos0 + (row / rows_per_pos) * pos_stride) * freqs[i], inverse);
}

}  // namespace

Status apply_cuda(const ExecCtx& ctx, const float* freqs, int dims, float* v, int64_t n_rows, int64_t len, DevScalar pos0,
                  int64_t rows_per_pos, bool inverse, int64_t pos_stride) {
  if (dims <= 0 || dims % 2 != 0 || dims > len || rows_per_pos <= 0) {
    return absl::InvalidArgumentError("rope::apply_cuda: dims must be even, positive and <= len; rows_per_pos > 0");
  }
  const int64_t pairs = n_rows * (dims / 2);
  if (pairs <= 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>((pairs + 255) / 256);
  return cuda::launch(rope_kernel, cuda::LaunchParams{dim3(blocks), dim3(256), 0, cuda::stream_of(ctx)},
                      freqs, dims / 2, v, n_rows, len, pos0.value, pos0.dev, rows_per_pos, pos_stride, inverse);
}

}  // namespace dsflash::kernels::rope
