// Shared-memory stores and named barriers (any sm): what the epilogue uses to stage tiles for TMA stores.
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// bar.sync id, count: named barrier among `count` threads (a multiple of 32); id 0 is __syncthreads' barrier.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// st.shared.b32: one 32-bit store to a shared-window address.
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

}  // namespace futransformer::cuda::ptx
