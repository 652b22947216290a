// CPU checks of the index maps of the FP8 GEMM's warp-specialised epilogues (plain C++ headers shared with the
// kernels): the gate|up packing of gemm_fp8_swiglu (a permutation that puts gate and up of one channel in one
// thread's accumulator registers, 128 channels per tile), the BF16 staging tiles of gemm_fp8_swiglu and
// gemm_fp8_residual_ws (every element staged once, consumer warps' stores conflict-free, alignment of the epilogue
// warpgroup's vector loads) and both shared-memory layouts (fit, 1024-byte aligned swizzled stages, no overlap).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_fp8_residual_ws_layout.h"
#include "cuda/gemm_fp8_swiglu_layout.h"

namespace {

namespace fp8 = futransformer::cuda::fp8;
namespace sw = futransformer::cuda::fp8sw;
namespace rw = futransformer::cuda::fp8rw;

constexpr int kBanks = 32;  // shared memory: 32 banks of 4 bytes

TEST(GemmFp8SwigluLayout, PackingIsAPermutationPairingGateAndUpPerTile) {
  for (const int64_t inter : {128, 384, 1536, 14336}) {
    std::vector<int> seen(static_cast<size_t>(2 * inter), 0);
    for (int64_t p = 0; p < 2 * inter; ++p) {
      const int64_t src = sw::packed_row_source(p, inter);
      ASSERT_TRUE(src >= 0 && src < 2 * inter) << "inter " << inter << " row " << p;
      ++seen[static_cast<size_t>(src)];
      const int64_t tile = p / sw::kBlockN;
      const int64_t channel = src % inter;
      ASSERT_GE(channel, tile * sw::kChannelsPerTile);
      ASSERT_LT(channel, (tile + 1) * sw::kChannelsPerTile) << "a tile covers its own 128 channels";
    }
    for (int v : seen) ASSERT_EQ(v, 1) << "inter " << inter << ": every canonical row packed exactly once";
  }
}

TEST(GemmFp8SwigluLayout, EachThreadHoldsGateAndUpOfTheSameChannels) {
  const int64_t inter = 1024;
  for (int half = 0; half < sw::kConsumerWarpgroups; ++half) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int j = 0; j < sw::kChannelsPerHalf / 8; ++j) {
        for (int e = 0; e < 2; ++e) {  // columns c and c + 1 of the chunk
          const int c = fp8::acc_col(lane, 4 * j + e);
          const int cu = fp8::acc_col(lane, 4 * (j + sw::kChannelsPerHalf / 8) + e);
          const int64_t g = sw::packed_row_source(3 * sw::kBlockN + half * sw::kHalfN + c, inter);
          const int64_t u = sw::packed_row_source(3 * sw::kBlockN + half * sw::kHalfN + cu, inter);
          ASSERT_LT(g, inter) << "chunk " << j << " must be a gate row";
          ASSERT_GE(u, inter) << "chunk " << j + 8 << " must be an up row";
          ASSERT_EQ(u - inter, g) << "gate and up of one channel in one thread";
          // The consumer stages that channel at ch = half * 64 + c of the tile's 128.
          ASSERT_EQ(g % sw::kChannelsPerTile, half * sw::kChannelsPerHalf + c);
        }
      }
    }
  }
}

// Bank of a 4-byte word at byte offset `off` from a 128-byte aligned base.
int bank(uint32_t off) { return static_cast<int>((off / 4) % kBanks); }

TEST(GemmFp8SwigluLayout, StagingStoresAreConflictFreeAndLoadsAligned) {
  std::set<std::pair<int, int>> staged;
  for (int half = 0; half < sw::kConsumerWarpgroups; ++half) {
    for (int warp = 0; warp < 4; ++warp) {
      for (int j = 0; j < sw::kChannelsPerHalf / 8; ++j) {
        for (int hi = 0; hi < 2; ++hi) {
          std::set<int> banks;
          for (int lane = 0; lane < 32; ++lane) {
            const int r = fp8::acc_row(warp, lane, 2 * hi), ch = half * sw::kChannelsPerHalf + fp8::acc_col(lane, 4 * j);
            const uint32_t off = sw::staging_offset(r, ch);
            ASSERT_EQ(off % 4, 0u);
            banks.insert(bank(off));
            ASSERT_TRUE(staged.insert({r, ch}).second) << "row " << r << " channel " << ch << " staged twice";
          }
          ASSERT_EQ(banks.size(), 32u) << "warp " << warp << " chunk " << j << ": a 32-lane store must hit 32 banks";
        }
      }
    }
  }
  EXPECT_EQ(staged.size(), static_cast<size_t>(sw::kBlockM * sw::kChannelsPerTile / 2));  // pairs: every other column
  // The epilogue warpgroup's 16-byte loads: row 32 pass + 8 warp + lane / 4, channels 32 (lane % 4) + 8 v.
  for (int r = 0; r < sw::kBlockM; ++r)
    for (int c0 = 0; c0 < sw::kChannelsPerTile; c0 += 8) ASSERT_EQ(sw::staging_offset(r, c0) % 16, 0u);
}

