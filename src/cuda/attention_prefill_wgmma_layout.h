// Prefill attention with warpgroup MMAs (sm_90a): shared-memory layout, the 64-byte swizzle, the wgmma
// descriptors and the register budgets of attention_prefill_wgmma_kernel (src/cuda/attention_prefill_wgmma.cuh).
// The work decomposition is the mma.sync kernel's (src/cuda/attention_prefill_layout.h: query vectors v = row · G +
// head of one chunk and one KV head, positions) with tiles of 64 or 128 vectors (Shape, tile_work below). Plain C++
// so the CPU test (tests/cpu/test_attention_prefill_wgmma_layout.cpp) checks every offset here against the PTX ISA's
// canonical wgmma layouts, and the INT4 -> f16 steps against the cache format.
//
// Operand layout ("group-major, 64-byte swizzle"): a [64 rows][D] 16-bit matrix (Q: rows = query vectors; K and V:
// rows = the 64 tokens of a key block) is stored as D / 32 column groups of [64 rows][32 channels]; a row of a
// group is 64 bytes and 16-byte chunk c of row r sits at chunk c ^ ((r >> 1) & 3) (the 64-byte swizzle:
// address bits 4-5 XOR bits 7-8, inside 512-byte atoms of 8 rows). 16-bit elements: bf16, or f16 for INT4 caches.
//  - S = Q·Kᵀ: A = Q and B = K are both K-major (K = channels); k-step h of group g starts 4096 g + 32 h bytes in,
//    8-row core-matrix groups are SBO = 512 bytes apart.
//  - O = P·V: B = V is N-major (N = channels, K = tokens): 32 channels are contiguous in a row, 8 token rows form
//    a 512-byte atom (SBO = 512 to the next 8 tokens) and the next 32 channels are LBO = 4096 bytes further;
//    k-step kk (tokens 16 kk ..) starts 1024 kk bytes in, group g's 32 channels 4096 g bytes in.
#pragma once

#include <cstdint>

#include "cuda/attention_prefill_layout.h"

namespace futransformer::cuda::prefill_wgmma {

constexpr int kWarpgroupThreads = 128;
constexpr int kRows = 64;          // rows of an operand: query vectors of one consumer (M) or tokens of a key block
constexpr int kGroupChannels = 32; // channels per column group
constexpr int kRowBytes = 64;      // one row of a column group: 32 16-bit elements
constexpr int kGroupBytes = kRows * kRowBytes;  // 4096
constexpr int kAtomBytes = 8 * kRowBytes;       // 512: the 64-byte swizzle's repeat
constexpr int kAlign = 1024;                    // operand regions start 1024-byte aligned

// The CTA shape: warpgroup 0 produces, warpgroups 1 and 2 consume (64 query vectors each, sharing every key block the
// producer delivers): 384 threads, one CTA per SM, tiles of 128 vectors, three or four stages. (A one-consumer shape with
// two CTAs per SM measured 14-27 % slower and was removed in the eighth session.)
struct Shape {
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kTileVectors = kRows * kConsumers;
  static constexpr int kMinCtasPerSm = 1;
  static constexpr int kProducerRegs = 56;   // copies / dequantisation
  static constexpr int kConsumerRegs = 224;  // O (D / 2) + S (32) + P + softmax state
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= 65536 / kMinCtasPerSm / kWarpgroupThreads,
                "the CTAs of an SM must fit the register file after setmaxnreg");
  // Key blocks in flight between producer and consumers (Layout::kStages, per cache type): a consumer holds two (j − 1's
  // values, j's keys), so four let the producer fill two ahead. Measured on the H200 (sixteenth session): BF16
  // caches 107.7 → 94.0 µs at 2048 tokens and 1396 → 1160 µs at 8192 with four instead of three; INT4 caches level
  // at 2048 and 1 % slower at 8192 with the same three raw page buffers.
  static constexpr int kStagesBf16 = 4;
  static constexpr int kStagesInt4 = 3;
  static constexpr int kMaxStages = 4;
  static constexpr int kBarriers = 2 * kMaxStages;  // full[s], empty[s] (the layout reserves the most stages')
};

