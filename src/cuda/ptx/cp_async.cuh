// cp.async wrappers (sm_80+): asynchronous global -> shared copies, completed in commit-group order.
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// cp.async.cg.shared.global: 16 bytes global -> shared through L2 only (L1 bypassed); both 16-byte aligned.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}

// cp.async.cg.shared.global with a source size of 16 or 0 bytes: a zero source size fills the 16 shared bytes
// with zeros and reads nothing (rows past the end of a sequence: their bytes may be anything, NaN included).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem, const void* gmem, bool fill) {
  const uint32_t src_bytes = fill ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes) : "memory");
}

// prefetch.global.L1: pulls the line holding gmem into this SM's L1 (a hint; a later ordinary load of it hits L1).
// L1 is not coherent with other SMs' writes: only for data no kernel that may still run will write.
__device__ __forceinline__ void prefetch_l1(const void* gmem) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(gmem) : "memory");
}

// cp.async.commit_group: closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// cp.async.wait_group N: waits until at most N of this thread's groups are pending; the completed copies
// are visible to this thread (other threads need a barrier after their own wait).
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace futransformer::cuda::ptx
