// FP8 GEMM (sm_90a): every index map the kernel uses — shared-memory layout, the 128-byte swizzle that TMA
// writes and wgmma reads, the wgmma smem descriptors, the accumulator fragment, the epilogue staging layout, the
// persistent tile order and the pipeline's stage/phase walk — in one plain C++ header shared by the CUDA kernel
// (src/cuda/gemm_fp8.cuh) and the CPU emulation test (tests/cpu/test_gemm_fp8_emulation.cpp), so the two cannot
// drift apart. docs/kernels.md draws the layouts.
//
// Shapes: A [M, K] and B [N, K] are E4M3 codes, both K-major (row-major, K contiguous); D [M, N] is BF16 row-major.
// A CTA tile is kBlockM x block_n outputs; K is walked in blocks of kBlockK = 128 codes, which is exactly one
// 128-byte swizzle row, so a stage holds A as 128 rows x 128 B and B as block_n rows x 128 B.
#pragma once

#include <cstdint>

#include "cuda/host_device.h"

namespace futransformer::cuda::fp8 {

constexpr int kBlockM = 128;              // two consumer warpgroups x wgmma M = 64
constexpr int kBlockK = 128;              // codes (= bytes) of K per pipeline stage
constexpr int kWgmmaM = 64;
constexpr int kWgmmaK = 32;               // K of one wgmma.m64nNk32 (32 bytes of each operand row)
constexpr int kKSteps = kBlockK / kWgmmaK;
constexpr int kConsumerWarpgroups = kBlockM / kWgmmaM;
constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);  // warpgroup 0 produces (TMA), 1.. consume (wgmma)
constexpr int kEmptyArrivals = 4 * kConsumerWarpgroups;    // one arrival per consumer warp frees a stage
// Every consumer thread arrives on the scale slot's empty barrier after its own scale reads, so each read is
// ordered before the loader's next stores by that thread's own arrive (release) and the loader's wait (acquire),
// without relying on __syncwarp cumulativity.
constexpr int kScaleEmptyArrivals = 128 * kConsumerWarpgroups;
constexpr int kScaleLoaderWarp = 1;                         // the producer warpgroup's warp that stages scales
// setmaxnreg budgets: 128 x 40 + 256 x 232 = 64512 of the SM's 65536 registers. The producer needs only a few
// (one thread issues TMA); the consumers hold two fp32 copies of their 64 x block_n accumulator.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;

constexpr int kSwizzleBytes = 128;   // one swizzled row
constexpr int kSwizzleAtom = 1024;   // 8 rows x 128 B: the XOR pattern's period, so buffers are 1024-aligned
constexpr int kDBoxCols = 64;        // BF16 columns per TMA store box: 128 B, one swizzled row
constexpr int kDBoxBytes = kWgmmaM * kSwizzleBytes;  // 64 rows x 128 B

// The 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B for TMA, layout type 1 for wgmma): inside each 1024-byte atom
// the 16-byte chunk index (address bits 4..6) is XORed with the row index (bits 7..9). Defined on the offset from
// a 1024-aligned base, which is how both units apply it (they XOR shared-memory address bits).
FT_HD uint32_t swizzle128(uint32_t offset) { return offset ^ (((offset >> 7) & 7u) << 4); }

// --- Shared memory: [A stages | B stages | D staging | scales | mbarriers], offsets from a 1024-aligned base. ---
// The scale slot holds one tile's a_scale rows (kBlockM floats) then its b_scale columns (block_n floats),
// zeros past M / N; a producer warp fills it for the next tile while the consumers run the current main loop.
struct SmemLayout {
  uint32_t a_stage_bytes, b_stage_bytes;
  uint32_t a_offset, b_offset;  // stage 0; stage s adds s * *_stage_bytes
  uint32_t d_offset;            // consumer warpgroup w's staging starts at d_offset + w * d_wg_bytes
  uint32_t d_wg_bytes;
  uint32_t scale_offset;        // a scales at scale_offset, b scales at scale_offset + 4 kBlockM
  uint32_t bar_offset;          // full[s] at bar_offset + 8 s, empty[s] at bar_offset + 8 (stages + s), then
                                // scale_full at bar_offset + 16 stages and scale_empty 8 bytes further
  uint32_t bytes;               // from the aligned base
  uint32_t alloc_bytes;         // dynamic shared memory to request: bytes + slack to align the base
};
FT_HD constexpr SmemLayout smem_layout(int block_n, int stages) {
  SmemLayout l{};
  l.a_stage_bytes = kBlockM * kBlockK;
  l.b_stage_bytes = static_cast<uint32_t>(block_n) * kBlockK;
  l.a_offset = 0;
  l.b_offset = static_cast<uint32_t>(stages) * l.a_stage_bytes;
  l.d_offset = l.b_offset + static_cast<uint32_t>(stages) * l.b_stage_bytes;
  l.d_wg_bytes = static_cast<uint32_t>(block_n / kDBoxCols) * kDBoxBytes;
  l.scale_offset = l.d_offset + kConsumerWarpgroups * l.d_wg_bytes;
  l.bar_offset = l.scale_offset + 4u * static_cast<uint32_t>(kBlockM + block_n);
  l.bytes = l.bar_offset + 2u * static_cast<uint32_t>(stages) * 8u + 16u;
  l.alloc_bytes = l.bytes + kSwizzleAtom;  // the dynamic window is only guaranteed 16-byte aligned
  return l;
}
// Stage bytes TMA delivers per k block: full boxes, out-of-bounds rows included (they arrive as zeros).
FT_HD constexpr uint32_t stage_tx_bytes(int block_n) { return (kBlockM + static_cast<uint32_t>(block_n)) * kBlockK; }

