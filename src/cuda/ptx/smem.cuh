// Shared-memory loads/stores and named barriers (any sm): the epilogue's scale reads and its staging for TMA stores.
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

// st.shared.f32: one fp32 store to a shared-window address.
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// ld.shared.f32: one fp32 load from a shared-window address.
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// ld.shared.v2.f32: two consecutive fp32 values from an 8-byte aligned shared-window address.
__device__ __forceinline__ float2 ld_shared_v2_f32(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// ld.shared.v2.b32: 8 bytes from an 8-byte aligned shared-memory address.
__device__ __forceinline__ uint2 ld_shared_v2_b32(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}

// ld.shared.v4.b32: 16 bytes from a 16-byte aligned shared-memory address.
__device__ __forceinline__ uint4 ld_shared_v4_b32(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

}  // namespace futransformer::cuda::ptx
