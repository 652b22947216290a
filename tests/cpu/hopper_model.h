// CPU models of the Hopper units the FP8 GEMM relies on (TMA tiled copies with the 128-byte swizzle, wgmma
// shared-memory descriptors, the wgmma accumulator fragment), written from the PTX ISA and the CUDA driver API
// documentation independently of src/cuda/gemm_fp8_layout.h. The emulation tests drive the kernel's index maps
// through these models, so a wrong map shows up as a wrong number on the CPU instead of on the GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace futransformer::test::hopper {

// A CTA's shared memory, addressed by shared-window addresses 0 .. size - 1.
struct Smem {
  std::vector<uint8_t> bytes;
  explicit Smem(uint32_t size) : bytes(size, 0xAB) {}
  uint8_t& at(uint32_t addr) {
    EXPECT_LT(addr, bytes.size()) << "shared-memory access out of the CTA's window";
    return bytes.at(addr);
  }
  uint8_t get(uint32_t addr) const { return bytes.at(addr); }
};

// CU_TENSOR_MAP_SWIZZLE_128B ("swizzle 16B chunks within 128B span"): row r of a box whose rows are 128 bytes
// lands at dst + 128 r, its 16-byte chunk q stored in chunk slot q ^ (r mod 8); dst must be 1024-aligned.
inline uint32_t tma_sw128_address(uint32_t dst, int r, int byte_in_row) {
  const int q = byte_in_row / 16;
  return dst + static_cast<uint32_t>(128 * r + 16 * (q ^ (r % 8)) + byte_in_row % 16);
}

// cp.async.bulk.tensor.2d load of a box_rows x 128-byte box from a row-major [rows, row_bytes] byte matrix at
// (row0, byte0); bytes outside the matrix arrive as zeros. Returns the bytes delivered (the complete_tx count).
inline uint32_t tma_load_sw128(Smem& s, uint32_t dst, const uint8_t* g, int64_t rows, int64_t row_bytes, int64_t row0,
                               int64_t byte0, int box_rows) {
  EXPECT_EQ(dst % 1024, 0u) << "TMA destination with the 128-byte swizzle must be 1024-aligned";
  for (int r = 0; r < box_rows; ++r) {
    for (int c = 0; c < 128; ++c) {
      const int64_t gr = row0 + r, gc = byte0 + c;
      const bool in = gr >= 0 && gr < rows && gc >= 0 && gc < row_bytes;
      s.at(tma_sw128_address(dst, r, c)) = in ? g[gr * row_bytes + gc] : 0;
    }
  }
  return static_cast<uint32_t>(box_rows) * 128;
}

// cp.async.bulk.tensor.2d store of a box_rows x 128-byte box at src to a row-major [rows, row_bytes] byte matrix
// at (row0, byte0); bytes outside the matrix are not written. writes (same shape as g) counts every byte written.
inline void tma_store_sw128(const Smem& s, uint32_t src, uint8_t* g, std::vector<int>& writes, int64_t rows,
                            int64_t row_bytes, int64_t row0, int64_t byte0, int box_rows) {
  EXPECT_EQ(src % 1024, 0u) << "TMA source with the 128-byte swizzle must be 1024-aligned";
  for (int r = 0; r < box_rows; ++r) {
    for (int c = 0; c < 128; ++c) {
      const int64_t gr = row0 + r, gc = byte0 + c;
      if (gr < 0 || gr >= rows || gc < 0 || gc >= row_bytes) continue;
      g[gr * row_bytes + gc] = s.get(tma_sw128_address(src, r, c));
      ++writes[static_cast<size_t>(gr * row_bytes + gc)];
    }
  }
}

// wgmma matrix descriptor fields (PTX ISA, "Matrix Descriptor Format").
struct Descriptor {
  uint32_t start, lbo, sbo;
  int base_offset, swizzle;  // swizzle: 0 none, 1 128 B, 2 64 B, 3 32 B
};
inline Descriptor decode_descriptor(uint64_t d) {
  return Descriptor{static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
                    static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4, static_cast<int>((d >> 49) & 7),
                    static_cast<int>(d >> 62)};
}

// Shared-memory address wgmma reads for element (i, j) of a K-major operand with the 128-byte swizzle: i is the
// M (or N) index, j the byte along K (j < 32 for one k32 step of FP8). Canonical layout: 8-row core-matrix groups
// SBO apart, rows of a group 128 bytes apart, then the swizzle XORs address bits 4..6 with bits 7..9.
inline uint32_t wgmma_sw128_kmajor_address(const Descriptor& d, int i, int j) {
  EXPECT_EQ(d.swizzle, 1) << "descriptor is not in 128-byte swizzle mode";
  EXPECT_EQ(d.base_offset, 0);
  const uint32_t a = d.start + static_cast<uint32_t>(i / 8) * d.sbo + static_cast<uint32_t>(128 * (i % 8) + j);
  return a ^ (((a >> 7) & 7u) << 4);
}

// PTX ISA figure "WGMMA .m64nNk32 register fragment layout for accumulator matrix D": warp w of the warpgroup
// owns rows 16 w .. 16 w + 15; within an 8-column chunk c = i / 4, lane l holds rows l / 4 and l / 4 + 8
// (register pairs {0, 1} and {2, 3}), columns 2 (l % 4) and 2 (l % 4) + 1.
inline int ptx_d_row(int warp, int lane, int i) { return 16 * warp + lane / 4 + ((i % 4) >= 2 ? 8 : 0); }
inline int ptx_d_col(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

}  // namespace futransformer::test::hopper
