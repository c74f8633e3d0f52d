// Execution context and backend selection for kernels (host-only: no CUDA types here).
// Every op takes an ExecCtx; CUDA ops run on its stream, never the default stream.
// Device memory and copies are stream-ordered on ctx's stream; without the CUDA backend they
// return FailedPrecondition.
#pragma once

#include <cstddef>

#include "common/status.h"

namespace dsflash::kernels {

enum class Backend { kCpu, kCuda };

struct ExecCtx {
  Backend backend = Backend::kCpu;
  void* cuda_stream = nullptr;  // cudaStream_t of the caller (kCuda only)
};

// True when this build has the CUDA backend and a usable device is present.
bool cuda_available();

// A new non-blocking stream (as a void*), and its release.
StatusOr<void*> stream_create();
void stream_destroy(void* stream);
Status stream_sync(const ExecCtx& ctx);

// Device memory from the stream-ordered pool (kept cached: no return to the driver at sync).
StatusOr<void*> device_alloc(const ExecCtx& ctx, size_t bytes);
void device_free(const ExecCtx& ctx, void* p);

enum class Copy { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// Pageable host memory is allowed (a host source may be reused on return; a host destination
// is valid after stream_sync).
Status copy(const ExecCtx& ctx, Copy kind, void* dst, const void* src, size_t bytes);
// `rows` rows of `width` bytes, dst_pitch / src_pitch bytes apart, device to device.
Status copy_2d(const ExecCtx& ctx, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows);
Status fill_zero(const ExecCtx& ctx, void* p, size_t bytes);

}  // namespace dsflash::kernels
