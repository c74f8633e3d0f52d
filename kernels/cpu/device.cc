// Device discovery, streams and memory when the build has no CUDA backend.
#include "kernels/exec.h"

namespace dsflash::kernels {
namespace {
Status no_cuda() { return absl::FailedPreconditionError("dsflash was built without the CUDA backend"); }
}  // namespace

bool cuda_available() { return false; }
StatusOr<void*> stream_create() { return no_cuda(); }
void stream_destroy(void*) {}
Status stream_sync(const ExecCtx&) { return no_cuda(); }
StatusOr<void*> device_alloc(const ExecCtx&, size_t) { return no_cuda(); }
void device_free(const ExecCtx&, void*) {}
StatusOr<DeviceMemory> device_memory() { return no_cuda(); }
Status release_cached_memory() { return no_cuda(); }
Status copy(const ExecCtx&, Copy, void*, const void*, size_t) { return no_cuda(); }
Status copy_2d(const ExecCtx&, void*, size_t, const void*, size_t, size_t, size_t) { return no_cuda(); }
Status fill_zero(const ExecCtx&, void*, size_t) { return no_cuda(); }
StatusOr<Branch> branch_create() { return no_cuda(); }
void branch_destroy(Branch&) {}
Status fork(const ExecCtx&, const Branch&) { return no_cuda(); }
Status join(const ExecCtx&, const Branch&) { return no_cuda(); }
StatusOr<void*> host_alloc_pinned(size_t) { return no_cuda(); }
void host_free_pinned(void*) {}
Status capture_begin(const ExecCtx&) { return no_cuda(); }
StatusOr<void*> capture_end(const ExecCtx&) { return no_cuda(); }
Status graph_launch(const ExecCtx&, void*) { return no_cuda(); }
void graph_destroy(void*) {}
void set_kernel_timing(bool) {}
StatusOr<std::vector<KernelTime>> kernel_times() { return no_cuda(); }
Status profiler_range(bool) { return no_cuda(); }

}  // namespace dsflash::kernels
