// INT4 → BF16 dequantisation of a W4A16 weight in its packed MMA layout (src/cuda/gemm_w4a16_layout.h): the tile
// geometry and every index map of the kernel (src/cuda/int4_dequant.cuh), in plain C++ so the CPU emulation test
// (tests/cpu/test_int4_dequant_layout.cpp) replays exactly what the kernel computes.
//
// A CTA owns one 32-row n block and kTileBlocks consecutive 32-column k blocks (a 32 × 256 tile of the output). Warp
// w reads k block kt · kTileBlocks + w with one 16-byte load per lane (a warp reads the block's 512 contiguous
// bytes), dequantises the lane's 32 nibbles and writes them as 16 bf16x2 pairs into a staged [32][256] BF16 tile;
// after a barrier every thread copies 16-byte chunks of tile rows to the output, so a warp writes 512 contiguous
// bytes of one output row. The staging turns the MMA fragment order (a lane holds 2 adjacent columns of 4 rows per
// slot) into row-major 16-byte stores.
#pragma once

#include <cstdint>

#include "cuda/gemm_w4a16_layout.h"

namespace futransformer::cuda::int4_dequant {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * w4a16::kWarpSize;
constexpr int kTileBlocks = kWarps;                               // k blocks per CTA: one per warp
constexpr int kTileRows = w4a16::kBlockN;                         // 32 output rows
constexpr int kTileCols = kTileBlocks * w4a16::kBlockK;           // 256 output columns
constexpr int kChunkElems = 8;                                    // BF16 values per 16-byte store
constexpr int kChunksPerRow = kTileCols / kChunkElems;            // 32: one warp writes a whole tile row
constexpr int kTileChunks = kTileRows * kChunksPerRow;
// Staged row pitch in 32-bit words (bf16 pairs): 128 words of data + 4 of padding. One staging store instruction
// writes rows g = 0..7 (+ 8·tile) at word t = 0..3 (+ a constant): with a pitch ≡ 4 (mod 32) row g starts 4g banks
// further, so the 32 lanes hit 32 distinct banks; 4 words keep every row start 16-byte aligned for the chunk reads.
constexpr int kPitchWords = kTileCols / 2 + 4;
constexpr int kStageWords = kTileRows * kPitchWords;
static_assert(kPitchWords % 32 == 4, "pitch must put the 8 rows of one staging store 4 banks apart");
static_assert(kPitchWords % 4 == 0, "staged rows must start 16-byte aligned");
static_assert(kChunksPerRow == w4a16::kWarpSize, "one warp writes one tile row per store instruction");
static_assert(kTileChunks % kThreads == 0, "every thread copies the same number of chunks");

// Staged word (bf16 pair: columns k, k + 1 of one row, the lower column in the low half) that slot p of word w of
// lane in the block of warp `warp` fills: the pair is nibble_coords(lane, w, p, 0 / 1), i.e. columns k and k + 1.
FT_HD int stage_word(int warp, int lane, int w, int p) {
  const w4a16::NK c = w4a16::nibble_coords(lane, w, p, 0);
  return c.n * kPitchWords + (warp * w4a16::kBlockK + c.k) / 2;
}

// The n8 tile (0..3) of slot p of word w (nibble_coords: tile = 2 np + (p >> 1), np = w & 1): the lane applies the
// scale of tile row 8 · tile + lane / 4. A function of the unrolled loop indices only, so the kernel's four scales
// stay in registers.
FT_HD int slot_tile(int w, int p) { return (w & 1) * 2 + (p >> 1); }

// Index in the packed scales (repack_int4_scales_for_mma) of row r (0..31) of n block nb for group g.
FT_HD int64_t scale_index(int64_t nb, int64_t g, int64_t groups, int r) {
  // scale_column(t, tile, half) = 8 tile + 2t + half is a bijection onto 0..31.
  return w4a16::packed_scale_index(nb, g, groups, (r & 7) >> 1, r >> 3, r & 1);
}

// Chunk c (0 .. kTileChunks − 1) of the copy-out: tile row and first tile column.
FT_HD int chunk_row(int c) { return c / kChunksPerRow; }
FT_HD int chunk_col(int c) { return (c % kChunksPerRow) * kChunkElems; }

// Output row of packed row n: n itself, or with `to_canonical` (a gate|up weight packed SwiGLU-interleaved, wanted in
// its original [gate | up] row order) the canonical row whose values the packing put there.
FT_HD int64_t output_row(int64_t n, int64_t N, bool to_canonical) {
  return to_canonical ? w4a16::swiglu_source_row(n, N / 2) : n;
}

}  // namespace futransformer::cuda::int4_dequant
