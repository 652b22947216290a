// CPU checks of the INT4 → BF16 dequantisation of packed W4A16 weights (cuda::int4_dequant_bf16):
//  1. its CPU twin (formats::int4_dequantize_bf16_mma_order) is the canonical dequantisation (int4_dequantize, fp32)
//     rounded to BF16 once, rows permuted as the packing permutes them;
//  2. a lane-by-lane replay of the kernel's index maps (src/cuda/int4_dequant_layout.h: the 16-byte load per lane,
//     scale lookups, staging words, copy-out chunks, output rows) over every CTA of the grid reproduces the twin and
//     writes every output element exactly once — K tails with idle warps, groups 32/64/128, both scale types, both
//     packings and both output orders;
//  3. the staging stores are free of shared-memory bank conflicts, as the pitch comment claims.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <set>
#include <vector>

#include "cuda/engine/int4_dequant_heuristics.h"
#include "cuda/gemm_w4a16_layout.h"
#include "cuda/int4_dequant_layout.h"
#include "futransformer/eval/report.h"
#include "futransformer/io/synthetic.h"
#include "futransformer/recipe.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/int4.h"
#include "futransformer/formats/int4_mma.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4MmaRows;
using formats::Int4Weight;
using formats::ScaleType;
namespace w4 = futransformer::cuda::w4a16;
namespace dq = futransformer::cuda::int4_dequant;
using test::w4a16::random_weight;
using test::w4a16::scale_value;

struct Shape {
  int64_t N, K, group;
};
// K = 320 and 96: the last CTA column has 2 and 3 of its 8 warps busy; K = 512: two full columns; N = 32: one n block.
constexpr Shape kShapes[] = {{32, 32, 32}, {96, 320, 32}, {96, 320, 64}, {64, 96, 32}, {64, 512, 128}, {160, 256, 128},
                             {32, 384, 128}};

constexpr uint16_t kPoison = 0xFFFF;  // a BF16 NaN: what an element never written would hold

// The kernel, thread by thread: words/scales as the repackers give them; `to_canonical` as the launcher derives it.
// `writes` counts the stores that hit each output element.
std::vector<uint16_t> emulate(const std::vector<uint32_t>& words, const std::vector<uint16_t>& scales, int64_t N,
                              int64_t K, int64_t group, ScaleType st, bool to_canonical, std::vector<int>* writes) {
  std::vector<uint16_t> out(static_cast<size_t>(N * K), kPoison);
  writes->assign(out.size(), 0);
  const int64_t k_blocks = K / w4::kBlockK, groups = K / group;
  const int64_t k_tiles = (K + dq::kTileCols - 1) / dq::kTileCols;
  for (int64_t nb = 0; nb < N / dq::kTileRows; ++nb) {
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      std::vector<uint32_t> stage(dq::kStageWords, 0xDEADBEEFu);
      std::vector<int> staged(dq::kStageWords, 0);
      for (int warp = 0; warp < dq::kWarps; ++warp) {
        const int64_t kb = kt * dq::kTileBlocks + warp;
        if (kb >= k_blocks) continue;
        for (int lane = 0; lane < w4::kWarpSize; ++lane) {
          const size_t v = static_cast<size_t>(((nb * k_blocks + kb) * w4::kWarpSize + lane) * w4::kWordsPerLane);
          const int64_t g = kb * w4::kBlockK / group;
          float s[w4::kTilesPerBlock];
          for (int tile = 0; tile < w4::kTilesPerBlock; ++tile) {
            const int64_t si = dq::scale_index(nb, g, groups, tile * 8 + (lane >> 2));
            s[tile] = scale_value(scales[static_cast<size_t>(si)], st);
          }
          for (int w = 0; w < w4::kWordsPerLane; ++w) {
            for (int p = 0; p < 4; ++p) {
              EXPECT_EQ(w4::nibble_coords(lane, w, p, 0).n, dq::slot_tile(w, p) * 8 + (lane >> 2));
              const float sc = s[dq::slot_tile(w, p)];
              const uint32_t lo = (words[v + w] >> w4::nibble_shift(p, 0)) & 0xfu;
              const uint32_t hi = (words[v + w] >> w4::nibble_shift(p, 1)) & 0xfu;
              const int sw = dq::stage_word(warp, lane, w, p);
              const uint32_t a = f32_to_bf16(static_cast<float>(static_cast<int>(lo) - 8) * sc);
              const uint32_t b = f32_to_bf16(static_cast<float>(static_cast<int>(hi) - 8) * sc);
              stage[static_cast<size_t>(sw)] = a | b << 16;
              ++staged[static_cast<size_t>(sw)];
            }
          }
        }
      }
      const int64_t col0 = kt * dq::kTileCols, cols = std::min<int64_t>(dq::kTileCols, K - col0);
      for (int c = 0; c < dq::kTileChunks; ++c) {
        const int r = dq::chunk_row(c), col = dq::chunk_col(c);
        if (col >= cols) continue;
        const int64_t orow = dq::output_row(nb * dq::kTileRows + r, N, to_canonical);
        for (int e = 0; e < dq::kChunkElems; ++e) {
          const size_t sw = static_cast<size_t>(r * dq::kPitchWords + (col + e) / 2);
          EXPECT_EQ(staged[sw], 1) << "a copied staging word was written " << staged[sw] << " times";
          const uint16_t val = static_cast<uint16_t>((col + e) % 2 ? stage[sw] >> 16 : stage[sw] & 0xffffu);
          const size_t o = static_cast<size_t>(orow * K + col0 + col + e);
          out[o] = val;
          ++(*writes)[o];
        }
      }
    }
  }
  return out;
}

