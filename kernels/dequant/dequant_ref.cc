// Backend dispatch for dequantisation; the CPU reference is common/quant's decode_row.
#include "kernels/dequant/dequant.h"

namespace dsflash::kernels::dequant {

Status dequantize_cuda(const ExecCtx& ctx, quant::GgmlType type, const void* src, float* dst, int64_t n_elems);

Status dequantize(const ExecCtx& ctx, quant::GgmlType type, const void* src, float* dst, int64_t n_elems) {
  if (ctx.backend == Backend::kCpu) return quant::decode_row(type, src, dst, n_elems);
  return dequantize_cuda(ctx, type, src, dst, n_elems);
}

#ifndef DSF_HAVE_CUDA
Status dequantize_cuda(const ExecCtx&, quant::GgmlType, const void*, float*, int64_t) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
Status gather_rows_cuda(const ExecCtx&, quant::GgmlType, const void*, int64_t, uint64_t, int64_t, const int64_t*, int64_t,
                        bool, float*) {
  return absl::FailedPreconditionError("dsflash was built without the CUDA backend");
}
bool cuda_supports(quant::GgmlType) { return false; }
#endif

}  // namespace dsflash::kernels::dequant
