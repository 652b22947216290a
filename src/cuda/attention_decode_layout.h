// Paged decode attention: the geometry of the canonical KV pages (docs/formats.md), of one pipeline stage in
// shared memory, and every index map from an mma fragment register to a token / channel. One plain C++ header
// shared by the CUDA kernels (src/cuda/attention_decode.cuh) and the CPU emulation test
// (tests/cpu/test_attention_decode_emulation.cpp), so the two cannot drift apart. docs/kernels.md explains them.
//
// mma.sync.m16n8k16 fragments (PTX ISA), lane = 4 g + t, lower index in the low 16 bits:
//   A (16x16) reg r: row g + 8 (r & 1), cols 2t + 8 (r >> 1) + {0, 1}
//   B (16x8)  reg r: rows (k) 2t + 8 r + {0, 1}, col (n) g
//   C (16x8)  elem i: row g + 8 (i >> 1), col 2t + (i & 1)
// S = Q·Kᵀ: A = the GQA group's query heads (rows 0..7; rows 8..15 are zero registers), B = keys (k = channels,
// n = 8 tokens). O = P·V: A = probabilities (k = 16 tokens; its fragment is S's C fragment of two n-tiles),
// B = values (k = tokens, n = 8 channels).
//
// INT4 cache: the kernel computes the transposed products, Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·P'ᵀ, so the cache codes are
// the A operand (16 rows: tokens, or channels) and the at most 8 query heads are the n = 8 columns: every row and
// every accumulator of each mma carries data, where S = Q·Kᵀ would leave rows 8..15 of A and C empty.
//
// INT4 keys (A of Sᵀ: rows = the tile's 16 tokens, k = channels). A 16-byte chunk of a code row is one group of 32
// channels. ldmatrix (non-transposed) over 8 token rows of a chunk gives lane (g, t) word t of token g's chunk:
// channels 8t .. 8t + 7 of the group, nibble i = channel 8t + i. The magic-number dequantisation extracts nibble
// pairs (i, i + 4) from (word >> 4 s), so the kernel gives k index 2t + 8 r + h of k-step ks (two per group) the
// physical channel
//   key_channel(gi, ks, t, r, h) = 32 gi + 8 t + 2 ks + r + 4 h
// (A reg 0 / 1: tokens g / g + 8 with r = 0; reg 2 / 3: r = 1) and loads Q's B fragment (column g = head g) with
// the same permutation. Each k-step stays inside one group, so the product with the integer codes (u − z) is exact
// and the group scale (per token = per row of Sᵀ) is applied in fp32. C element i of lane (g, t): token
// g + 8 (i >> 1), head 2t + (i & 1).
//
// INT4 values (A of Oᵀ: rows = 16 channels, k = the tile's tokens). ldmatrix.trans over 8 token rows of a chunk
// gives lane (g, t) b16 column g of tokens 2t and 2t + 1: channels 4g .. 4g + 3 of the group for both tokens,
// nibble i of each half = channel 4g + i. m-tile mt = 2 grp + j takes nibble 2j for rows 0..7 (A regs 0, 2) and
// nibble 2j + 1 for rows 8..15 (regs 1, 3), so C row g + 8 hi of m-tile mt is channel
//   value_channel_t(mt, g, hi) = 32 (mt >> 1) + 4 g + 2 (mt & 1) + hi.
// Every m-tile lies in one group, and the per-token value scale of that group is folded into P
// (P'[h, τ] = P[h, τ] · s_v[τ, grp], B of Oᵀ: k = token, n = head), which leaves the integer codes exact. P' is
// built in the C layout of Sᵀ (token rows, head columns) and turned into the B layout (head g, tokens 2t, 2t + 1)
// by movmatrix.trans, 8 x 8 at a time.
//
// BF16 cache: plain FlashAttention-2 fragments (k-step ks = channels 16 ks .. 16 ks + 15, n-tile nt = channels
// 8 nt .. 8 nt + 7), through ldmatrix / ldmatrix.trans.
#pragma once

