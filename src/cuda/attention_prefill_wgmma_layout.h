// Prefill attention with warpgroup MMAs (sm_90a): shared-memory layout, the 64-byte swizzle, the wgmma
// descriptors and the register budgets of attention_prefill_wgmma_kernel (src/cuda/attention_prefill_wgmma.cuh).
// The work decomposition (64 query vectors of one chunk and one KV head per CTA, tiles, positions) is the mma.sync
// kernel's (src/cuda/attention_prefill_layout.h). Plain C++ so the CPU test (tests/cpu/test_attention_prefill_wgmma_layout.cpp)
// checks every offset here against the PTX ISA's canonical wgmma layouts.
//
// Operand layout ("group-major, 64-byte swizzle"): a [64 rows][D] BF16 matrix (Q: rows = query vectors; K and V:
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

constexpr int kThreads = 256;      // warpgroup 0: producer; warpgroup 1: consumer (wgmma, softmax)
constexpr int kWarpgroupThreads = 128;
constexpr int kMinCtasPerSm = 2;   // 2 x 256 threads; register pool 65536 / 2 / 128 = 256 per producer+consumer pair
constexpr int kProducerRegs = 56;  // dequantisation / copies
constexpr int kConsumerRegs = 200; // O (D / 2) + S (32) + P fragments + softmax state
static_assert(kProducerRegs + kConsumerRegs <= 65536 / kMinCtasPerSm / kWarpgroupThreads,
              "two CTAs per SM must fit the register file after setmaxnreg");
constexpr int kStages = 2;         // key blocks in flight between producer and consumer
constexpr int kRows = 64;          // rows of an operand: query vectors (M) or tokens of a key block
constexpr int kGroupChannels = 32; // channels per column group = one INT4 scale group
constexpr int kRowBytes = 64;      // one row of a column group: 32 BF16
constexpr int kGroupBytes = kRows * kRowBytes;  // 4096
constexpr int kAtomBytes = 8 * kRowBytes;       // 512: the 64-byte swizzle's repeat
constexpr int kAlign = 1024;                    // operand regions start 1024-byte aligned
constexpr int kBarriers = 2 * kStages;          // full[s], empty[s]

static_assert(prefill::kTileVectors == kRows, "one consumer warpgroup computes the mma.sync kernel's 64-vector tile");

// The 64-byte swizzle on a byte offset from a 512-byte aligned base.
FT_HD uint32_t swizzle64(uint32_t offset) { return offset ^ (((offset >> 7) & 3u) << 4); }

// Byte offset of the 16-byte chunk `chunk8` (channels 8 chunk8 .. 8 chunk8 + 7) of row `row` in an operand.
FT_HD uint32_t operand_offset(int row, int chunk8) {
  return static_cast<uint32_t>((chunk8 >> 2) * kGroupBytes) +
         swizzle64(static_cast<uint32_t>(row * kRowBytes + (chunk8 & 3) * 16));
}

// Byte offset of element (row, channel) of an operand (the CPU test's view; the kernel moves 16-byte chunks).
FT_HD uint32_t element_offset(int row, int channel) {
  return operand_offset(row, channel >> 3) + static_cast<uint32_t>((channel & 7) * 2);
}

template <bool kInt4, int kD>
struct Layout {
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128");
  using Page = attn::Geometry<kInt4, kD>;  // canonical page offsets
  static constexpr int kGroups = kD / kGroupChannels;
  static constexpr int kChunksPerRow = kD / 8;               // 16-byte chunks of one row
  static constexpr int kPartBytes = kGroups * kGroupBytes;   // Q, K or V: 64 rows x D
  static constexpr int kStageBytes = 2 * kPartBytes;         // [K | V], bf16 (BF16 cache) or f16 (INT4)
  static constexpr int kQOffset = 0;
  static constexpr int kStageOffset = kPartBytes;
  static constexpr int kRawPageBytes = static_cast<int>(Page::kPageBytes);
  static constexpr int kRawOffset = kStageOffset + kStages * kStageBytes;  // INT4: two raw page buffers
  static constexpr int kRawBuffers = kInt4 ? 2 : 0;
  static constexpr int kBarOffset = kRawOffset + kRawBuffers * kRawPageBytes;
  static constexpr int kBytes = kBarOffset + kBarriers * 8;
  static constexpr int kAllocBytes = kBytes + kAlign;  // the dynamic window is only guaranteed 16-byte aligned
  static_assert(kStageOffset % kAlign == 0 && kStageBytes % kAlign == 0, "operands stay 1024-byte aligned");
  static_assert(kRawPageBytes % 16 == 0 && kBarOffset % 8 == 0);
  static_assert(2 * (kAllocBytes + 1024) <= 228 * 1024, "two CTAs per SM");
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
// Start of k-step h (16 channels) of column group g of a K-major operand (Q or K).
FT_HD uint32_t kmajor_step_offset(int g, int h) { return static_cast<uint32_t>(g * kGroupBytes + h * 32); }
// Start of k-step kk (tokens 16 kk .. 16 kk + 15) of V restricted to column group g (N-major).
FT_HD uint32_t nmajor_step_offset(int g, int kk) {
  return static_cast<uint32_t>(g * kGroupBytes + kk * 2 * kAtomBytes);
}

}  // namespace futransformer::cuda::prefill_wgmma
