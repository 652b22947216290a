// The W4A16 warpgroup path's staged activations (gemm_w4a16_layout.h, "Warpgroup path") against the wgmma hardware's
// reading of a K-major, 128-byte-swizzled B operand (PTX ISA "Matrix Descriptor Format", "Shared Memory Matrix
// Layout"): for every k16 step of a slice, token n and k index kk, the address the descriptor at wg_b_desc_offset
// makes the tensor core read is where wg_x_offset staged that element; and the staged bytes fit wg_a_bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_w4a16_layout.h"

namespace {

namespace w4 = futransformer::cuda::w4a16;
namespace fp8 = futransformer::cuda::fp8;

// Byte the tensor core reads for element (n, kk) of a k16 step whose descriptor starts at byte `start` of a
// 1024-byte-aligned region: 8-row groups SBO apart, rows 128 B apart, 2 bytes per k, then the 128-byte swizzle on
// the address (bits 4..6 XOR bits 7..9).
int64_t hardware_b_offset(int64_t start, int n, int kk) {
  const int64_t linear = start + (n / 8) * int64_t{fp8::kDescSbo} + (n % 8) * 128 + kk * 2;
  return linear ^ (((linear >> 7) & 7) << 4);
}

TEST(GemmW4A16WgLayout, DescriptorReadsWhatTheStagingWrote) {
  for (int rows : {1, 7, 8, 9, 16, 17, 24, 25, 32}) {
    const int n_tokens = w4::wg_tokens(rows);
    ASSERT_EQ(n_tokens % 8, 0);
    ASSERT_GE(n_tokens, rows);
    ASSERT_LT(n_tokens - rows, 8);
    for (int slice_cols : {32, 64, 96, 448, 4096}) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " slice columns " << slice_cols);
      const int64_t bytes = w4::wg_a_bytes(slice_cols, rows);
      std::set<int64_t> staged;
      for (int r = 0; r < n_tokens; ++r) {
        for (int c8 = 0; c8 < slice_cols / 8; ++c8) {
          const int64_t off = w4::wg_x_offset(r, c8, n_tokens);
          ASSERT_EQ(off % 16, 0);
          ASSERT_GE(off, 0);
          ASSERT_LE(off + 16, bytes);
          ASSERT_TRUE(staged.insert(off).second) << "two chunks staged at byte " << off;
        }
      }
      for (int k = 0; k < slice_cols; k += 16) {
        const int64_t start = w4::wg_b_desc_offset(k, n_tokens);
        ASSERT_EQ(start % 16, 0);
        for (int n = 0; n < n_tokens; ++n) {
          for (int kk = 0; kk < 16; ++kk) {
            const int col = k + kk;
            const int64_t want = w4::wg_x_offset(n, col / 8, n_tokens) + (col % 8) * 2;
            ASSERT_EQ(hardware_b_offset(start, n, kk), want) << "k " << k << " n " << n << " kk " << kk;
          }
        }
      }
    }
  }
}

// The descriptor of a k step is the base descriptor advanced by wg_b_desc_offset's bytes (the kernel's
// advance_smem_desc), equal to encoding that address afresh, for every k16 step of the longest slices.
TEST(GemmW4A16WgLayout, AdvancedDescriptorsEqualFreshOnes) {
  const uint32_t base = 0x2400;  // a 1024-aligned shared-memory address
  for (int rows : {8, 32}) {
    const int n_tokens = w4::wg_tokens(rows);
    const uint64_t d0 = fp8::make_smem_desc(base);
    for (int k = 0; k < 14336 / 8; k += 16) {
      const uint32_t off = static_cast<uint32_t>(w4::wg_b_desc_offset(k, n_tokens));
      ASSERT_EQ(fp8::advance_smem_desc(d0, off), fp8::make_smem_desc(base + off)) << "k " << k;
    }
  }
}

}  // namespace
