// Prefill attention over the paged KV cache: the work decomposition (query tiles, key blocks, causal limits), the
// shared-memory layout of one key block and every thread -> fragment index map of the kernel. One plain C++ header
// shared by the kernel (src/cuda/attention_prefill.cuh) and the CPU test (tests/cpu/test_attention_prefill_emulation.cpp),
// so the two cannot drift apart. docs/kernels.md ("Prefill attention") explains the design.
//
// mma.sync.m16n8k16 fragments (PTX ISA), lane = 4 g + t, lower index in the low 16 bits:
//   A (16x16) reg r: row g + 8 (r & 1), cols 2t + 8 (r >> 1) + {0, 1}
//   B (16x8)  reg r: rows (k) 2t + 8 r + {0, 1}, col (n) g
//   C (16x8)  elem i: row g + 8 (i >> 1), col 2t + (i & 1)
// S = Q·Kᵀ: A = 16 query vectors of a warp (k = channels), B = keys (k = channels, n = 8 tokens).
// O = P·V: A = probabilities (k = 16 tokens; the C fragments of two S n-tiles), B = values (n = 8 channels).
//
// A "query vector" is one (row, query head) pair of a chunk: the chunk's rows × G vectors are numbered
// v = row_in_chunk · G + head_in_group, and a CTA takes 64 consecutive vectors (4 warps × 16 A rows). So every
// G ≤ 8 fills the A rows (G = 8: 8 rows × 8 heads per CTA; G = 1: 64 rows) and all heads of one KV head sit in one
// CTA, which reads each cache page once per 64 vectors.
#pragma once

#include <cstdint>

#include "cuda/attention_decode_layout.h"  // FT_HD, the canonical page geometry (attn::Geometry)

namespace futransformer::cuda::prefill {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kWarpVectors = 16;                     // A rows of one warp
constexpr int kTileVectors = kWarps * kWarpVectors;  // query vectors of one CTA
constexpr int kBlockTokens = 64;                     // key block = one page
constexpr int kChunk = 16;                           // bytes of one ldmatrix row / cp.async
constexpr int kGroup = 32;                           // int4 channels per scale group (formats::kKvInt4Group)
constexpr int kMaxGqa = 8;

// Shared memory of one CTA. Key blocks are held as BF16 rows [64 tokens][kD] (K, then V), token-major like the
// page, with the 16-byte chunks of a row XOR-swizzled by (token & 7): ldmatrix reads one chunk column of 8
// consecutive tokens, which a plain 2·kD-byte row pitch (a multiple of 128 bytes) would put in the same banks.
//  BF16 cache: two such blocks, filled straight from the pages by cp.async (double buffer).
//  INT4 caches: two raw page stages (the canonical page bytes, cp.async double buffer), and one dequantised block:
//  K and V as the exact integers u − z in BF16, then the key and value scales as fp32 [G][64] (group-major, so a
//  lane's two consecutive tokens are one 8-byte load).
template <bool kInt4, int kD>
struct Layout {
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128");
  using Page = attn::Geometry<kInt4, kD>;  // canonical page offsets (checked against formats::kv_page_layout)
  static constexpr int kGroups = kD / kGroup;
  static constexpr int kRowBytes = 2 * kD;  // one BF16 row of a block
  static constexpr int kRowChunks = kRowBytes / kChunk;
  static constexpr int kPartBytes = kBlockTokens * kRowBytes;  // K or V of a block
  static constexpr int kScaleBytes = kInt4 ? kGroups * kBlockTokens * 4 : 0;
  static constexpr int kBlockBytes = 2 * kPartBytes + 2 * kScaleBytes;  // [K | V | K scales | V scales]
  static constexpr int kRawPageBytes = static_cast<int>(Page::kPageBytes);
  static constexpr int kRawPageChunks = kRawPageBytes / kChunk;
  // INT4: [raw stage 0 | raw stage 1 | block]; BF16: [block 0 | block 1].
  static constexpr int kStageBytes = kInt4 ? kRawPageBytes : kBlockBytes;
  static constexpr int kBlockOffset = kInt4 ? 2 * kRawPageBytes : 0;
  static constexpr int kSmemBytes = kInt4 ? 2 * kRawPageBytes + kBlockBytes : 2 * kBlockBytes;
  // INT4: one 32-bit word of codes is 8 channels = one 16-byte chunk of the dequantised BF16 row.
  static constexpr int kCodeWords = kD / 8;
  static constexpr int kCodeRowBytes = kD / 2;
  static_assert(kRawPageBytes % kChunk == 0 && kStageBytes % kChunk == 0 && kBlockOffset % kChunk == 0);
  // Registers: Q fragments (kD / 4), O (kD / 2) and S of one 64-token block (32) per lane; head_dim 128 needs
  // about 200, so two CTAs per SM (8 warps); head_dim 64 fits 3.
  static constexpr int kMinCtasPerSm = kD == 128 ? 2 : 3;
};

// Byte offset of chunk `chunk` (16 bytes = 8 channels) of token row `row` in one part (K or V) of a block.
FT_HD int block_chunk_offset(int row_chunks, int row, int chunk) {
  return (row * row_chunks + (chunk ^ (row & 7))) * kChunk;
}

// ldmatrix.x4 (non-transposed) for S: the lane's row address for the key pair p (tokens 16p .. 16p + 15) and
// k-step ks (channels 16 ks .. 16 ks + 15). Matrices: 0 = (tokens 0-7, chunk 2ks), 1 = (tokens 0-7, chunk 2ks + 1),
// 2 = (tokens 8-15, chunk 2ks), 3 = (tokens 8-15, chunk 2ks + 1); lanes 8m .. 8m + 7 address matrix m. So registers
// {0, 1} are the B fragment of n-tile 2p and {2, 3} that of n-tile 2p + 1.
FT_HD int key_ldmatrix_token(int lane, int p) { return 16 * p + (lane & 7) + 8 * (lane >> 4); }
FT_HD int key_ldmatrix_chunk(int lane, int ks) { return 2 * ks + ((lane >> 3) & 1); }

// ldmatrix.x4.trans for O += P·V: the lane's row address for k-step kk (tokens 16 kk .. 16 kk + 15) and the chunk
// pair (c, c + 1) (channels 8c .. 8c + 15). Matrices: 0 = (tokens 0-7, chunk c), 1 = (tokens 8-15, chunk c),
// 2 = (tokens 0-7, chunk c + 1), 3 = (tokens 8-15, chunk c + 1). So registers {0, 1} are the B fragment of n-tile c
// and {2, 3} that of n-tile c + 1.
FT_HD int value_ldmatrix_token(int lane, int kk) { return 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1); }
FT_HD int value_ldmatrix_chunk(int lane, int c) { return c + (lane >> 4); }