#include <cstdint>

#include "cuda/host_device.h"

namespace futransformer::cuda::attn {

constexpr int kWarpSize = 32;
constexpr int kPageTokens = 64;  // formats::kKvPageTokens
constexpr int kTile = 16;        // tokens per mma k/n tile and per pipeline stage
constexpr int kTilesPerPage = kPageTokens / kTile;
constexpr int kGroup = 32;  // formats::kKvInt4Group
constexpr int kChunk = 16;  // bytes per cp.async / ldmatrix row
constexpr int kMaxGqa = 8;  // query heads per KV head: rows 0..7 of the A operand
constexpr int kWarps = 4;  // warps per CTA, the default CtaShape (INT4 head_dim 128 also has 8: cta_warps)
constexpr int kMaxSplits = 64;  // the combine kernel keeps one weight per split in shared memory
// Splits whose partials are combined inside one thread-block cluster at most (attention_decode_kernel's kCl
// instances): above 8 a non-portable cluster size, which sm_90 allows up to 16.
constexpr int kMaxClusterCombineSplits = 16;

constexpr uint32_t kBf16Magic = 0x43004300u;  // bf16x2 {128, 128}: 0x4300 | u is 128 + u for u < 128
constexpr uint32_t kNibbleMask = 0x000f000fu;

// The canonical page (P = 64) and one pipeline stage (16 tokens) for a format and head_dim. Every region is a
// multiple of 16 bytes for head_dim 64 and 128, so the offsets need no padding (the emulation test compares
// them with formats::kv_page_layout).
template <bool kInt4, int kD>
struct Geometry {
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128");
  static constexpr int kGroups = kInt4 ? kD / kGroup : 0;
  static constexpr int kRowBytes = kInt4 ? kD / 2 : 2 * kD;
  static constexpr int kRowChunks = kRowBytes / kChunk;
  // Page: [K codes | K scales | K zeros | V codes | V scales | V zeros].
  static constexpr int64_t kPageCodeBytes = int64_t{kPageTokens} * kRowBytes;
  static constexpr int64_t kPageScaleBytes = int64_t{kPageTokens} * kGroups * 2;
  static constexpr int64_t kPageZeroBytes = int64_t{kPageTokens} * kGroups;
  static constexpr int64_t kPagePartBytes = kPageCodeBytes + kPageScaleBytes + kPageZeroBytes;
  static constexpr int64_t kPageBytes = 2 * kPagePartBytes;
  static_assert(kPageCodeBytes % 16 == 0 && kPageScaleBytes % 16 == 0 && kPageZeroBytes % 16 == 0);
  // Stage: [K codes | V codes | K scales | V scales | K zeros | V zeros]; codes row-major, 32-byte units
  // swizzled (stage_code_offset).
  static constexpr int kStageCodeBytes = kTile * kRowBytes;
  static constexpr int kStageScaleBytes = kTile * kGroups * 2;
  static constexpr int kStageZeroBytes = kTile * kGroups;
  // Offsets of part p (0 = K, 1 = V): codes p * kStageCodeBytes, scales kStageScales + p * kStageScaleBytes,
  // zeros kStageZeros + p * kStageZeroBytes.
  static constexpr int kStageScales = 2 * kStageCodeBytes;
  static constexpr int kStageZeros = 2 * (kStageCodeBytes + kStageScaleBytes);
  static constexpr int kStageBytes = 2 * (kStageCodeBytes + kStageScaleBytes + kStageZeroBytes);
  static constexpr int kStageChunks = kStageBytes / kChunk;
  static constexpr int kCodeChunksPerPart = kTile * kRowChunks;
  static_assert(kStageBytes % kChunk == 0 && kStageScaleBytes % kChunk == 0 && kStageZeroBytes % kChunk == 0);
  // Pipeline depth: about 10-12 KB of stages per warp for INT4 (several tiles in flight), 3-4 stages of the
  // 4-8 KB BF16 tiles (the ring must still leave room for two CTAs per SM).
  static constexpr int kStages = kInt4 ? (kD == 128 ? 5 : 8) : (kD == 128 ? 3 : 4);
};

// One CTA of the decode kernel: kW warps, each walking its own share of the split's tiles (round-robin) through its
// own ring of Geometry::kStages stages, then one cross-warp merge. kW = kWarps (4) everywhere; the INT4 head_dim 128
// instances also come with 8 warps (the plan's choice, cta_warps in attention_decode_heuristics.h), for grids that leave
// too few warps per SM to hide the per-tile latency chains.
template <bool kInt4, int kD, int kW = kWarps>
struct CtaShape {
  static_assert(kW == 4 || kW == 8, "4 or 8 warps per CTA");
  using Geo = Geometry<kInt4, kD>;
  static constexpr int kThreadsPerCta = kW * kWarpSize;
  // Register cap for __launch_bounds__: with 4 warps the head_dim 128 instances need up to ~168 registers (three
  // CTAs per SM: still 12 warps and over 100 KB of copies in flight per SM), the head_dim 64 ones fit in 128 (four
  // CTAs). With 8 warps: two CTAs per SM (128 registers; ptxas reports no spills for the INT4 head_dim 128 ones).
  static constexpr int kMinCtasPerSm = kW == 8 ? 2 : (kD == 128 ? 3 : 4);
  static constexpr int kRingBytes = kW * Geo::kStages * Geo::kStageBytes;
  // Cross-warp merge buffers (they reuse the ring once every warp is done): O [warp][head][channel], m and l.
  static constexpr int kMergeBytes = kW * kMaxGqa * (kD + 2) * 4;
  static constexpr int kSmemBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
  // The cluster combine (attention_decode_kernel's kCl instances), after the merge buffers: the CTA's normalised
  // partial O [head][channel] and log2-sum-exp [head], read by the cluster's other CTAs, then the un-rotation's two
  // exchange rows of one float per thread.
  static constexpr int kClusterOBytes = kMaxGqa * kD * 4;
  static constexpr int kClusterLseBytes = kMaxGqa * 4;
  static constexpr int kClusterExchangeBytes = 2 * kThreadsPerCta * 4;
  static constexpr int kClusterBytes = kClusterOBytes + kClusterLseBytes + kClusterExchangeBytes;
  // Where the two exchange rows start (from the shared-memory base): the cluster combine's un-rotation and the
  // unsplit store's (which leaves the cluster's O and lse rows unused) both use them.
  static constexpr int kExchangeOffset = kMergeBytes + kClusterOBytes + kClusterLseBytes;
  static_assert(kMergeBytes + kClusterBytes <= kSmemBytes, "the cluster buffers fit beside the merge buffers");
  static_assert(kMergeBytes % 16 == 0 && kClusterOBytes % 16 == 0, "16-byte aligned cluster buffers");
};

// Byte offset in a stage of chunk `chunk` (16 bytes of channels) of token row `row` of one part's codes, for code
// rows of kRowChunks chunks: row-major, as in the page, with the row's 32-byte units (chunk pairs) XOR-permuted by
// the row's low bits:
//   offset = (row · kRowChunks + (chunk ^ stage_code_swizzle<kRowChunks>(row))) · 16.
// - Copies: every 32-byte sector of the page lands in 32 contiguous shared bytes in its own order, and the 8 lanes
//   of a copy's quarter warp (128 contiguous page bytes) in 128 contiguous shared bytes. That is what lets the
//   cp.async of a warp go out as whole-line L2 requests: with the earlier chunk-major stage (a row's chunks 256 bytes
//   apart) each 16-byte half of a sector was its own request, every sector was requested twice and the INT4 kernel
//   ran 26-35 % slower at batch 32 on an H100 (docs/results.md, thirty-fifth session).
// - ldmatrix (8 rows of one chunk): with sectors kept whole a chunk's bank group is fixed mod 2, so two rows per
//   bank group (2-way) is the least possible; the swizzle reaches it (plain row-major is 4-way for 64-byte rows and
//   8-way for 128- and 256-byte rows).
template <int kRowChunks>
FT_HD int stage_code_swizzle(int row) {
  static_assert(kRowChunks == 2 || kRowChunks == 4 || kRowChunks == 8 || kRowChunks == 16, "code row chunks");
  if constexpr (kRowChunks == 2) {
    return 0;  // one 32-byte unit per row: rows alternate bank-group halves already
  } else if constexpr (kRowChunks == 4) {
    return ((row >> 1) & 1) << 1;  // rows r, r + 1 sit in different 64-byte halves of a line; bit 1 swaps units
  } else {
    return (row & 3) << 1;  // a 128-byte line holds 4 units of one row: rotate them by row
  }
}
template <int kRowChunks>
FT_HD int stage_code_offset(int row, int chunk) {
  return (row * kRowChunks + (chunk ^ stage_code_swizzle<kRowChunks>(row))) * kChunk;
}

// Where stage chunk c (0 .. kStageChunks − 1) comes from (relative to the page start) and goes to (relative to
// the stage), for the tile starting at page slot slot0. Consecutive c read consecutive global bytes.
struct ChunkCopy {
  int src;
  int dst;
  int row;  // token row of the tile for code chunks, -1 for metadata
};
template <bool kInt4, int kD>
FT_HD ChunkCopy stage_chunk(int c, int slot0) {
  using Geo = Geometry<kInt4, kD>;
  if (c < 2 * Geo::kCodeChunksPerPart) {
    const int part = c / Geo::kCodeChunksPerPart, cc = c % Geo::kCodeChunksPerPart;
    const int row = cc / Geo::kRowChunks, col = cc % Geo::kRowChunks;
    return ChunkCopy{static_cast<int>(part * Geo::kPagePartBytes) + (slot0 + row) * Geo::kRowBytes + col * kChunk,
                     part * Geo::kStageCodeBytes + stage_code_offset<Geo::kRowChunks>(row, col), row};
  }
  if constexpr (kInt4) {
    int m = c - 2 * Geo::kCodeChunksPerPart;  // metadata: K scales, V scales, K zeros, V zeros
    constexpr int kScaleChunks = Geo::kStageScaleBytes / kChunk, kZeroChunks = Geo::kStageZeroBytes / kChunk;
    if (m < 2 * kScaleChunks) {
      const int part = m / kScaleChunks, j = m % kScaleChunks;
      return ChunkCopy{
          static_cast<int>(part * Geo::kPagePartBytes + Geo::kPageCodeBytes) + slot0 * Geo::kGroups * 2 + j * kChunk,
          Geo::kStageScales + part * Geo::kStageScaleBytes + j * kChunk, -1};
    }
    m -= 2 * kScaleChunks;
    const int part = m / kZeroChunks, j = m % kZeroChunks;
    return ChunkCopy{static_cast<int>(part * Geo::kPagePartBytes + Geo::kPageCodeBytes + Geo::kPageScaleBytes) +
                         slot0 * Geo::kGroups + j * kChunk,
                     Geo::kStageZeros + part * Geo::kStageZeroBytes + j * kChunk, -1};
  } else {
    return ChunkCopy{-1, -1, -1};  // BF16 stages hold codes only: c is always below 2 * kCodeChunksPerPart
  }
}

// The address lane supplies to ldmatrix.x4 (either form) for the chunk pair (c, c + 1), c even: matrices
// (rows 0-7, chunk c), (rows 8-15, chunk c), (rows 0-7, chunk c + 1), (rows 8-15, chunk c + 1).
template <int kRowChunks>
FT_HD int ldmatrix_pair_offset(int lane, int c) {
  return stage_code_offset<kRowChunks>(lane & 15, c + (lane >> 4));
}

// INT4 keys: physical channel of k index 2t + 8r + h in k-step ks (0, 1) of group gi; its nibble is at bit
// 4 (2 ks + r) + 16 h of the ldmatrix word.
FT_HD int key_channel_int4(int gi, int ks, int t, int r, int h) { return kGroup * gi + 8 * t + 2 * ks + r + 4 * h; }
FT_HD int key_shift_int4(int ks, int r) { return 4 * (2 * ks + r); }
// INT4 values: physical channel of row g + 8 hi of Oᵀ m-tile mt (= 2 grp + j); nibble 2j + hi (bit 4 (2j + hi) + 16h)
// of the ldmatrix.trans word of token 2t + 8r + h.
FT_HD int value_channel_t(int mt, int g, int hi) { return kGroup * (mt >> 1) + 4 * g + 2 * (mt & 1) + hi; }
FT_HD int value_shift_t(int mt, int hi) { return 4 * (2 * (mt & 1) + hi); }
// BF16: the identity orders.
FT_HD int key_channel_bf16(int ks, int t, int r, int h) { return 16 * ks + 8 * r + 2 * t + h; }
FT_HD int value_channel_bf16(int nt, int col) { return 8 * nt + col; }

// BF16 cache: tokens of the S / P fragments a lane holds: n-tile nt, element j (0, 1) of row g is token
// 8 nt + 2t + j of the tile; the A fragment of P·V holds (a0) tokens 2t, 2t+1 = n-tile 0 and (a2) 2t+8, 2t+9 =
// n-tile 1.
FT_HD int score_token(int t, int nt, int j) { return 8 * nt + 2 * t + j; }

// INT4 stage copies, lane by lane: code copy i (0 .. kCodeCopies − 1) of lane moves stage chunk lane + 32 i. Code
// chunks of a tile are 16 contiguous token rows in the page, so the source is the tile's first code byte
// (slot0 · kRowBytes past the part) plus lane · 16 plus a constant of i, and the destination a lane term plus a
// constant of i: the kernel keeps one source and one destination register for all of them. The metadata chunks
// (scales, zeros; lanes below kMetaChunks) use stage_chunk itself, evaluated once per lane.
template <int kD>
struct Int4Copies {
  using Geo = Geometry<true, kD>;
  static constexpr int kCodeCopies = 2 * Geo::kCodeChunksPerPart / kWarpSize;
  static constexpr int kMetaChunks = Geo::kStageChunks - 2 * Geo::kCodeChunksPerPart;
  static_assert(Geo::kCodeChunksPerPart % kWarpSize == 0 && kWarpSize % Geo::kRowChunks == 0,
                "a code copy stays inside one part, and lane / kRowChunks is its row");
  static_assert(kMetaChunks > 0 && kMetaChunks <= kWarpSize, "one metadata copy per lane at most");
  static FT_HD int part(int i) { return kWarpSize * i / Geo::kCodeChunksPerPart; }
  static FT_HD int run(int i) { return kWarpSize * i - part(i) * Geo::kCodeChunksPerPart; }  // first chunk in the part
  // Source offset from the page start, for the tile at slot0 (the lane term lane · 16 included).
  static FT_HD int code_src(int lane, int i, int slot0) {
    return static_cast<int>(part(i) * Geo::kPagePartBytes) + slot0 * Geo::kRowBytes + (run(i) + lane) * kChunk;
  }
  static FT_HD int code_dst(int lane, int i) {
    return part(i) * Geo::kStageCodeBytes +
           stage_code_offset<Geo::kRowChunks>(lane / Geo::kRowChunks + run(i) / Geo::kRowChunks,
                                              lane % Geo::kRowChunks);
  }
};

// Part i of `parts` nearly equal parts of [0, total).
struct Range {
  int begin, end;
};
FT_HD Range split_range(int total, int parts, int i) {
  return Range{static_cast<int>(int64_t{total} * i / parts), static_cast<int>(int64_t{total} * (i + 1) / parts)};
}
// Tiles of a sequence of len tokens (0 for len <= 0).
FT_HD int tiles_for(int len) { return len > 0 ? (len + kTile - 1) / kTile : 0; }

}  // namespace futransformer::cuda::attn
