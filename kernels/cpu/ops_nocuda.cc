// The CUDA element-wise ops in a build without the CUDA backend.
#include "kernels/attn/attn_cuda.h"
#include "kernels/engram/engram_cuda.h"
#include "kernels/hc/hc_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/norm/norm_cuda.h"
#include "kernels/qdq/qdq_cuda.h"
#include "kernels/rope/rope_cuda.h"
#include "kernels/sample/sample_cuda.h"

namespace dsflash::kernels {

Status rms_norm_cuda(const ExecCtx&, const float*, const float*, int64_t, int64_t, float, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}

namespace attn {
Status sparse_attn_cuda(const ExecCtx&, const float*, int64_t, int, int64_t, const float*, int64_t, const float*,
                        const int32_t*, int64_t, const float*, float, float*, const AttnRope*, const AttnWindow*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status pool_cuda(const ExecCtx&, const float*, const float*, int64_t, int, int64_t, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status index_scores_cuda(const ExecCtx&, const float*, int64_t, int, int64_t, const float*, int64_t, const float*, float,
                         DevScalar, int, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status topk_cuda(const ExecCtx&, const float*, int64_t, int64_t, int64_t, int32_t*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status topk_visible_cuda(const ExecCtx&, const float*, int64_t, int64_t, int64_t, DevScalar, int, int32_t*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status candidate_mask_cuda(const ExecCtx&, const float*, int64_t, int64_t, DevScalar, int, int64_t, int64_t, uint8_t*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status window_index_cuda(const ExecCtx&, DevScalar, int64_t, int64_t, int32_t*, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status ring_write_cuda(const ExecCtx&, const float*, DevScalar, int64_t, int64_t, int64_t, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status kv_rows_cuda(const ExecCtx&, float*, int64_t, int64_t, const float*, float, const float*, int, DevScalar, float*,
                    int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status publish_topk_cuda(const ExecCtx&, const int32_t*, int64_t, int64_t, DevScalar, int, int64_t, int32_t*, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status mask_candidates_cuda(const ExecCtx&, float*, const uint8_t*, int64_t, int64_t, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace attn

namespace engram {
Status gate_update_cuda(const ExecCtx&, float*, const float*, const float*, int, int64_t, int64_t, float, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace engram

namespace moe {
Status route_cuda(const ExecCtx&, const float*, const float*, int64_t, int64_t, int64_t, bool, float, int32_t*, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status swiglu_cuda(const ExecCtx&, float*, const float*, int64_t, int64_t, float, const float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status combine_cuda(const ExecCtx&, const float*, const int32_t*, const float*, int64_t, int64_t, int64_t, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status combine_routed_cuda(const ExecCtx&, const float*, const int32_t*, const float*, int64_t, int64_t, int64_t,
                           float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace moe

namespace hc {
Status mixes_cuda(const ExecCtx&, const float*, const float*, int, int64_t, int64_t, float, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status split_cuda(const ExecCtx&, const float*, const float*, const float*, int, int64_t, int, float, float*, float*,
                  float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status mixes_split_cuda(const ExecCtx&, const float*, const float*, const float*, const float*, int, int64_t, int64_t,
                        float, int, float, float*, float*, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status pre_norm_cuda(const ExecCtx&, const float*, const float*, int, int64_t, int64_t, const float*, float, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status sublayer_in_cuda(const ExecCtx&, const float*, const float*, const float*, const float*, int, int64_t, int64_t,
                        float, int, float, const float*, const float*, float*, float*, float*, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status pre_cuda(const ExecCtx&, const float*, const float*, int, int64_t, int64_t, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status post_cuda(const ExecCtx&, const float*, const float*, const float*, const float*, int, int64_t, int64_t, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status post_pre_norm_cuda(const ExecCtx&, const float*, const float*, const float*, const float*, int, int64_t, int64_t,
                          const float*, const float*, float, float*, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status post_gate_pre_norm_cuda(const ExecCtx&, const float*, const float*, const float*, const float*, int, int64_t,
                               int64_t, const float*, const float*, const float*, const float*, float, float*, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
bool post_gate_pre_norm_applies(int, int64_t) { return false; }
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
Status apply_cuda(const ExecCtx&, const float*, int, float*, int64_t, int64_t, DevScalar, int64_t, bool, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace rope

namespace sample {
StatusOr<std::unique_ptr<DeviceSampler>> DeviceSampler::create(const ExecCtx&, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
}  // namespace sample

}  // namespace dsflash::kernels
