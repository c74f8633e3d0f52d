// Bulk copies from global into shared memory (`cp.async.bulk`, the TMA's 1-D form, sm_90 and
// later: sm_90 and sm_121 both have it) completing on an mbarrier. One thread asks for a whole
// contiguous range (a multiple of 16 bytes, both ends 16-byte aligned) with one instruction and
// no registers held while it is in flight; the readers wait on the barrier's phase.
#pragma once

#include <cstdint>

namespace dsflash::kernels::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Sets up a barrier that completes a phase when one thread has arrived and the bytes it
// announced have landed. Call from one thread, then sync the CTA before any use.
__device__ __forceinline__ void barrier_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Copies bytes from src (global) to dst (shared) and completes the barrier's current phase when
// they have landed (the caller's arrival announces them). One thread.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
#else
  __trap();
#endif
}

// Waits until the barrier's phase of parity `parity` (0 for its first, 1 for its second, ...)
// has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace dsflash::kernels::cuda
