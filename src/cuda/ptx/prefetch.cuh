// prefetch wrappers: hints that bring a global line into a cache level without a register result.
#pragma once

namespace futransformer::cuda::ptx {

// prefetch.global.L2: starts moving the 128-byte line holding `gmem` into L2; no data returns and no fault is raised
// for an address the thread may read. Legal on any global address; it never changes a result.
__device__ __forceinline__ void prefetch_global_l2(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem));
}

}  // namespace futransformer::cuda::ptx