// Tiles of `tv` consecutive query vectors (v = row · G + head) of a chunk: as prefill::tile_work, any tile size.
FT_HD int tiles_for_rows(int rows, int gqa, int tv) { return rows > 0 ? (rows * gqa + tv - 1) / tv : 0; }
FT_HD prefill::TileWork tile_work(int rows, int gqa, int start, int capacity, int tile, int tv) {
  prefill::TileWork w;
  const int n_vec = rows * gqa;
  w.v_begin = tile * tv;
  w.v_end = w.v_begin + tv < n_vec ? w.v_begin + tv : n_vec;
  if (w.v_begin >= w.v_end) return prefill::TileWork{};
  w.kv_len = prefill::vector_position(start, w.v_end - 1, gqa, capacity) + 1;
  w.blocks = (w.kv_len + prefill::kBlockTokens - 1) / prefill::kBlockTokens;
  return w;
}
// Vector v_begin + i of the tile, or the tile's last vector past its end (finite, never stored).
FT_HD int tile_vector(const prefill::TileWork& w, int i) {
  return w.v_begin + i < w.v_end ? w.v_begin + i : w.v_end - 1;
}

// INT4 dequantisation to f16 (the producer, per 32-bit word of 8 codes, for byte j = 0..3):
//   u2 = lop3(prmt(word, word >> 4, prefill::dequant_selector(j)), 0x000F000F, kF16Magic, (a & b) | c)
//      = f16x2 {1024 + u(2j), 1024 + u(2j + 1)} (exact: 0x6400 | u is 1024 + u for u < 1024)
//   v2 = mul.rn.f16x2(sub.rn.f16x2(u2, f16x2 {1024 + z}), f16x2 {s})   (u − z exact, one rounding)
// with z the group's zero-point byte and s its fp16 scale bits. tests/cpu/test_attention_prefill_wgmma_layout.cpp
// checks it against the page bytes decoded by formats::kv_decode_token.
constexpr uint32_t kF16Magic = 0x64006400u;
constexpr uint32_t kF16NibbleMask = 0x000F000Fu;
FT_HD uint32_t f16_bias_pair(uint32_t zero_point) { return (zero_point * 0x00010001u) | kF16Magic; }
FT_HD uint32_t f16_scale_pair(uint32_t scale_bits) { return scale_bits | (scale_bits << 16); }

// The 64-byte swizzle on a byte offset from a 512-byte aligned base.
FT_HD uint32_t swizzle64(uint32_t offset) { return offset ^ (((offset >> 7) & 3u) << 4); }

// Byte offset of the 16-byte chunk `chunk8` (channels 8 chunk8 .. 8 chunk8 + 7) of row `row` in an operand.
FT_HD uint32_t operand_offset(int row, int chunk8) {
  return static_cast<uint32_t>((chunk8 >> 2) * kGroupBytes) +
         swizzle64(static_cast<uint32_t>(row * kRowBytes + (chunk8 & 3) * 16));
}

// ldmatrix.x4 row address (byte offset in a K-major operand) of lane `lane` for the mma.m16n8k16 A fragment of
// rows 16 warp .. 16 warp + 15, channels 16 ks .. 16 ks + 15: matrices (rows 0-7, chunk 2 ks), (rows 8-15, chunk
// 2 ks), (rows 0-7, chunk 2 ks + 1), (rows 8-15, chunk 2 ks + 1) are a0..a3 (the consumers' Q fragments).
FT_HD uint32_t a_fragment_row_offset(int warp, int lane, int ks) {
  return operand_offset(16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * ks + (lane >> 4));
}

// Byte offset of element (row, channel) of an operand (the CPU test's view; the kernel moves 16-byte chunks).
FT_HD uint32_t element_offset(int row, int channel) {
  return operand_offset(row, channel >> 3) + static_cast<uint32_t>((channel & 7) * 2);
}