// INT4 dequantisation: byte selector for prmt(word, word >> 4, ·) that puts byte j of the word in byte 0 and byte j
// of the word shifted by a nibble in byte 2, i.e. the nibbles of channels 2j (low) and 2j + 1 (high) of the word's
// eight channels at bits 0 and 16 (bytes 1 and 3 are masked off afterwards).
FT_HD uint32_t dequant_selector(int j) {
  return static_cast<uint32_t>(j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12));
}

// The chunk's work: vectors v = row · G + head of one chunk; tile `tile` covers vectors 64 tile .. 64 tile + 63.
struct TileWork {
  int v_begin = 0, v_end = 0;  // vectors of the tile [v_begin, v_end)
  int kv_len = 0;              // keys the tile reads: positions 0 .. kv_len − 1
  int blocks = 0;              // key blocks (pages) the tile reads
};

// Tiles of a chunk of `rows` rows with G heads per KV head.
FT_HD int tiles_for_rows(int rows, int gqa) { return rows > 0 ? (rows * gqa + kTileVectors - 1) / kTileVectors : 0; }

// Position (the last key it attends to) of vector v of a chunk that starts at cache position `start`: row v / G
// sees keys 0 .. start + v / G, clamped to the block table's capacity.
FT_HD int vector_position(int start, int v, int gqa, int capacity) {
  const int64_t pos = int64_t{start} + v / gqa;
  return static_cast<int>(pos < capacity - 1 ? pos : capacity - 1);
}

FT_HD TileWork tile_work(int rows, int gqa, int start, int capacity, int tile) {
  TileWork w;
  const int n_vec = rows * gqa;
  w.v_begin = tile * kTileVectors;
  w.v_end = w.v_begin + kTileVectors < n_vec ? w.v_begin + kTileVectors : n_vec;
  if (w.v_begin >= w.v_end) return TileWork{};
  w.kv_len = vector_position(start, w.v_end - 1, gqa, capacity) + 1;
  w.blocks = (w.kv_len + kBlockTokens - 1) / kBlockTokens;
  return w;
}

// The CTA's KV head and tile of a chunk from its grid coordinates (x over tile ranks, y over KV heads: the launch's
// grid). The hardware dispatches CTAs in linear order (x fastest), and a causal tile is lighter the lower its index,
// so the linear index is read KV head fastest: every head's heaviest tile goes out before any head's next one (the
// longest-first order that keeps the last wave of one-CTA-per-SM kernels short). Rank r is tile tiles − 1 − r of
// the chunk. A bijection of [0, grid_x) x [0, n_kv_heads) onto itself.
struct TileSlot {
  int kv_head = 0;
  int rank = 0;  // 0 = the chunk's heaviest (last) tile
};
FT_HD TileSlot tile_slot(int bx, int by, int grid_x, int n_kv_heads) {
  const int linear = by * grid_x + bx;
  return TileSlot{linear % n_kv_heads, linear / n_kv_heads};
}

// The vector A row `r` (0..15) of warp `warp` computes: vectors past the chunk repeat the last one (finite, never
// stored), so every A row has a valid position and key 0 of block 0 is visible to every row.
FT_HD int warp_row_vector(const TileWork& w, int warp, int r) {
  const int v = w.v_begin + kWarpVectors * warp + r;
  return v < w.v_end ? v : w.v_end - 1;
}

}  // namespace futransformer::cuda::prefill
