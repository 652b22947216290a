// CPU check of the W4A16 QKV epilogue's index map (w4a16::qkv_head_float4, src/cuda/gemm_w4a16_layout.h), which
// gemm_w4a16_reduce_qkv_kernel uses to read a head's split-K partial sums and store its BF16 values: over every
// (row, head item, float4 j) the kernel's warps visit, it must name exactly the float4 the plain reduce kernel would
// sum for those four elements — each of the M * N / 4 float4 once, the four elements being row r, columns
// item * head_dim + 4 j .. + 3 — so the fused reduce adds the same values in the same order and writes every qkv
// element once. Shapes: the GQA ratios, head sizes and M of the GPU test, and the 8B layer.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"

namespace {

namespace w4 = futransformer::cuda::w4a16;

struct Shape {
  int n_heads, n_kv, head_dim;
};

TEST(W4A16QkvEpilogueLayout, HeadFloat4IsThePlainReduceIndexOnceEach) {
  constexpr int kWarp = 32;
  for (const Shape s : {Shape{4, 4, 64}, Shape{8, 2, 64}, Shape{8, 1, 128}, Shape{32, 8, 128}, Shape{9, 3, 64},
                        Shape{2, 1, 8}, Shape{4, 2, 256}}) {
    const int items = s.n_heads + 2 * s.n_kv, N = items * s.head_dim;
    if (N % 32 != 0) continue;  // gemm_w4a16 needs N % 32 == 0
    for (int M : {1, 3, 8, 17, 32, 64}) {
      SCOPED_TRACE(testing::Message() << "heads " << s.n_heads << "/" << s.n_kv << " head_dim " << s.head_dim
                                      << " M " << M);
      const int64_t count4 = int64_t{M} * N / 4;
      std::vector<int> seen(static_cast<size_t>(count4), 0);
      for (int r = 0; r < M; ++r) {
        for (int item = 0; item < items; ++item) {
          // The kernel's loop: lane, lane + 32, ... below head_dim / 4, i.e. every j once.
          for (int lane = 0; lane < kWarp; ++lane) {
            for (int j = lane; j < s.head_dim / 4; j += kWarp) {
              const int64_t i = w4::qkv_head_float4(r, item, j, N, s.head_dim);
              ASSERT_GE(i, 0);
              ASSERT_LT(i, count4);
              // The plain reduce's float4 i holds elements 4 i .. 4 i + 3 of the row-major [M, N] output.
              const int64_t e = 4 * i;
              ASSERT_EQ(e / N, r) << "item " << item << " j " << j;
              ASSERT_EQ(e % N, int64_t{item} * s.head_dim + 4 * j) << "item " << item << " j " << j;
              ++seen[static_cast<size_t>(i)];
            }
          }
        }
      }
      for (int64_t i = 0; i < count4; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << "float4 " << i;
    }
  }
}

}  // namespace
