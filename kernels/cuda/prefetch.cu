// L2 prefetch of device memory ranges (exec.h l2_prefetch): one bulk prefetch instruction
// (sm_90's `cp.async.bulk.prefetch.L2`) per chunk of a range, a thread a chunk. The instruction
// only starts the reads, so the kernel ends long before the bytes are in L2.
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/exec.h"

namespace dsflash::kernels {
namespace {

constexpr uint64_t kChunk = 16 * 1024;  // bytes a thread asks for
constexpr int kThreads = 256;

struct PrefetchArgs {
  PrefetchRange r[kMaxPrefetchRanges];
  uint64_t first_chunk[kMaxPrefetchRanges + 1];  // range i's chunks: [first_chunk[i], first_chunk[i + 1])
  int n;
  bool evict_last;
};

// Chunks of one copy of range r (the copies: r.n with ids, else 1).
__host__ __device__ uint64_t chunks_of(const PrefetchRange& r) { return (r.bytes + kChunk - 1) / kChunk; }

__device__ __forceinline__ void prefetch_l2(const uint8_t* p, uint32_t bytes, bool evict_last) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (evict_last) {
    asm volatile(
        "{\n\t.reg .b64 pol;\n\t"
        "createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
        "cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, pol;\n\t}" ::"l"(p),
        "r"(bytes)
        : "memory");
  } else {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
  }
#else
  (void)p, (void)bytes, (void)evict_last;
#endif
}

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const __grid_constant__ PrefetchArgs a) {
  cuda::await_inputs();  // the ids may come from the kernel before
  const uint64_t c = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= a.first_chunk[a.n]) return;
  int i = 0;
  while (c >= a.first_chunk[i + 1]) ++i;
  const PrefetchRange& r = a.r[i];
  const uint64_t per_copy = chunks_of(r), k = c - a.first_chunk[i];
  const int copy = static_cast<int>(k / per_copy);
  const uint64_t offset = (k % per_copy) * kChunk;
  const int64_t shift = r.ids != nullptr ? static_cast<int64_t>(r.ids[copy]) * r.stride : 0;
  // 16-byte granules: the start rounded down, the end up (within the allocation's granularity).
  const uintptr_t start = (reinterpret_cast<uintptr_t>(r.base) + shift + offset) & ~uintptr_t{15};
  const uintptr_t end = reinterpret_cast<uintptr_t>(r.base) + shift + (offset + kChunk < r.bytes ? offset + kChunk : r.bytes);
  const uintptr_t bytes = (end - start + 15) & ~uintptr_t{15};
  prefetch_l2(reinterpret_cast<const uint8_t*>(start), static_cast<uint32_t>(bytes), a.evict_last);
}

}  // namespace

Status l2_prefetch(const ExecCtx& ctx, const PrefetchRange* ranges, int n) {
  if (n < 0 || n > kMaxPrefetchRanges) return absl::InvalidArgumentError(absl::StrCat("l2_prefetch: ", n, " ranges"));
  // DSF_L2_EVICT_LAST=1, for measurement: the prefetched lines kept before others.
  static const bool evict_last = cuda::env_int("DSF_L2_EVICT_LAST", 0) != 0;
  PrefetchArgs a{};
  a.n = 0;
  a.evict_last = evict_last;
  for (int i = 0; i < n; ++i) {
    if (ranges[i].base == nullptr || ranges[i].bytes == 0 || ranges[i].n <= 0) continue;
    a.r[a.n] = ranges[i];
    a.first_chunk[a.n + 1] = a.first_chunk[a.n] + chunks_of(ranges[i]) * static_cast<uint64_t>(ranges[i].n);
    ++a.n;
  }
  const uint64_t total = a.first_chunk[a.n];
  if (total == 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>((total + kThreads - 1) / kThreads);
  return cuda::launch(l2_prefetch_kernel,
                      cuda::LaunchParams{dim3(blocks), dim3(kThreads), 0, static_cast<cudaStream_t>(ctx.cuda_stream)}, a);
}

}  // namespace dsflash::kernels