TEST(Int4DequantTwin, IsTheCanonicalDequantisationRoundedOnceInPackedRowOrder) {
  uint32_t seed = 3;
  for (const Shape& sh : kShapes) {
    for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
      SCOPED_TRACE(testing::Message() << sh.N << " x " << sh.K << " group " << sh.group
                                      << (st == ScaleType::BF16 ? " BF16" : " F16") << " scales");
      const Int4Weight w = random_weight(sh.N, sh.K, sh.group, st, ++seed);
      const std::vector<float> f = formats::int4_dequantize(w);
      const std::vector<uint16_t> canon = formats::int4_dequantize_bf16_mma_order(w);
      ASSERT_EQ(canon.size(), f.size());
      int64_t rounded = 0;  // values the BF16 conversion changed: the test would be weak without some
      for (size_t i = 0; i < f.size(); ++i) {
        ASSERT_EQ(canon[i], f32_to_bf16(f[i])) << "element " << i;
        rounded += bf16_to_f32(canon[i]) != f[i];
      }
      EXPECT_GT(rounded, 0) << "no value needed rounding: the shape does not exercise the BF16 conversion";
      const std::vector<uint16_t> inter = formats::int4_dequantize_bf16_mma_order(w, Int4MmaRows::swiglu_interleaved);
      EXPECT_EQ(inter, formats::int4_dequantize_bf16_mma_order(formats::int4_swiglu_interleave_rows(w)));
      EXPECT_NE(inter, canon);
      for (int64_t n = 0; n < sh.N; ++n)
        for (int64_t k = 0; k < sh.K; k += 7)
          ASSERT_EQ(inter[static_cast<size_t>(n * sh.K + k)],
                    canon[static_cast<size_t>(w4::swiglu_source_row(n, sh.N / 2) * sh.K + k)]);
    }
  }
}

TEST(Int4DequantTwin, RejectsWhatTheGemmRejects) {
  Int4Weight w = random_weight(64, 64, 32, ScaleType::F16, 1);
  w.rows = 48;  // not a multiple of 32 (and the buffers no longer match)
  EXPECT_THROW(formats::int4_dequantize_bf16_mma_order(w), Error);
}

TEST(Int4DequantEmulation, KernelIndexMapsReproduceTheTwinAndWriteEveryElementOnce) {
  uint32_t seed = 11;
  for (const Shape& sh : kShapes) {
    for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
      const Int4Weight w = random_weight(sh.N, sh.K, sh.group, st, ++seed);
      for (Int4MmaRows packing : {Int4MmaRows::canonical, Int4MmaRows::swiglu_interleaved}) {
        for (bool canonical_out : {false, true}) {
          SCOPED_TRACE(testing::Message() << sh.N << " x " << sh.K << " group " << sh.group
                                          << (st == ScaleType::BF16 ? " BF16" : " F16") << " scales, packing "
                                          << (packing == Int4MmaRows::canonical ? "canonical" : "interleaved")
                                          << ", output " << (canonical_out ? "canonical" : "packed") << " rows");
          const bool to_canonical = packing == Int4MmaRows::swiglu_interleaved && canonical_out;
          std::vector<int> writes;
          const std::vector<uint16_t> got =
              emulate(formats::repack_int4_for_mma(w, packing), formats::repack_int4_scales_for_mma(w, packing), sh.N,
                      sh.K, sh.group, st, to_canonical, &writes);
          const std::vector<uint16_t> want =
              formats::int4_dequantize_bf16_mma_order(w, canonical_out ? Int4MmaRows::canonical : packing);
          for (size_t i = 0; i < writes.size(); ++i) ASSERT_EQ(writes[i], 1) << "output element " << i;
          ASSERT_EQ(got, want);
        }
      }
    }
  }
}

