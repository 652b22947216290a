// The W4A16 chain's shared-memory layout, ring protocol and index maps (src/cuda/w4a16_chain.h states the contract):
// one plain C++ header shared by the kernel (w4a16_chain.cuh) and its CPU emulation
// (tests/cpu/test_w4a16_chain_emulation.cpp), so the two cannot drift apart.
#pragma once

#include <cstdint>

#include "cuda/host_device.h"

namespace futransformer::cuda::w4a16 {

// Sixteen consumer warps: with eight (the first version) each scheduler had two warps to issue from, and the
// consumers, not the weight stream, capped the chain at ~1.4 TB/s on an H100 (0.27 instructions issued per scheduler
// and cycle, 73 % of cycles with no eligible warp; docs/results.md, fortieth session).
constexpr int kChainConsumerWarps = 16;
constexpr int kChainThreads = (kChainConsumerWarps + 1) * 32;  // the last warp is the producer
constexpr int kChainSlotBlocks = 4;                             // packed 32 x 32 blocks per ring slot
constexpr int kChainSlotK = kChainSlotBlocks * 32;              // 128: K must be a multiple
constexpr int kChainSlotWeightBytes = kChainSlotBlocks * 512;
constexpr int kChainSlotScaleBytesMax = (kChainSlotK / 32) * 64;  // group 32: four groups of 64 bytes
constexpr int kChainSlotBytes = kChainSlotWeightBytes + kChainSlotScaleBytesMax;
// Each consumer warp owns kChainSlotsPerWarp slots (its own sub-ring, so a slot's successive uses belong to one warp
// and its parity waits are never two phases ahead); the producer fills them in the order the warps consume them.
constexpr int kChainSlotsPerWarp = 3;
constexpr int kChainSlots = kChainConsumerWarps * kChainSlotsPerWarp;
constexpr int kChainMaxRows = 8;
constexpr int kChainMaxXElems = 28672;  // M * K of a stage's staged activations (one row of the 70B down's K)
constexpr int kChainXPad = 8;           // bf16 elements after each staged row (ldmatrix rows in distinct banks)
constexpr int kChainMaxStages = 1 << 16;

// Shared memory: the ring, the staged activations (rows of K + kChainXPad), two buffers of the consumers' partial sums
// (warps 1.. hand warp 0 their 2 x 4 fp32 per lane), the full and empty barriers, the consumers' stage.
constexpr int kChainRingBytes = kChainSlots * kChainSlotBytes;
constexpr int kChainXBytes = (kChainMaxXElems + kChainMaxRows * kChainXPad) * 2;
constexpr int kChainRedBytes = 2 * kChainConsumerWarps * 8 * 32 * 4;
constexpr int kChainBarBytes = 2 * kChainSlots * 8;
// After the barriers: the stage whose dependency the consumers last passed (the producer's throttle, see
// w4a16_chain's stages_ahead).
constexpr int kChainFlagBytes = 16;
constexpr int kChainSmemBytes = kChainRingBytes + kChainXBytes + kChainRedBytes + kChainBarBytes + kChainFlagBytes;
// stages_ahead without a limit: the producer fills whatever slot is free.
constexpr int kChainAnyStagesAhead = 1 << 30;
static_assert(kChainRingBytes % 128 == 0 && kChainXBytes % 16 == 0 && kChainRedBytes % 16 == 0,
              "regions stay 16-byte aligned");
static_assert(kChainSmemBytes <= 227 * 1024, "one CTA per SM within Hopper's 227 KB of dynamic shared memory");

// Stage s's jobs (32-column blocks j = 0 .. N / 32 - 1) are dealt round-robin to the CTAs, starting where stage s - 1's
// left off (rot_s = sum over earlier stages of N / 32, modulo ctas), so a CTA that got one block more in one stage
// gets its share later. CTA c's first job of a stage; its others follow every `ctas`.
FT_HD int chain_first_job(int cta, int ctas, int64_t rot) {
  return static_cast<int>(((static_cast<int64_t>(cta) - rot) % ctas + ctas) % ctas);
}
// Bytes of the scales a slot carries (the groups of its kChainSlotK k).
FT_HD int chain_slot_scale_bytes(int group) { return (kChainSlotK / group) * 64; }
// Slot q (0 .. K / kChainSlotK - 1) of a block goes to consumer warp q % kChainConsumerWarps; a warp's c-th slot
// (counted over the whole launch) sits in ring slot chain_ring_slot(warp, c) and is that slot's use chain_slot_use(c)
// (its full barrier's phase).
FT_HD int chain_slot_warp(int q) { return q % kChainConsumerWarps; }
FT_HD uint32_t chain_ring_slot(int warp, uint32_t c) {
  return static_cast<uint32_t>(warp) * kChainSlotsPerWarp + c % kChainSlotsPerWarp;
}
FT_HD uint32_t chain_slot_use(uint32_t c) { return c / kChainSlotsPerWarp; }
// Byte offsets of slot q of 32-column block j in the packed weights (kChainSlotBlocks blocks of 512 bytes, [n block][k block]) and
// in the packed scales (64 bytes per (n block, group), the slot's kChainSlotK / group groups).
FT_HD int64_t chain_slot_weight_offset(int64_t j, int K, int q) {
  return (j * (K / 32) + static_cast<int64_t>(q) * kChainSlotBlocks) * 512;
}
FT_HD int64_t chain_slot_scale_offset(int64_t j, int K, int group, int q) {
  return (j * (K / group) + static_cast<int64_t>(q) * (kChainSlotK / group)) * 64;
}

}  // namespace futransformer::cuda::w4a16
