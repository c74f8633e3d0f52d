// Bulk copies from global into shared memory (`cp.async.bulk`, the TMA's 1-D form: sm_90 and
// later, sm_121 too) completing on an mbarrier: one instruction a contiguous range (a multiple
// of 16 bytes, both ends 16-byte aligned), no registers held while it is in flight. One thread
// announces the bytes of a phase (barrier_expect); any threads issue the copies; readers wait on
// the phase's parity.
#pragma once

#include <cstdint>

namespace dsflash::kernels::cuda {

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A barrier whose phase completes when one thread has arrived and the bytes it announced have
// landed. Call from one thread, then sync the CTA before any other use.
__device__ __forceinline__ void barrier_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The one arrival of the current phase, announcing the bytes its copies bring (0: none; the phase
// then completes at once).
__device__ __forceinline__ void barrier_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(bytes) : "memory");
#endif
}

// Copies bytes from src (global) to dst (shared), counted against the barrier's current phase.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_addr(dst)),
               "l"(src), "r"(bytes), "r"(shared_addr(bar))
               : "memory");
#else
  __trap();
#endif
}

// Waits until the barrier's phase of parity `parity` (0 its first) has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_addr(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

}  // namespace dsflash::kernels::cuda
