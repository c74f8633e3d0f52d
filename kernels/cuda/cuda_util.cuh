// CUDA helpers shared by kernels: error mapping to Status and the single launch helper.
#pragma once

#include <cuda_runtime.h>

#include "common/status.h"
#include "kernels/exec.h"

#define CUDA_RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                          \
    const cudaError_t dsf_cuda_err_ = (expr);                                                   \
    if (dsf_cuda_err_ != cudaSuccess) {                                                         \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorName(dsf_cuda_err_), " (", \
                                              cudaGetErrorString(dsf_cuda_err_), ")"));         \
    }                                                                                           \
  } while (0)

namespace dsflash::kernels::cuda {

// The CUDA stream an ExecCtx runs on.
inline cudaStream_t stream_of(const ExecCtx& ctx) { return static_cast<cudaStream_t>(ctx.cuda_stream); }

struct LaunchParams {
  dim3 grid;
  dim3 block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  unsigned cluster_x = 1;  // CTAs a thread block cluster along x (1: no cluster; sm_90 and later)
};

// A DevScalar's value inside a kernel: read from device memory when it has an address.
__device__ __forceinline__ int64_t scalar_value(int64_t value, const int64_t* dev) {
  return dev != nullptr ? *dev : value;
}

// Programmatic dependent launch (sm_90 and later; `launch` below asks for it). A kernel may
// then start while the kernel before it on the stream is still running: everything it does
// before await_inputs() must touch only memory no earlier kernel writes (its weights), and
// every thread calls await_inputs() before it reads or writes anything else. await_inputs()
// returns once the earlier kernels have finished and their writes are visible (a no-op when the
// kernel was launched without the attribute), then lets the next kernel on the stream start
// its own prologue. Every kernel launched through `launch` calls it (pdl_sources_test checks the
// sources).
__device__ __forceinline__ void await_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// An integer from the environment variable `name` (atoll; fallback when unset): the
// measurement switches (DSF_PDL, DSF_GEMV_MMA, DSF_MMA_SLICES, DSF_GEMM_*).
long long env_int(const char* name, long long fallback);

// Whether `launch` asks for programmatic dependent launch: yes unless DSF_PDL=0 (measurement).
bool pdl_on();

// The shared-memory carve-out every kernel launched through `launch` prefers, in percent of
// the SM's unified L1 / shared memory (DSF_CARVEOUT; -1, the default: the driver's choice per
// kernel). An SM runs CTAs of one carve-out at a time, so kernels of different carve-outs
// cannot overlap there under programmatic dependent launch (measurement switch).
int carveout();
// Sets carveout() on `kernel` once (a no-op where it is -1), if its name holds one of the parts
// of DSF_CARVEOUT_KERNELS (separated by ',' or ';') where that is set (measurement).
void prefer_carveout(const void* kernel);

// This thread in relaxed stream-capture mode for its lifetime: for calls that are no stream
// work (kernel attributes, occupancy and device queries) but may first come while a stream is
// captured (a graph decode step), where the global mode would refuse them. ok() is false where
// the mode could not be changed; the caller then leaves the call out.
class RelaxedCapture {
 public:
  RelaxedCapture() : ok_(cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess) {}
  ~RelaxedCapture() {
    if (ok_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;
  bool ok() const { return ok_; }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_;
};

// The current device's SMs (asked once; 1 if the runtime cannot say).
int sm_count();

// Kernel timing (exec.h set_kernel_timing; kernel_timing.cu): events around each launch.
bool kernel_timing_on();
cudaEvent_t kernel_timing_start(cudaStream_t stream);
void kernel_timing_stop(const void* kernel, cudaStream_t stream, cudaEvent_t start);

// The launch attribute asking for thread block clusters of x CTAs along x (`launch`; occupancy
// queries of clustered kernels).
inline cudaLaunchAttribute cluster_attr(unsigned x) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = x;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// Launches `kernel` and returns the launch error as a Status.
template <typename... KArgs, typename... Args>
Status launch(void (*kernel)(KArgs...), const LaunchParams& p, Args&&... args) {
  if (p.grid.x == 0) return absl::OkStatus();
  if (carveout() >= 0) prefer_carveout(reinterpret_cast<const void*>(kernel));
  cudaEvent_t start = kernel_timing_on() ? kernel_timing_start(p.stream) : nullptr;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_on()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (p.cluster_x > 1) attr[n++] = cluster_attr(p.cluster_x);
  cudaLaunchConfig_t config{};
  config.gridDim = p.grid;
  config.blockDim = p.block;
  config.dynamicSmemBytes = p.smem;
  config.stream = p.stream;
  config.attrs = attr;
  config.numAttrs = n;
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  if (start != nullptr) kernel_timing_stop(reinterpret_cast<const void*>(kernel), p.stream, start);
  return absl::OkStatus();
}

}  // namespace dsflash::kernels::cuda