// Where TMA puts byte c of row r of a [rows x 128 B] box loaded with the 128-byte swizzle.
FT_HD uint32_t tma_box_offset(int r, int c) { return swizzle128(static_cast<uint32_t>(r * kSwizzleBytes + c)); }

// --- wgmma shared-memory descriptors (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4,
// 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset, 62-63 swizzle (1 = 128 B).
// K-major with the 128-byte swizzle: a core matrix is 8 rows x 16 B; rows of one 8-row group are 128 B apart
// (implied by the swizzle mode) and 8-row groups are SBO = 1024 B apart. The leading byte offset (distance
// between swizzle rows along K) is not used: one wgmma reads only 32 B of K, inside one 128-byte row. It is
// encoded as 1 (16 B), the value CUTLASS derives for this layout (DeepGEMM encodes 0; the hardware ignores it).
constexpr uint32_t kDescLbo = 16;
constexpr uint32_t kDescSbo = kSwizzleAtom;
constexpr uint64_t kDescSwizzle128 = uint64_t{1} << 62;
FT_HD uint64_t make_smem_desc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(kDescLbo >> 4) << 16) |
         (static_cast<uint64_t>(kDescSbo >> 4) << 32) | kDescSwizzle128;
}
// The descriptor of smem_addr + bytes from smem_addr's: the start address sits in bits 0..13 in 16-byte units, and
// every shared-memory address is below 2^18, so adding bytes / 16 to the 64-bit descriptor never carries into the
// other fields (bytes a multiple of 16, the result still a shared-memory address). The main loops advance a stage's
// descriptors this way instead of re-deriving them per k step (tests/cpu/test_gemm_fp8_layout.cpp checks it against
// make_smem_desc for every stage and k step of the rings).
FT_HD uint64_t advance_smem_desc(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
// Start addresses handed to make_smem_desc: consumer warpgroup w's 64 rows of the A stage, and k step ks
// (32 B further along the swizzled row; the XOR acts on address bits 7..9, which a 32-byte step leaves alone, so
// the base offset field stays 0).
FT_HD uint32_t a_desc_addr(uint32_t a_stage_addr, int wg, int ks) {
  return a_stage_addr + static_cast<uint32_t>(wg * kWgmmaM * kSwizzleBytes + ks * kWgmmaK);
}
FT_HD uint32_t b_desc_addr(uint32_t b_stage_addr, int ks) { return b_stage_addr + static_cast<uint32_t>(ks * kWgmmaK); }

// --- wgmma accumulator fragment (m64nN, f32): register i of lane `lane` in warp `warp` (0..3) of the
// warpgroup. Registers come in fours per 8-column chunk: {row r, r+8} x {col c, c+1}.
FT_HD int acc_row(int warp, int lane, int i) { return warp * 16 + (lane >> 2) + 8 * ((i >> 1) & 1); }
FT_HD int acc_col(int lane, int i) { return (i >> 2) * 8 + 2 * (lane & 3) + (i & 1); }

// --- Epilogue staging: each consumer warpgroup stages its 64 x block_n BF16 outputs as block_n / 64 TMA store
// boxes of 64 rows x 128 B, 128-byte swizzled (a warp's eight rows then hit eight different bank groups).
FT_HD uint32_t d_stage_offset(int r, int c) {
  return static_cast<uint32_t>((c / kDBoxCols) * kDBoxBytes) +
         swizzle128(static_cast<uint32_t>(r * kSwizzleBytes + (c % kDBoxCols) * 2));
}

// --- Persistent tile order: CTA b takes tiles b, b + grid, b + 2 grid, ... Tiles are numbered in groups of
// group_m m-blocks (the last group may be shorter); inside a group m runs fastest. CTAs running at the same time
// hold consecutive tiles, so they share an n-block (one B tile read from DRAM, reused from L2) and the group's A
// rows (group_m x 128 x K bytes) stay in L2 while the group walks across N.
struct TileCoord {
  int m_block, n_block;
};
FT_HD TileCoord tile_coord(int tile, int m_blocks, int n_blocks, int group_m) {
  const int per_group = group_m * n_blocks;
  const int g = tile / per_group;
  const int first_m = g * group_m;
  const int rows = m_blocks - first_m < group_m ? m_blocks - first_m : group_m;
  const int in_group = tile - g * per_group;
  return TileCoord{first_m + in_group % rows, in_group / rows};
}

// --- Pipeline walk: producer and consumers visit the same (tile, k block) sequence and advance one shared
// position per k block. A consumer waits for full[stage] to complete phase `phase`; the producer waits for
// empty[stage] with parity phase ^ 1, which on the first lap refers to the phase before the barrier's first and
// so returns at once (every stage starts free).
struct PipeState {
  uint32_t stage = 0, phase = 0;
};
FT_HD void advance(PipeState& p, int stages) {
  if (++p.stage == static_cast<uint32_t>(stages)) {
    p.stage = 0;
    p.phase ^= 1u;
  }
}

}  // namespace futransformer::cuda::fp8
