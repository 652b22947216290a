// mbarrier wrappers (sm_90): shared-memory barriers that complete a phase once the expected number of arrivals
// and (for TMA) of transaction bytes have come in. Addresses are shared-window addresses (see smem_addr).
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// mbarrier.init.shared::cta.b64: a barrier in phase 0 that completes each phase after `count` arrivals.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// fence.mbarrier_init.release.cluster: orders the mbarrier.init stores before later arrivals from any proxy
// (the TMA unit's complete_tx included); follow it with a CTA barrier.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// mbarrier.arrive.expect_tx.shared::cta.b64: one arrival that also raises the phase's expected transaction
// count by `bytes` (the bytes the TMA copies signalling this barrier will deliver).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// mbarrier.arrive.shared::cta.b64: one arrival (release semantics: this thread's prior accesses happen before
// the phase completes for its waiters).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64: true once the phase of the given parity has completed (waits a
// bounded, hardware-chosen time before answering false).
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Spins on mbarrier_try_wait_parity until the phase of this parity has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

}  // namespace futransformer::cuda::ptx
