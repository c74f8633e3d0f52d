// The CUDA linears (linear_cuda.h) in a build without the CUDA backend.
#include "kernels/linear/linear_cuda.h"

namespace dsflash::kernels {

Status linear_cuda(const ExecCtx&, const Weight&, const float*, int64_t, float*, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}

Status linear_batch_cuda(const ExecCtx&, const LinearJob*, int, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}

Status linear_experts_cuda(const ExecCtx&, const Weight&, int64_t, const int32_t*, int, const float*, int64_t, float*,
                           int64_t, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
bool linear_experts_supported(const Weight&, int64_t) { return false; }

Status quantize_act_q8_cuda(const ExecCtx&, const float*, int64_t, int, int64_t, ActQ8) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status linear_experts_q8_cuda(const ExecCtx&, const Weight&, int64_t, const int32_t*, int, const ActQ8&, bool, float*,
                              int64_t, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
bool linear_experts_q8_supported(const Weight&, int64_t) { return false; }
Status linear_experts_mma_cuda(const ExecCtx&, const Weight&, int64_t, const int32_t*, int, const float*, int64_t, float*,
                               int64_t, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status linear_experts_gate_up_cuda(const ExecCtx&, const Weight&, int64_t, const Weight&, int64_t, const int32_t*, int,
                                   const float*, float*, float*, int64_t, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status linear_batch_mma_cuda(const ExecCtx&, const LinearJob*, int, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status linear_gemm_mma_cuda(const ExecCtx&, const Weight&, const float*, int64_t, float*, OutRound) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
bool tile_layout_exists(const Weight&) { return false; }
bool tiles_apply(const Weight&) { return false; }
bool linear_tiles_apply(const Weight&) { return false; }
Status to_tiles_cuda(const ExecCtx&, const Weight&, uint8_t*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}

}  // namespace dsflash::kernels
