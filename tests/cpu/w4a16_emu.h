// Warp-wide CPU models of the two instructions the W4A16 GEMM is built on, over the PTX fragment tables of
// tests/mma_m16n8k16_model.h: the emulation tests of every kernel variant (test_repack_int4.cpp for v2,
// test_w4a16_v4_emulation.cpp for v4) run the kernels' index maps through them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"
#include "mma_m16n8k16_model.h"

namespace futransformer::test::w4a16 {

// mma.m16n8k16 (bf16, fp32 accumulate): c[lane] += A * B with A, B gathered from the lanes' registers through the
// PTX tables; each dot product of 16 exact products is summed in fp32 and then added to the accumulator.
inline void emu_mma(float (&c)[32][4], const uint32_t (&a)[32][4], const uint32_t (&b)[32][2]) {
  using namespace test::mma;
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg) {
      for (int h = 0; h < 2; ++h) {
        const RC rc = ptx_a(lane, reg, h);
        A[rc.r][rc.c] = h ? hi_f(a[lane][reg]) : lo_f(a[lane][reg]);
      }
    }
    for (int reg = 0; reg < 2; ++reg) {
      for (int h = 0; h < 2; ++h) {
        const RC rc = ptx_b(lane, reg, h);
        B[rc.r][rc.c] = h ? hi_f(b[lane][reg]) : lo_f(b[lane][reg]);
      }
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const RC rc = ptx_c(lane, i);
      float s = 0.0f;
      for (int k = 0; k < 16; ++k) s += A[rc.r][k] * B[k][rc.c];
      c[lane][i] += s;
    }
  }
}

// ldmatrix.m8n8.b16 with `nmat` matrices: lane 8j + r gives the (element) address of row r of matrix j; lane l
// receives row l / 4, columns 2 (l % 4) + {0, 1} of matrix j in register j. Addresses outside smem fail the test.
inline void emu_ldmatrix(const std::vector<uint16_t>& smem, const int64_t (&addr)[32], int nmat,
                         uint32_t (&out)[32][4]) {
  for (int j = 0; j < nmat; ++j) {
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t base = addr[8 * j + lane / 4] + 2 * (lane % 4);
      EXPECT_GE(base, 0);
      EXPECT_LE(base + 1, static_cast<int64_t>(smem.size()) - 1);
      if (base < 0 || base + 1 >= static_cast<int64_t>(smem.size())) {
        out[lane][j] = 0xFFFFFFFFu;  // NaN pair: a wrong address also shows in the result
        continue;
      }
      out[lane][j] =
          smem[static_cast<size_t>(base)] | (static_cast<uint32_t>(smem[static_cast<size_t>(base + 1)]) << 16);
    }
  }
}

// The v4 kernels' biased_slot: lop3 (a & b) | c only; the bf16x2 {128 + u_lo, 128 + u_hi}.
inline uint32_t emu_biased(uint32_t word, int shift) {
  return ((word >> shift) & cuda::w4a16::kMagicMask) | cuda::w4a16::kMagicBias;
}

// prmt.b32 (default mode): byte i of the result is byte sel[4i .. 4i + 3] of {b, a} (selectors 0..7 only).
inline uint32_t emu_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nib = (sel >> (4 * i)) & 0xF;
    EXPECT_EQ(nib & 8u, 0u);
    d |= static_cast<uint32_t>((v >> (8 * (nib & 7))) & 0xFF) << (8 * i);
  }
  return d;
}

}  // namespace futransformer::test::w4a16
