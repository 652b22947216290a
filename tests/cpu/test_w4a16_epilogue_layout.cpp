// CPU checks of the W4A16 GEMM's fused SwiGLU epilogue layout (src/cuda/gemm_w4a16_layout.h, "Fused epilogues"):
//  1. the SwiGLU-interleaved packing of a gate|up weight equals the canonical packing of the row-permuted weight
//     (words and scales), and the permutation puts gate row j and up row j eight packed rows apart;
//  2. the kernels' final stores (gemm_w4a16_epilogue.cuh) pair, in every lane, a gate accumulator with the up
//     accumulator of the same output column and token row, and write every h[m, j] exactly once: the index
//     expressions of store_c16_tile and store_swapped are replayed here against the PTX C-fragment model
//     (tests/mma_m16n8k16_model.h, written from the ISA independently of the layout header);
//  3. the split-K reduce kernel's float4 indexing reads gate j .. j + 3 and up j .. j + 3 and writes each output
//     once.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"
#include "futransformer/error.h"
#include "futransformer/formats/int4_mma.h"
#include "mma_m16n8k16_model.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4MmaRows;
using formats::Int4Weight;
using formats::ScaleType;
namespace w4 = futransformer::cuda::w4a16;
using test::mma::ptx_c;
using test::w4a16::random_weight;

TEST(W4A16SwiGluLayout, RowPermutationPairsGateAndUpRows) {
  for (int64_t inter : {16, 48, 1536}) {
    const int64_t N = 2 * inter;
    std::vector<int> seen(static_cast<size_t>(N), 0);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t src = w4::swiglu_source_row(n, inter);
      ASSERT_GE(src, 0);
      ASSERT_LT(src, N);
      ++seen[static_cast<size_t>(src)];
      // Rows 0..7 of each run of 16 are gate rows, 8..15 the up rows of the same eight outputs.
      if (n % 16 < 8) {
        EXPECT_EQ(src, (n / 16) * 8 + n % 16) << "packed row " << n;
        EXPECT_EQ(w4::swiglu_source_row(n + 8, inter), inter + src) << "packed row " << n;
        EXPECT_EQ(w4::swiglu_out_col(n), src);
      }
    }
    for (int64_t r = 0; r < N; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "canonical row " << r;
    for (int64_t j = 0; j < inter; ++j) {
      const int64_t gc = w4::swiglu_gate_col(j);
      EXPECT_EQ(w4::swiglu_source_row(gc, inter), j);
      EXPECT_EQ(w4::swiglu_source_row(gc + w4::kSwiGluRun, inter), inter + j);
      EXPECT_EQ(w4::swiglu_out_col(gc), j);
    }
  }
}

TEST(W4A16SwiGluLayout, InterleavedPackIsCanonicalPackOfPermutedRows) {
  uint32_t seed = 7;
  for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
    for (int64_t group : {32, 64, 128}) {
      for (int64_t inter : {16, 48, 256}) {
        SCOPED_TRACE(testing::Message() << "inter " << inter << " group " << group);
        const int64_t N = 2 * inter, K = 256;
        const Int4Weight w = random_weight(N, K, group, st, ++seed);
        const Int4Weight p = formats::int4_swiglu_interleave_rows(w);
        ASSERT_EQ(p.rows, w.rows);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k)
            ASSERT_EQ(p.nibble(n, k), w.nibble(w4::swiglu_source_row(n, inter), k)) << "row " << n << " col " << k;
        const std::vector<uint32_t> words = formats::repack_int4_for_mma(w, Int4MmaRows::swiglu_interleaved);
        const std::vector<uint16_t> scales = formats::repack_int4_scales_for_mma(w, Int4MmaRows::swiglu_interleaved);
        EXPECT_EQ(words, formats::repack_int4_for_mma(p));
        EXPECT_EQ(scales, formats::repack_int4_scales_for_mma(p));
        // The order matters: random weights make the interleaved packing differ from the canonical one.
        EXPECT_NE(words, formats::repack_int4_for_mma(w));
        EXPECT_NE(scales, formats::repack_int4_scales_for_mma(w));
        EXPECT_EQ(formats::repack_int4_for_mma(w, Int4MmaRows::canonical), formats::repack_int4_for_mma(w));
      }
    }
  }
}

TEST(W4A16SwiGluLayout, InterleaveRejectsWhatTheGemmCannotRun) {
  Int4Weight w = random_weight(64, 256, 64, ScaleType::F16, 3);
  w.rows = 48;  // not a multiple of 32: also the buffers no longer match
  EXPECT_THROW(formats::int4_swiglu_interleave_rows(w), Error);
  EXPECT_THROW(formats::repack_int4_for_mma(w, Int4MmaRows::swiglu_interleaved), Error);
}

// One h element written by a replayed store: checks the gate and up accumulators it reads.
struct HStore {
  int64_t m, hcol;
};

// The packed (m, n) of C element i of a lane: 16-row path, tile `tile` (x as A, weights as B: rows m, columns n).
test::mma::RC c16_mn(int lane, int tile, int i) {
  const test::mma::RC c = ptx_c(lane, i);
  return {c.r, tile * 8 + c.c};
}
// Swapped path, 16-row weight tile np (weights as A, x as B: rows n, columns m); returned as (m, n).
test::mma::RC swapped_mn(int lane, int np, int i) {
  const test::mma::RC c = ptx_c(lane, i);
  return {c.c, 16 * np + c.r};
}

