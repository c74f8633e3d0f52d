// Device discovery, streams, memory and copies for the CUDA backend (see exec.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/exec.h"

namespace dsflash::kernels {
namespace {

// The current device and its default (stream-ordered) pool.
Status default_pool(int* dev, cudaMemPool_t* pool) {
  CUDA_RETURN_IF_ERROR(cudaGetDevice(dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(pool, *dev));
  return absl::OkStatus();
}

// The default pool returns freed memory to the driver at every synchronisation unless told
// to keep it: keep it, so per-step scratch costs no driver calls after the first step.
Status keep_pool_memory() {
  static const Status once = []() -> Status {
    int dev = 0;
    cudaMemPool_t pool;
    RETURN_IF_ERROR(default_pool(&dev, &pool));
    uint64_t keep = UINT64_MAX;
    CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return absl::OkStatus();
  }();
  return once;
}

}  // namespace

namespace cuda {

long long env_int(const char* name, long long fallback) {
  const char* e = std::getenv(name);
  return e == nullptr ? fallback : std::atoll(e);
}

bool pdl_on() {
  static const bool on = env_int("DSF_PDL", 1) != 0;
  return on;
}

int carveout() {
  static const int c = static_cast<int>(env_int("DSF_CARVEOUT", -1));
  return c;
}

namespace {

// Whether DSF_CARVEOUT_KERNELS (parts of kernel names separated by ',' or ';'; unset: every
// kernel) takes the kernel.
bool carveout_takes(const void* kernel) {
  const char* list = std::getenv("DSF_CARVEOUT_KERNELS");
  if (list == nullptr) return true;
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || mangled == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  const std::string name(mangled), all(list);
  for (size_t at = 0; at <= all.size();) {
    const size_t end = std::min(all.find_first_of(",;", at), all.size());
    if (end > at && name.find(all.substr(at, end - at)) != std::string::npos) return true;
    at = end + 1;
  }
  return false;
}

}  // namespace

void prefer_carveout(const void* kernel) {
  static std::mutex mu;
  static std::set<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert(kernel).second || !carveout_takes(kernel)) return;
  // A launch may come while a stream is captured: the attribute is no stream work, so this
  // thread may set it in relaxed capture mode.
  const RelaxedCapture relaxed;
  if (!relaxed.ok()) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout()) != cudaSuccess) {
    (void)cudaGetLastError();  // a preference only: the launch goes ahead without it
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 1;
    }
    return sms;
  }();
  return n;
}

}  // namespace cuda

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

StatusOr<void*> stream_create() {
  cudaStream_t s = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return static_cast<void*>(s);
}

void stream_destroy(void* stream) {
  if (stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

Status stream_sync(const ExecCtx& ctx) {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda::stream_of(ctx)));
  return absl::OkStatus();
}

StatusOr<void*> device_alloc(const ExecCtx& ctx, size_t bytes) {
  RETURN_IF_ERROR(keep_pool_memory());
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, cuda::stream_of(ctx));
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("device allocation of ", bytes, " bytes: ", cudaGetErrorString(e)));
  }
  return p;
}

void device_free(const ExecCtx& ctx, void* p) {
  if (p != nullptr) cudaFreeAsync(p, cuda::stream_of(ctx));
}

StatusOr<DeviceMemory> device_memory() {
  size_t free = 0, total = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
  return DeviceMemory{free, total};
}

Status release_cached_memory() {
  int dev = 0;
  cudaMemPool_t pool;
  RETURN_IF_ERROR(default_pool(&dev, &pool));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // frees issued on streams have taken effect
  CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool, 0));
  CUDA_RETURN_IF_ERROR(cudaDeviceGraphMemTrim(dev));
  return absl::OkStatus();
}

Status copy(const ExecCtx& ctx, Copy kind, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const cudaMemcpyKind k = kind == Copy::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == Copy::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                         : cudaMemcpyDeviceToDevice;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, k, cuda::stream_of(ctx)));
  return absl::OkStatus();
}

Status copy_2d(const ExecCtx& ctx, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows) {
  if (width == 0 || rows == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, cuda::stream_of(ctx)));
  return absl::OkStatus();
}

Status fill_zero(const ExecCtx& ctx, void* p, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, bytes, cuda::stream_of(ctx)));
  return absl::OkStatus();
}

StatusOr<Branch> branch_create() {
  Branch b;
  ASSIGN_OR_RETURN(b.ctx.cuda_stream, stream_create());
  b.ctx.backend = Backend::kCuda;
  for (void** e : {&b.forked, &b.joined}) {
    cudaEvent_t ev = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      branch_destroy(b);
      CUDA_RETURN_IF_ERROR(err);
    }
    *e = ev;
  }
  return b;
}

void branch_destroy(Branch& b) {
  if (b.ctx.cuda_stream != nullptr) {
    cudaStreamSynchronize(cuda::stream_of(b.ctx));
    stream_destroy(b.ctx.cuda_stream);
  }
  for (void* e : {b.forked, b.joined}) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  b = Branch{};
}

Status fork(const ExecCtx& main, const Branch& b) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(b.forked), cuda::stream_of(main)));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cuda::stream_of(b.ctx), static_cast<cudaEvent_t>(b.forked), 0));
  return absl::OkStatus();
}

Status join(const ExecCtx& main, const Branch& b) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(b.joined), cuda::stream_of(b.ctx)));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cuda::stream_of(main), static_cast<cudaEvent_t>(b.joined), 0));
  return absl::OkStatus();
}

StatusOr<void*> host_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("pinned host allocation of ", bytes, " bytes: ", cudaGetErrorString(e)));
  }
  return p;
}

void host_free_pinned(void* p) {
  if (p != nullptr) cudaFreeHost(p);
}

Status capture_begin(const ExecCtx& ctx) {
  RETURN_IF_ERROR(keep_pool_memory());
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(cuda::stream_of(ctx), cudaStreamCaptureModeThreadLocal));
  return absl::OkStatus();
}

StatusOr<void*> capture_end(const ExecCtx& ctx) {
  cudaGraph_t graph = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(cuda::stream_of(ctx), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_RETURN_IF_ERROR(e);
  return static_cast<void*>(exec);
}

Status graph_launch(const ExecCtx& ctx, void* graph) {
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), cuda::stream_of(ctx)));
  return absl::OkStatus();
}

void graph_destroy(void* graph) {
  if (graph != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

}  // namespace dsflash::kernels
