// The gate|up FP8 GEMM with the SwiGLU → FP8 epilogue (gemm_fp8_swiglu.cuh): tile geometry, shared-memory layout
// and the packed order of the gate|up weight rows, in plain C++ shared by the kernel, its launcher, the engine's
// packer and the CPU tests.
//
// A tile is 64 token rows × 256 packed weight rows (B) × K. Its two consumer warpgroups split N: warpgroup h runs
// wgmma.m64n128k32 on packed rows 128 h .. 128 h + 127, which hold the gate rows of 64 SwiGLU channels then the up
// rows of the same 64 channels — so every thread holds g and u of the same (token, channel) pairs in its own
// accumulator registers, and the tile's two warpgroups together cover 128 channels: one 1 × 128 FP8 block per
// token, whose amax they combine through shared memory. The tile therefore writes finished FP8 codes and the
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
constexpr int kStages = 5;
constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
constexpr int kEmptyArrivals = 4 * kConsumerWarpgroups;     // one arrival per consumer warp frees a stage
constexpr int kScaleEmptyArrivals = 128 * kConsumerWarpgroups;
constexpr int kGroupM = 32;            // 2048 token rows of A stay in L2 while a group walks N
constexpr int kEpilogueBarrier = 3;    // named barrier of the 256 consumer threads (0: __syncthreads)

// The canonical row (of the [gate rows; up rows] = [2 · inter, K] weight) that packed row p holds.
FT_HD int64_t packed_row_source(int64_t p, int64_t inter) {
  const int64_t tile = p / kBlockN, in_tile = p % kBlockN;
  const int64_t half = in_tile / kHalfN, q = in_tile % kHalfN;
  const int64_t channel = tile * kChannelsPerTile + half * kChannelsPerHalf + q % kChannelsPerHalf;
  return (q < kChannelsPerHalf ? 0 : inter) + channel;
}

// Shared memory: [A stages | B stages | a scales (64) | b scales (256) | amax exchange (2 x 64) | mbarriers].
struct SmemLayout {
  uint32_t a_stage_bytes, b_stage_bytes;
  uint32_t a_offset, b_offset;
  uint32_t scale_offset;     // a scales, then b scales at scale_offset + 4 kBlockM
  uint32_t exchange_offset;  // warpgroup h's per-row amax at exchange_offset + 4 (64 h + row)
  uint32_t bar_offset;       // full[s], empty[s], scale_full, scale_empty as in gemm_fp8_layout.h
  uint32_t bytes, alloc_bytes;
};
FT_HD constexpr SmemLayout smem_layout() {
  SmemLayout l{};
  l.a_stage_bytes = kBlockM * fp8::kBlockK;
  l.b_stage_bytes = kBlockN * fp8::kBlockK;
  l.a_offset = 0;
  l.b_offset = kStages * l.a_stage_bytes;
  l.scale_offset = l.b_offset + kStages * l.b_stage_bytes;
  l.exchange_offset = l.scale_offset + 4u * (kBlockM + kBlockN);
  l.bar_offset = l.exchange_offset + 4u * kBlockM * kConsumerWarpgroups;
  l.bytes = l.bar_offset + 2u * kStages * 8u + 16u;
  l.alloc_bytes = l.bytes + fp8::kSwizzleAtom;
  return l;
}
FT_HD constexpr uint32_t stage_tx_bytes() { return (kBlockM + kBlockN) * fp8::kBlockK; }

}  // namespace futransformer::cuda::fp8sw
