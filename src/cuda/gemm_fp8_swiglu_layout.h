// The gate|up FP8 GEMM with the SwiGLU → FP8 epilogue (gemm_fp8_swiglu.cuh): tile geometry, shared-memory layout
// and the packed order of the gate|up weight rows, in plain C++ shared by the kernel, its launcher, the engine's
// packer and the CPU tests.
//
// A tile is 64 token rows × 256 packed weight rows (B) × K. Its two consumer warpgroups split N: warpgroup h runs
// wgmma.m64n128k32 on packed rows 128 h .. 128 h + 127, which hold the gate rows of 64 SwiGLU channels then the up
// rows of the same 64 channels, so the tile covers 128 channels: one 1 × 128 FP8 block per token. After its main loop
// a consumer rounds its g and u to BF16 (gemm_fp8's store expression) into a shared-memory staging tile and goes on
// to the next tile; a fourth, epilogue warpgroup computes y = silu(g) · u, the block's amax, scale and codes from the
// staging tile while the tensor cores run the next main loop. The tile therefore writes finished FP8 codes and the
// per-token-per-128-channel scales, never the [M, 2 · inter] BF16 gate|up tensor.
#pragma once

#include <cstdint>

#include "cuda/gemm_fp8_layout.h"

namespace futransformer::cuda::fp8sw {

constexpr int kBlockM = 64;            // token rows per tile (one wgmma M)
constexpr int kBlockN = 256;           // packed gate|up rows per tile
constexpr int kHalfN = 128;            // packed rows per consumer warpgroup (its wgmma N)
constexpr int kChannelsPerHalf = 64;   // SwiGLU channels per warpgroup: gate rows 0..63, up rows 64..127 of its half
constexpr int kChannelsPerTile = 128;  // = one FP8 block of the down projection's input
constexpr int kStages = 4;
constexpr int kConsumerWarpgroups = 2;
constexpr int kEpilogueWarpgroup = 1 + kConsumerWarpgroups;  // warpgroup 0 produces, 1..2 consume, 3 quantises
constexpr int kThreads = 128 * (2 + kConsumerWarpgroups);
constexpr int kEmptyArrivals = 4 * kConsumerWarpgroups;     // one arrival per consumer warp frees a stage
constexpr int kScaleEmptyArrivals = 128 * kConsumerWarpgroups;
constexpr int kStagingFullArrivals = 128 * kConsumerWarpgroups;  // every consumer thread, after its stores
constexpr int kStagingEmptyArrivals = 128;                       // every epilogue thread, after its loads
constexpr int kGroupM = 32;            // 2048 token rows of A stay in L2 while a group walks N
// setmaxnreg budgets for 512 threads (128 registers each at launch): 128 x 40 (producer) + 128 x 128 (epilogue,
// unchanged) + 256 x 168 (consumers: two fp32 copies of a 64 x 128 accumulator) = 64512 of 65536.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 168;
// Staging: g and u as BF16, [64 rows][128 channels] each, rows padded to 136 values (272 bytes = 68 words): the
// eight rows a consumer warp stores at once start 4 banks apart, so its 32 four-byte stores hit 32 banks.
constexpr int kStagingPitch = 136;
constexpr uint32_t kStagingBytes = kBlockM * kStagingPitch * 2;
// Epilogue warpgroup: a quad of lanes per row (32 channels each), eight rows per warp, two passes of 32 rows.
constexpr int kEpilogueChannelsPerLane = kChannelsPerTile / 4;
constexpr int kEpiloguePasses = kBlockM / (4 * 8);

// The canonical row (of the [gate rows; up rows] = [2 · inter, K] weight) that packed row p holds.
FT_HD int64_t packed_row_source(int64_t p, int64_t inter) {
  const int64_t tile = p / kBlockN, in_tile = p % kBlockN;
  const int64_t half = in_tile / kHalfN, q = in_tile % kHalfN;
  const int64_t channel = tile * kChannelsPerTile + half * kChannelsPerHalf + q % kChannelsPerHalf;
  return (q < kChannelsPerHalf ? 0 : inter) + channel;
}

// Shared memory: [A stages | B stages | g staging | u staging | a scales (64) | b scales (256) | mbarriers].
struct SmemLayout {
  uint32_t a_stage_bytes, b_stage_bytes;
  uint32_t a_offset, b_offset;
  uint32_t g_offset, u_offset;  // staging: element (row, channel) at offset + 2 (row · kStagingPitch + channel)
  uint32_t scale_offset;        // a scales, then b scales at scale_offset + 4 kBlockM
  uint32_t bar_offset;          // full[s], empty[s], scale_full, scale_empty as in gemm_fp8_layout.h, then
                                // staging_full and staging_empty
  uint32_t bytes, alloc_bytes;
};
FT_HD constexpr SmemLayout smem_layout() {
  SmemLayout l{};
  l.a_stage_bytes = kBlockM * fp8::kBlockK;
  l.b_stage_bytes = kBlockN * fp8::kBlockK;
  l.a_offset = 0;
  l.b_offset = kStages * l.a_stage_bytes;
  l.g_offset = l.b_offset + kStages * l.b_stage_bytes;
  l.u_offset = l.g_offset + kStagingBytes;
  l.scale_offset = l.u_offset + kStagingBytes;
  l.bar_offset = l.scale_offset + 4u * (kBlockM + kBlockN);
  l.bytes = l.bar_offset + 2u * kStages * 8u + 32u;
  l.alloc_bytes = l.bytes + fp8::kSwizzleAtom;
  return l;
}
FT_HD constexpr uint32_t stage_tx_bytes() { return (kBlockM + kBlockN) * fp8::kBlockK; }
FT_HD constexpr uint32_t staging_offset(int row, int channel) {
  return 2u * static_cast<uint32_t>(row * kStagingPitch + channel);
}

}  // namespace futransformer::cuda::fp8sw
