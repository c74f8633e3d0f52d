// The CUDA element-wise ops in a build without the CUDA backend.
#include "kernels/hc/hc_cuda.h"
#include "kernels/norm/norm_cuda.h"
#include "kernels/qdq/qdq_cuda.h"
#include "kernels/rope/rope_cuda.h"

namespace dsflash::kernels {

Status rms_norm_cuda(const ExecCtx&, const float*, const float*, int64_t, int64_t, float, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}

namespace hc {
Status mixes_cuda(const ExecCtx&, const float*, const float*, int, int64_t, int64_t, float, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status pre_cuda(const ExecCtx&, const float*, const float*, int, int64_t, int64_t, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status post_cuda(const ExecCtx&, const float*, const float*, const float*, const float*, int, int64_t, int64_t, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace hc

namespace qdq {
Status fp8_e8m0_32_cuda(const ExecCtx&, float*, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status fp4_e4m3_16_cuda(const ExecCtx&, float*, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status fp4_e8m0_32_cuda(const ExecCtx&, float*, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace qdq

namespace rope {
Status apply_cuda(const ExecCtx&, const float*, int, float*, int64_t, int64_t, int64_t, int64_t, bool) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace rope

}  // namespace dsflash::kernels
