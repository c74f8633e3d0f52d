// Kernel timing for profiling (see exec.h set_kernel_timing): an event pair per launch,
// resolved into GPU milliseconds per kernel name when asked.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/exec.h"

namespace dsflash::kernels {
namespace {

struct Record {
  const void* kernel;
  cudaEvent_t start, stop;
};

std::atomic<bool> g_on{false};
std::mutex g_mu;
std::vector<Record> g_records;

void clear_records() {
  for (const Record& r : g_records) {
    cudaEventDestroy(r.start);
    cudaEventDestroy(r.stop);
  }
  g_records.clear();
}

// "void ns::(anonymous namespace)::name_kernel<T>(args)" -> "name_kernel<T>".
std::string short_name(const void* kernel) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  for (size_t at; (at = name.find("(anonymous namespace)::")) != std::string::npos;) name.erase(at, 23);
  // Cut the parameter list and the namespaces, outside template arguments.
  int depth = 0;
  size_t begin = 0, end = name.size();
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth != 0) continue;
    if (c == '(') {
      end = i;
      break;
    }
    if (c == ':' && i + 1 < name.size() && name[i + 1] == ':') begin = i + 2;
  }
  return name.substr(begin, end - begin);
}

}  // namespace

namespace cuda {

bool kernel_timing_on() { return g_on.load(std::memory_order_relaxed); }

cudaEvent_t kernel_timing_start(cudaStream_t stream) {
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
  cudaEventRecord(e, stream);
  return e;
}

void kernel_timing_stop(const void* kernel, cudaStream_t stream, cudaEvent_t start) {
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    cudaEventDestroy(start);
    return;
  }
  cudaEventRecord(e, stream);
  std::lock_guard<std::mutex> lock(g_mu);
  g_records.push_back({kernel, start, e});
}

}  // namespace cuda

void set_kernel_timing(bool on) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (on) {
    cudaDeviceSynchronize();
    clear_records();
  }
  g_on = on;
}

Status profiler_range(bool start) {
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  if (start) {
    CUDA_RETURN_IF_ERROR(cudaProfilerStart());
  } else {
    CUDA_RETURN_IF_ERROR(cudaProfilerStop());
  }
  return absl::OkStatus();
}

StatusOr<std::vector<KernelTime>> kernel_times() {
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::lock_guard<std::mutex> lock(g_mu);
  std::map<const void*, KernelTime> by_kernel;
  for (const Record& r : g_records) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.stop));
    KernelTime& k = by_kernel[r.kernel];
    ++k.launches;
    k.ms += ms;
  }
  std::map<std::string, KernelTime> by_name;
  for (auto& [kernel, k] : by_kernel) {
    KernelTime& n = by_name[short_name(kernel)];
    n.launches += k.launches;
    n.ms += k.ms;
  }
  std::vector<KernelTime> out;
  for (auto& [name, k] : by_name) out.push_back({name, k.launches, k.ms});
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace dsflash::kernels
