// Tensor memory accelerator (TMA) wrappers (sm_90): bulk tensor copies between global and shared memory
// described by a CUtensorMap (built on the host with cuTensorMapEncodeTiled). Out-of-bounds box elements are
// read as zeros and never written.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: nothing from the driver library is linked)

#include <cstdint>

namespace futransformer::cuda::ptx {

// prefetch.tensormap: pulls a tensor map (here a __grid_constant__ kernel parameter) into the descriptor cache.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes: the box at coordinates
// (c0 innermost, c1) into shared memory at dst (aligned as the map's swizzle requires: 1024 B for 128 B);
// the delivered bytes count as transactions on the mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// cp.async.bulk.tensor.2d.global.shared::cta.bulk_group: the box at src to global coordinates (c0, c1),
// elements outside the tensor skipped; tracked by this thread's bulk async-groups.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int c0, int c1, uint32_t src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` contiguous bytes from global `src`
// to shared `dst` (both 16-byte aligned, bytes a multiple of 16, no tensor map); the delivered bytes count as
// transactions on the mbarrier `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// cp.async.bulk.commit_group: closes this thread's bulk copies issued since the last commit into a group.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// cp.async.bulk.wait_group.read N: waits until at most N of this thread's bulk groups still read their shared
// memory source (the buffer may then be overwritten; the global writes may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// cp.async.bulk.wait_group N: waits until at most N of this thread's bulk groups are incomplete.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// fence.proxy.async.shared::cta: makes this thread's ordinary shared-memory writes visible to the async proxy
// (TMA stores, wgmma operand reads) once a barrier orders them; needed before a TMA store of staged data.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace futransformer::cuda::ptx