TEST(W4A16SwiGluLayout, KernelStoresPairGateWithUpAndCoverEveryOutput) {
  const int64_t inter = 48, N = 2 * inter;  // three 32-column packed blocks
  const int n_blocks = static_cast<int>(N / w4::kBlockN);
  // 16-row path (v2 and v4 with M >= 9), up to four m tiles: store_c16_tile's expressions.
  {
    const int M = 64;
    std::vector<int> written(static_cast<size_t>(M * inter), 0);
    for (int nb = 0; nb < n_blocks; ++nb)
      for (int lane = 0; lane < 32; ++lane)
        for (int mt = 0; mt < M / 16; ++mt)
          for (int r = 0; r < 2; ++r)
            for (int p = 0; p < w4::kTilesPerBlock / 2; ++p)
              for (int h = 0; h < 2; ++h) {
                const int gt = w4::swiglu_gate_tile(p), ut = w4::swiglu_up_tile(p);
                const int64_t row = mt * 16 + w4::c_frag_row(lane, 2 * r);
                const int64_t col0 = int64_t{nb} * w4::kBlockN + w4::c_frag_col(lane, 0);
                const int64_t hcol = w4::swiglu_out_col(col0 + gt * 8) + h;
                const test::mma::RC g = c16_mn(lane, gt, 2 * r + h), u = c16_mn(lane, ut, 2 * r + h);
                ASSERT_EQ(mt * 16 + g.r, row);
                ASSERT_EQ(mt * 16 + u.r, row);
                ASSERT_EQ(w4::swiglu_source_row(int64_t{nb} * w4::kBlockN + g.c, inter), hcol)
                    << "lane " << lane << " tile " << gt << " elem " << 2 * r + h;
                ASSERT_EQ(w4::swiglu_source_row(int64_t{nb} * w4::kBlockN + u.c, inter), inter + hcol)
                    << "lane " << lane << " tile " << ut << " elem " << 2 * r + h;
                ++written[static_cast<size_t>(row * inter + hcol)];
              }
    for (size_t i = 0; i < written.size(); ++i) ASSERT_EQ(written[i], 1) << "h[" << i / inter << ", " << i % inter << "]";
  }
  // Swapped paths (v4, one or two n = 8 activation tiles): store_swapped's expressions.
  for (int swap_tiles : {1, 2}) {
    const int M = 8 * swap_tiles;
    std::vector<int> written(static_cast<size_t>(M * inter), 0);
    for (int nb = 0; nb < n_blocks; ++nb)
      for (int lane = 0; lane < 32; ++lane)
        for (int mt = 0; mt < swap_tiles; ++mt)
          for (int np = 0; np < 2; ++np)
            for (int e = 0; e < 2; ++e) {
              const int64_t m = 8 * mt + w4::swap_c_m(lane, e);
              const int64_t n = int64_t{nb} * w4::kBlockN + w4::swap_c_n(lane, np, e);
              const int64_t hcol = w4::swiglu_out_col(n);
              const test::mma::RC g = swapped_mn(lane, np, e), u = swapped_mn(lane, np, w4::swiglu_up_elem(e));
              ASSERT_EQ(8 * mt + g.r, m);
              ASSERT_EQ(8 * mt + u.r, m);
              ASSERT_EQ(int64_t{nb} * w4::kBlockN + g.c, n);
              ASSERT_EQ(w4::swiglu_source_row(n, inter), hcol) << "lane " << lane << " np " << np << " elem " << e;
              ASSERT_EQ(w4::swiglu_source_row(int64_t{nb} * w4::kBlockN + u.c, inter), inter + hcol)
                  << "lane " << lane << " np " << np << " elem " << w4::swiglu_up_elem(e);
              ++written[static_cast<size_t>(m * inter + hcol)];
            }
    for (size_t i = 0; i < written.size(); ++i)
      ASSERT_EQ(written[i], 1) << swap_tiles << " tiles: h[" << i / inter << ", " << i % inter << "]";
  }
}

// gemm_w4a16_reduce_swiglu_kernel's indexing over fp32 partial sums [M, N] (one slice; slices only add a stride).
TEST(W4A16SwiGluLayout, SplitKReduceReadsGateAndUpOfEachOutput) {
  for (int64_t inter : {16, 48, 1536}) {
    const int64_t N = 2 * inter, M = 3, inter4 = inter / 4, count4 = M * N / 4;
    std::vector<int> written(static_cast<size_t>(M * inter), 0);
    for (int64_t i = 0; i < count4 / 2; ++i) {
      const int64_t m = i / inter4, j = (i % inter4) * 4;
      const int64_t g4 = (m * 8 * inter4 + w4::swiglu_gate_col(j)) / 4;
      ASSERT_EQ((m * N + w4::swiglu_gate_col(j)) % 4, 0);
      const int64_t u4 = g4 + w4::kSwiGluRun / 4;
      for (int c = 0; c < 4; ++c) {
        const int64_t gflat = 4 * g4 + c, uflat = 4 * u4 + c;
        ASSERT_EQ(gflat / N, m);
        ASSERT_EQ(uflat / N, m);
        ASSERT_EQ(w4::swiglu_source_row(gflat % N, inter), j + c);
        ASSERT_EQ(w4::swiglu_source_row(uflat % N, inter), inter + j + c);
        const int64_t out = 4 * i + c;
        ASSERT_EQ(out, m * inter + j + c);
        ++written[static_cast<size_t>(out)];
      }
    }
    for (size_t i = 0; i < written.size(); ++i) ASSERT_EQ(written[i], 1) << "h element " << i;
  }
}

}  // namespace