TEST(Int4DequantEmulation, StagingStoresAreBankConflictFree) {
  for (int warp = 0; warp < dq::kWarps; ++warp) {
    for (int w = 0; w < w4::kWordsPerLane; ++w) {
      for (int p = 0; p < 4; ++p) {
        std::set<int> banks;
        for (int lane = 0; lane < w4::kWarpSize; ++lane) banks.insert(dq::stage_word(warp, lane, w, p) % 32);
        EXPECT_EQ(banks.size(), 32u) << "warp " << warp << " word " << w << " slot " << p;
      }
    }
  }
  // Copy-out reads: a warp's 32 chunks are one staged row's 512 contiguous bytes (16-byte aligned).
  for (int c = 0; c < dq::kTileChunks; c += w4::kWarpSize) {
    for (int i = 0; i < w4::kWarpSize; ++i) {
      EXPECT_EQ(dq::chunk_row(c + i), dq::chunk_row(c));
      EXPECT_EQ(dq::chunk_col(c + i), i * dq::kChunkElems);
    }
    EXPECT_EQ((dq::chunk_row(c) * dq::kPitchWords * 4) % 16, 0);
  }
}

// The engine's threshold: an explicit option wins, then FT_INT4_DEQUANT_MIN_ROWS, then the heuristic; 0 disables.
TEST(Int4DequantHeuristics, OptionThenEnvironmentThenDefault) {
  EXPECT_EQ(cuda::int4_dequant_min_rows(-1, nullptr), cuda::kInt4DequantMinRows);
  EXPECT_EQ(cuda::int4_dequant_min_rows(-1, ""), cuda::kInt4DequantMinRows);
  EXPECT_EQ(cuda::int4_dequant_min_rows(-1, "0"), 0);
  EXPECT_EQ(cuda::int4_dequant_min_rows(-1, "128"), 128);
  EXPECT_EQ(cuda::int4_dequant_min_rows(0, "128"), 0);
  EXPECT_EQ(cuda::int4_dequant_min_rows(64, nullptr), 64);
  for (const char* bad : {"-1", "12x", " 12", "1e3", "abc", "9999999999"}) {
    SCOPED_TRACE(bad);
    try {
      cuda::int4_dequant_min_rows(-1, bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FT_INT4_DEQUANT_MIN_ROWS"), std::string::npos) << e.what();
    }
  }
}

// The report's and info's GPU memory estimate counts the dequantisation scratch as the engine allocates it: the BF16
// copy of the largest fused projection (8B: gate|up 28672 x 4096), only for INT4 weights and passes that reach the
// threshold. The variable is cleared for the test (and restored) so the default applies.
TEST(Int4DequantHeuristics, MemoryEstimateCountsTheScratch) {
  const char* env = std::getenv("FT_INT4_DEQUANT_MIN_ROWS");
  const std::optional<std::string> saved = env ? std::optional<std::string>(env) : std::nullopt;
  unsetenv("FT_INT4_DEQUANT_MIN_ROWS");
  const ModelConfig c = synthetic_config("llama-3.1-8b");
  const PrecisionRecipe int4 = PrecisionRecipe::parse("int4-rtn-g128+kv-int4");
  const eval::GpuMemoryEstimate big = eval::estimate_gpu_memory(c, int4, 1, 4096, 2048);
  EXPECT_EQ(big.int4_dequant_scratch, 2LL * 28672 * 4096);
  EXPECT_EQ(big.total(), big.weights + big.kv_cache + big.activations + big.int4_dequant_scratch);
  EXPECT_EQ(eval::estimate_gpu_memory(c, int4, 1, 4096, cuda::kInt4DequantMinRows).int4_dequant_scratch,
            big.int4_dequant_scratch);
  EXPECT_EQ(eval::estimate_gpu_memory(c, int4, 1, 4096, cuda::kInt4DequantMinRows - 1).int4_dequant_scratch, 0);
  EXPECT_EQ(eval::estimate_gpu_memory(c, PrecisionRecipe::parse("full"), 1, 4096, 2048).int4_dequant_scratch, 0);
  setenv("FT_INT4_DEQUANT_MIN_ROWS", "0", 1);
  EXPECT_EQ(eval::estimate_gpu_memory(c, int4, 1, 4096, 2048).int4_dequant_scratch, 0);
  if (saved)
    setenv("FT_INT4_DEQUANT_MIN_ROWS", saved->c_str(), 1);
  else
    unsetenv("FT_INT4_DEQUANT_MIN_ROWS");
}

}  // namespace