// INT4: kRawPages raw page buffers in the producer (two pages in flight ahead of the dequantisation), each filled
// by one bulk copy (cp.async.bulk) that signals its raw_full barrier.
template <bool kInt4, int kD>
struct Layout {
  using S = Shape;
  static constexpr int kRawPages = 3;
  static constexpr int kStages = kInt4 ? S::kStagesInt4 : S::kStagesBf16;
  static_assert(kStages >= 3 && kStages <= S::kMaxStages, "a consumer holds two stages; barriers for kMaxStages");
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128");
  using Page = attn::Geometry<kInt4, kD>;  // canonical page offsets
  static constexpr int kGroups = kD / kGroupChannels;
  static constexpr int kChunksPerRow = kD / 8;               // 16-byte chunks of one row
  static constexpr int kPartBytes = kGroups * kGroupBytes;   // K, V or one consumer's Q: 64 rows x D
  static constexpr int kStageBytes = 2 * kPartBytes;         // [K | V], bf16 (BF16 cache) or f16 (INT4)
  static constexpr int kQOffset = 0;                           // consumer c's Q at kQOffset + c * kPartBytes
  static constexpr int kStageOffset = S::kConsumers * kPartBytes;
  static constexpr int kRawPageBytes = static_cast<int>(Page::kPageBytes);
  static constexpr int kRawOffset = kStageOffset + kStages * kStageBytes;  // INT4: the raw page buffers
  static constexpr int kRawBuffers = kInt4 ? kRawPages : 0;
  static constexpr int kBarOffset = kRawOffset + kRawBuffers * kRawPageBytes;
  // INT4: after the stages' barriers, raw_full[b] (one arrival + the page's bytes) and raw_empty[b] (every producer
  // thread's arrival once it has read raw buffer b) for each raw page buffer.
  static constexpr int kRawFullBarrier = S::kBarriers;
  static constexpr int kRawEmptyBarrier = S::kBarriers + kRawBuffers;
  static constexpr int kBytes = kBarOffset + (S::kBarriers + 2 * kRawBuffers) * 8;
  static constexpr int kAllocBytes = kBytes + kAlign;  // the dynamic window is only guaranteed 16-byte aligned
  static_assert(kStageOffset % kAlign == 0 && kStageBytes % kAlign == 0, "operands stay 1024-byte aligned");
  static_assert(kRawPageBytes % 16 == 0 && kBarOffset % 8 == 0);
  static_assert(S::kMinCtasPerSm * (kAllocBytes + 1024) <= 228 * 1024, "the CTAs of an SM fit its shared memory");
};

// --- wgmma shared-memory descriptors (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4,
// 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset (0: regions are 512-byte
// aligned), 62-63 swizzle mode (2 = 64 bytes).
constexpr uint32_t kSbo = kAtomBytes;          // next 8 rows (K-major) / next 8 tokens (N-major)
constexpr uint32_t kLboKMajor = 16;            // unused by swizzled K-major layouts; encoded as 1
constexpr uint32_t kLboNMajor = kGroupBytes;   // N-major: the next 32 channels
constexpr uint64_t kSwizzle64 = uint64_t{2} << 62;
FT_HD uint64_t make_desc(uint32_t smem_addr, uint32_t lbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(kSbo >> 4) << 32) | kSwizzle64;
}
// The descriptor of smem_addr + bytes from smem_addr's (bytes a multiple of 16): the start address field holds
// bits 4..17 and every shared-memory address is below 2^18, so the add never carries into the other fields. The
// consumers advance a stage's descriptors this way instead of encoding each k step's address.
FT_HD uint64_t advance_desc(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
// Start of k-step h (16 channels) of column group g of a K-major operand (Q or K).
FT_HD uint32_t kmajor_step_offset(int g, int h) { return static_cast<uint32_t>(g * kGroupBytes + h * 32); }
// Start of k-step kk (tokens 16 kk .. 16 kk + 15) of V restricted to column group g (N-major).
FT_HD uint32_t nmajor_step_offset(int g, int kk) {
  return static_cast<uint32_t>(g * kGroupBytes + kk * 2 * kAtomBytes);
}

}  // namespace futransformer::cuda::prefill_wgmma