TEST(GemmFp8ResidualWsLayout, StagingStoresAreConflictFreeAndLoadsAligned) {
  std::vector<int> hits(static_cast<size_t>(fp8::kBlockM * rw::kBlockN), 0);
  for (int cw = 0; cw < rw::kConsumerWarpgroups; ++cw) {
    for (int warp = 0; warp < 4; ++warp) {
      for (int j = 0; j < rw::kBlockN / 8; ++j) {
        for (int hi = 0; hi < 2; ++hi) {
          std::set<int> banks;
          for (int lane = 0; lane < 32; ++lane) {
            const int r = cw * fp8::kWgmmaM + fp8::acc_row(warp, lane, 2 * hi), c = fp8::acc_col(lane, 4 * j);
            banks.insert(bank(2u * static_cast<uint32_t>(r * rw::kStagingPitch + c)));
            ++hits[static_cast<size_t>(r * rw::kBlockN + c)];
            ++hits[static_cast<size_t>(r * rw::kBlockN + c + 1)];
          }
          ASSERT_EQ(banks.size(), 32u);
        }
      }
    }
  }
  for (int h : hits) ASSERT_EQ(h, 1) << "every output of the tile staged exactly once";
  for (int r = 0; r < fp8::kBlockM; ++r)
    for (int lane = 0; lane < 32; ++lane) ASSERT_EQ(2 * (r * rw::kStagingPitch + 4 * lane) % 8, 0);
}

TEST(GemmFp8EpilogueLayouts, SharedMemoryFitsAndRegionsDoNotOverlap) {
  const sw::SmemLayout s = sw::smem_layout();
  EXPECT_LE(s.alloc_bytes, 227u * 1024u);
  EXPECT_EQ(s.a_stage_bytes % fp8::kSwizzleAtom, 0u);
  EXPECT_EQ(s.b_stage_bytes % fp8::kSwizzleAtom, 0u);
  EXPECT_EQ(s.b_offset, sw::kStages * s.a_stage_bytes);
  EXPECT_EQ(s.g_offset, s.b_offset + sw::kStages * s.b_stage_bytes);
  EXPECT_EQ(s.g_offset % 16, 0u);
  EXPECT_EQ(s.u_offset % 16, 0u);
  EXPECT_GE(s.scale_offset, s.u_offset + sw::kStagingBytes);
  EXPECT_GE(s.bar_offset, s.scale_offset + 4u * (sw::kBlockM + sw::kBlockN));
  EXPECT_EQ(s.bar_offset % 8, 0u);
  // Register budget of the four warpgroups within the SM's 64 K registers.
  EXPECT_LE(128 * (sw::kProducerRegs + 128 + 2 * sw::kConsumerRegs), 65536);

  const rw::SmemLayout r = rw::smem_layout();
  EXPECT_LE(r.alloc_bytes, 227u * 1024u);
  EXPECT_EQ(r.a_stage_bytes % fp8::kSwizzleAtom, 0u);
  EXPECT_EQ(r.b_stage_bytes % fp8::kSwizzleAtom, 0u);
  EXPECT_EQ(r.staging_offset, r.b_offset + rw::kStages * r.b_stage_bytes);
  EXPECT_EQ(r.staging_offset % 16, 0u);
  EXPECT_GE(r.scale_offset, r.staging_offset + 2u * fp8::kBlockM * rw::kStagingPitch);
  EXPECT_EQ(r.bar_offset % 8, 0u);
  EXPECT_LE(128 * (rw::kProducerRegs + 128 + 2 * rw::kConsumerRegs), 65536);
}

}  // namespace
