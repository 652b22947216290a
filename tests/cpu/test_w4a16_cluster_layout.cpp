// CPU tests of the W4A16 GEMM's split-K inside thread-block clusters (src/cuda/gemm_w4a16_cluster.cuh): the work map
// of cluster_finish, replayed on the host with the same index functions (gemm_w4a16_layout.h), and the rule that says
// which launches use it. The GPU test (GemmW4A16EpilogueGpu.ClusterSplitKEqualsReduceKernel) checks the results.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"

namespace {

namespace w4 = futransformer::cuda::w4a16;

// The CTA sizes of the instances with a cluster path: 8 warps (v2, the warpgroup path, v4 w8s*), 16, 24, 28.
constexpr int kThreadCounts[] = {256, 512, 768, 896};

// Every float4 unit of an [M][C] tile (M = 9..32) is finished by exactly one (rank, thread) for 2..16 ranks; with
// SwiGLU every output column of the tile's range is written once, from a gate unit and its up unit in the same row.
TEST(W4A16ClusterLayout, RanksCoverEveryUnitOnceAndSwiGluPairsStayInTheirRow) {
  for (int warps_n : {1, 2, 4, 7, 8, 14}) {
    const int C = w4::kBlockN * warps_n;
    for (int M = w4::kClusterMinRows; M <= w4::kClusterLimitRows; ++M) {
      const int units = M * C / 4;
      for (int splits = 2; splits <= w4::kClusterLimitSplits; ++splits) {
        for (int T : kThreadCounts) {
          SCOPED_TRACE(testing::Message() << "C " << C << " M " << M << " splits " << splits << " threads " << T);
          std::vector<int> finished(static_cast<size_t>(units), 0);
          std::vector<int> outputs(static_cast<size_t>(M) * C / 2, 0);  // SwiGLU: [M][C / 2] of the tile's range
          for (int rank = 0; rank < splits; ++rank) {
            for (int tid = 0; tid < T; ++tid) {
              for (int u = rank * T + tid; u < units; u += splits * T) {
                ++finished[static_cast<size_t>(u)];
                const int m = w4::cluster_unit_row(u, C), c = w4::cluster_unit_col(u, C);
                ASSERT_EQ(m * C + c, 4 * u);
                if (w4::cluster_unit_is_up(c)) continue;
                const int up = w4::cluster_up_unit(u);
                ASSERT_LT(up, units);
                ASSERT_EQ(w4::cluster_unit_row(up, C), m) << "the up unit of gate unit " << u << " is in another row";
                ASSERT_TRUE(w4::cluster_unit_is_up(w4::cluster_unit_col(up, C)));
                // Output columns relative to the tile's first (col0 is a multiple of C, so of 2 kSwiGluRun).
                const int64_t h = w4::swiglu_out_col(c);
                ASSERT_EQ(w4::swiglu_gate_col(h), c);
                for (int k = 0; k < 4; ++k) ++outputs[static_cast<size_t>(m) * (C / 2) + static_cast<size_t>(h) + k];
              }
            }
          }
          for (int u = 0; u < units; ++u) ASSERT_EQ(finished[static_cast<size_t>(u)], 1) << "unit " << u;
          for (size_t i = 0; i < outputs.size(); ++i) ASSERT_EQ(outputs[i], 1) << "SwiGLU output " << i;
        }
      }
    }
  }
}

// The rule: 2..kMaxClusterSplits slices, M = kClusterMinRows..kClusterMaxRows, and the [M][C] fp32 tile within the
// tiling's shared memory; with raised limits (for measurements) up to kClusterLimitSplits slices and kClusterLimitRows
// rows.
TEST(W4A16ClusterLayout, AppliesToTwoToEightSlicesAtNineToSixteenRows) {
  w4::Tiling t;
  t.variant = w4::Variant::v4;
  t.warps = 16;
  t.stages = 16;
  t.warps_n = 8;
  t.warps_k = 2;
  t.m_tiles = 1;
  const int K = 4096, group = 128;
  for (int M = 1; M <= 32; ++M) {
    t.rows = M;
    t.m_tiles = (M + 15) / 16;
    for (int splits = 1; splits <= 12; ++splits) {
      t.splits = splits;
      const bool want = splits >= 2 && splits <= 8 && M >= 9 && M <= 16;
      EXPECT_EQ(w4::cluster_reduce_applies(t, M, K, group), want) << "M " << M << " splits " << splits;
    }
  }
  // Raised limits (measurements): up to kClusterLimitRows rows and kClusterLimitSplits slices, still from 9 rows.
  for (int M = 1; M <= 32; ++M) {
    t.rows = M;
    t.m_tiles = (M + 15) / 16;
    for (int splits = 1; splits <= 20; ++splits) {
      t.splits = splits;
      const bool want = splits >= 2 && splits <= 16 && M >= 9 && M <= 32;
      EXPECT_EQ(w4::cluster_reduce_applies(t, M, K, group, w4::kClusterLimitRows, w4::kClusterLimitSplits), want)
          << "raised limits, M " << M << " splits " << splits;
    }
  }
  // A tile larger than the tiling's shared memory keeps the reduce kernel.
  t.rows = 16;
  t.m_tiles = 1;
  t.splits = 2;
  t.stages = 2;
  t.warps = 8;
  t.warps_k = 1;
  t.warps_n = 8;
  const int64_t tile = w4::cluster_tile_bytes(16, 8);
  EXPECT_EQ(tile, 16 * 256 * 4);
  EXPECT_EQ(w4::cluster_reduce_applies(t, 16, 256, group), w4::smem_layout(t, 256, group).total >= tile);
  EXPECT_LT(w4::smem_layout(t, 256, group).total, tile) << "the case meant to be too small is not";
  EXPECT_FALSE(w4::cluster_reduce_applies(t, 16, 256, group));
}

}  // namespace
