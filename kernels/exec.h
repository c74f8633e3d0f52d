// Execution context and backend selection for kernels (host-only: no CUDA types here).
// Every op takes an ExecCtx; CUDA ops run on its stream, never the default stream.
// Device memory and copies are stream-ordered on ctx's stream; without the CUDA backend they
// return FailedPrecondition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace dsflash::kernels {

enum class Backend { kCpu, kCuda };

struct ExecCtx {
  Backend backend = Backend::kCpu;
  void* cuda_stream = nullptr;  // cudaStream_t of the caller (kCuda only)
};

// A scalar argument of a device op: the value given at launch, or, when `dev` is set, the value
// in device memory when the op runs (a CUDA graph replayed at later positions reads the
// position the host wrote before the replay). `value` stays a valid hint for host-side sizing.
struct DevScalar {
  DevScalar(int64_t v = 0) : value(v) {}  // NOLINT: a plain value converts implicitly
  DevScalar(int64_t v, const int64_t* d) : value(v), dev(d) {}
  int64_t value = 0;
  const int64_t* dev = nullptr;
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
// What the device reports free and in all (cudaMemGetInfo; on GB10 the unified memory, whose
// free figure the driver estimates).
struct DeviceMemory {
  uint64_t free = 0, total = 0;
};
StatusOr<DeviceMemory> device_memory();
// Returns to the driver what the pools keep of freed memory: the stream-ordered pool's free
// blocks and the graphs' freed memory (after waiting for the device). device_alloc keeps them
// for reuse, so freeing a sequence alone gives nothing back to the rest of the system, which
// on GB10 is the host's memory.
Status release_cached_memory();

enum class Copy { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// Pageable host memory is allowed (a host source may be reused on return; a host destination
// is valid after stream_sync).
Status copy(const ExecCtx& ctx, Copy kind, void* dst, const void* src, size_t bytes);
// `rows` rows of `width` bytes, dst_pitch / src_pitch bytes apart, device to device.
Status copy_2d(const ExecCtx& ctx, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows);
Status fill_zero(const ExecCtx& ctx, void* p, size_t bytes);

// A branch beside a stream: work issued on `ctx` (a stream of its own) after fork(main, b)
// starts once everything issued on main before the fork has run; work issued on main after
// join(main, b) starts once everything issued on b before the join has run. Independent chains
// of small kernels then overlap instead of queueing; while main is captured the branch becomes
// a parallel path of the graph (it must be joined before capture_end).
struct Branch {
  ExecCtx ctx;
  void* forked = nullptr;  // cudaEvent_t, recorded on main at fork
  void* joined = nullptr;  // cudaEvent_t, recorded on the branch at join
};
StatusOr<Branch> branch_create();
void branch_destroy(Branch& b);  // waits for the branch's work first
Status fork(const ExecCtx& main, const Branch& b);
Status join(const ExecCtx& main, const Branch& b);

// Page-locked host memory (copies from it are asynchronous and may be captured in a graph).
StatusOr<void*> host_alloc_pinned(size_t bytes);
void host_free_pinned(void* p);

// CUDA graphs: the ops issued on ctx's stream between capture_begin and capture_end are
// recorded, not run (stream-ordered allocations become the graph's own); capture_end returns
// the instantiated graph (ended capture and no graph on error), graph_launch replays it on
// ctx's stream. Host synchronisation of the stream is an error while capturing.
Status capture_begin(const ExecCtx& ctx);
StatusOr<void*> capture_end(const ExecCtx& ctx);
Status graph_launch(const ExecCtx& ctx, void* graph);
void graph_destroy(void* graph);

// Kernel timing, a profiling facility: while on, every kernel launch of this process is
// bracketed by device events (slower; never while capturing a graph). kernel_times()
// synchronises the device and returns the GPU time per kernel since timing was turned on,
// longest first.
struct KernelTime {
  std::string name;
  int64_t launches = 0;
  double ms = 0;
};
void set_kernel_timing(bool on);
StatusOr<std::vector<KernelTime>> kernel_times();

// Starts (start) or ends the range an external profiler records when told to wait for it
// (`ncu --profile-from-start off`): cudaProfilerStart / cudaProfilerStop, after the device is
// synchronised so that only the work issued inside the range falls in it.
Status profiler_range(bool start);

}  // namespace dsflash::kernels
