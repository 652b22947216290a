// Warp-wide CPU models of the two instructions the W4A16 GEMM is built on, over the PTX fragment tables of
// tests/mma_m16n8k16_model.h: the emulation tests of every kernel variant (test_repack_int4.cpp for v2,
// test_w4a16_v4_emulation.cpp for v4) run the kernels' index maps through them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

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

}  // namespace futransformer::test::w4a16
