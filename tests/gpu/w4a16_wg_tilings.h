// The warpgroup tilings (staged and streamed activations) the planner gives one W4A16 problem, for the GPU tests
// that run every tiling of a problem through an epilogue (test_gemm_w4a16_epilogue.cpp, test_gemm_w4a16_qkv.cpp).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "cuda/gemm_w4a16_heuristics.h"
#include "cuda/gemm_w4a16_internal.h"
#include "futransformer/dtype.h"

namespace futransformer::test {

// The planner's staged (N a multiple of 128) and streamed (N a multiple of 256) warpgroup tilings for M <= 32, where
// the shape allows each; empty for larger M.
inline std::vector<cuda::w4a16::Tiling> wg_planned_tilings(int M, int N, int K, int group, formats::ScaleType st) {
  namespace w4 = cuda::w4a16;
  std::vector<w4::Tiling> out;
  for (bool stream : {false, true}) {
    if (M > w4::kWgMaxM || N % (stream ? 256 : 128) != 0) continue;
    w4::V4Config c;
    c.wgmma = true;
    c.stream_x = stream;
    if (stream) c.stages = w4::kWgStreamStages;
    w4::Tiling t;
    EXPECT_EQ(cuda::gemm_w4a16_plan_config(M, N, K, group, st, c, &t), cudaSuccess);
    EXPECT_TRUE(t.wgmma);
    EXPECT_EQ(t.stream_x, stream);
    out.push_back(t);
  }
  return out;
}

}  // namespace futransformer::test
