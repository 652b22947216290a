// Tensor-core MMA wrappers (warp-wide, sm_80+). Fragment layouts: src/cuda/gemm_w4a16_layout.h.
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d += A(16x16 bf16) * B(16x8 bf16), fp32 accumulators.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same mma when only rows 0..7 of A can be non-zero (a1 = a3 = 0): d[0..1] += row g of A * B. Rows 8..15
// of the product are zero, so they are neither accumulated nor kept: their registers are free for the caller
// (decode attention, whose A has at most 8 rows: the query heads of one KV head).
__device__ __forceinline__ void mma_m16n8k16_bf16_rows8(float (&d)[2], uint32_t a0, uint32_t a2,
                                                        const uint32_t (&b)[2]) {
  asm("{\n"
      ".reg .f32 lower2, lower3;\n"
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, lower2, lower3}, {%2, %5, %3, %5}, {%4, %6}, "
      "{%0, %1, %7, %7};\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1])
      : "r"(a0), "r"(a2), "r"(b[0]), "r"(0u), "r"(b[1]), "f"(0.0f));
}

// The same mma with C = 0: d = A * B (the INT4 decode attention's per-group partial scores).
__device__ __forceinline__ void mma_m16n8k16_bf16_zero_c(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
}

// movmatrix.sync.aligned.m8n8.trans.b16: an 8 x 8 matrix of 16-bit elements held one row fragment per lane (lane l:
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 in the low and high half) comes back transposed in the same layout.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

}  // namespace futransformer::cuda::ptx
