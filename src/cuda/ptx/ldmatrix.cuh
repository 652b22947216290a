// ldmatrix wrappers (warp-wide, sm_75+): lanes give shared-memory row addresses (16 bytes each, 16-byte
// aligned), lane l receives row l / 4, columns 2 (l % 4) + {0, 1} of each 8x8 b16 matrix.
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// Shared-window address of a pointer into shared memory (what ldmatrix / cp.async take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 matrices, rows addressed by lanes 8j..8j+7 for matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// ldmatrix.sync.aligned.m8n8.x2.shared.b16: two 8x8 matrices, rows addressed by lanes 0..15.
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr)
               : "memory");
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: four 8x8 matrices read transposed: lane l receives rows
// 2 (l % 4) and 2 (l % 4) + 1 of column l / 4 (low and high half). Turns token-major rows into the k-major
// pairs an mma B operand wants when k runs over the rows (P·V with V stored one token per row).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

}  // namespace futransformer::cuda::ptx
