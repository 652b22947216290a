// CPU checks of the wgmma prefill attention's INT4 dequantisation arithmetic and of its shared-memory layout (src/cuda/attention_prefill_wgmma_layout.h)
// against the PTX ISA's canonical wgmma layouts ("Shared Memory Matrix Layout", "Canonical Layouts"), written here
// independently of the header:
//   K-major, 64-byte swizzle: ((8, m), (T, 2k)) : ((4T, SBO), (1, T))        (T = 8 bf16 = 16 bytes)
//   MN-major, 64-byte swizzle: ((T, 4, m), (8, k)) : ((1, T, LBO), (4T, SBO))
// then Swizzle<2, 4, 3> on the byte address (bits 4-5 XOR bits 7-8). For every operand the kernel hands to wgmma —
// Q and K of S = Q·Kᵀ per (group, k-step), V of O = P·V per (group, k-step) and across groups — the address the
// descriptor selects for each logical element must be where the producer / Q loader stores that element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "cuda/attention_prefill_wgmma_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/kv_cache.h"

namespace {

namespace pw = futransformer::cuda::prefill_wgmma;

constexpr uint32_t kBase = 7 * 1024;  // an arbitrary 1024-aligned region start (shared-window address)

struct Desc {
  uint32_t start, lbo, sbo, swizzle;
};
Desc decode(uint64_t d) {
  return Desc{static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
              static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4, static_cast<uint32_t>(d >> 62)};
}
uint32_t swizzle_address(uint32_t a) { return a ^ (((a >> 7) & 3u) << 4); }

// Byte address of element (row, k) of a K-major operand (row: M or N index, k < 16) under descriptor d.
uint32_t kmajor_address(const Desc& d, int row, int k) {
  const uint32_t off = static_cast<uint32_t>((row % 8) * 64 + (row / 8) * d.sbo + (k % 8) * 2 + (k / 8) * 16);
  return swizzle_address(d.start + off);
}
// Byte address of element (k, n) of an N-major B operand (k < 16 along K, n along N) under descriptor d.
uint32_t nmajor_address(const Desc& d, int k, int n) {
  const uint32_t off = static_cast<uint32_t>((n % 8) * 2 + ((n / 8) % 4) * 16 + (n / 32) * d.lbo + (k % 8) * 64 +
                                             (k / 8) * d.sbo);
  return swizzle_address(d.start + off);
}

template <int kD>
void check_operands() {
  SCOPED_TRACE(testing::Message() << "head_dim " << kD);
  constexpr int kGroups = kD / 32;
  // Every descriptor: swizzle mode 2 (64 bytes), SBO 512.
  const Desc dk = decode(pw::make_desc(kBase, pw::kLboKMajor));
  EXPECT_EQ(dk.swizzle, 2u);
  EXPECT_EQ(dk.sbo, 512u);
  EXPECT_EQ(dk.start, kBase);
  // S = Q·Kᵀ: A (64 vectors x 16 channels) and B (64 tokens x 16 channels), both K-major, per group and k-step.
  for (int g = 0; g < kGroups; ++g) {
    for (int h = 0; h < 2; ++h) {
      const Desc d = decode(pw::make_desc(kBase + pw::kmajor_step_offset(g, h), pw::kLboKMajor));
      for (int row = 0; row < 64; ++row) {
        for (int k = 0; k < 16; ++k) {
          ASSERT_EQ(kmajor_address(d, row, k), kBase + pw::element_offset(row, 32 * g + 16 * h + k))
              << "group " << g << " step " << h << " row " << row << " k " << k;
        }
      }
    }
  }
  // O = P·V: B (16 tokens x N channels), N-major; per group (N = 32, INT4) and across all groups (N = D, BF16).
  for (int kk = 0; kk < 4; ++kk) {
    for (int g = 0; g < kGroups; ++g) {
      const Desc d = decode(pw::make_desc(kBase + pw::nmajor_step_offset(g, kk), pw::kLboNMajor));
      EXPECT_EQ(d.lbo, 4096u);
      for (int k = 0; k < 16; ++k) {
        for (int n = 0; n < 32; ++n) {
          ASSERT_EQ(nmajor_address(d, k, n), kBase + pw::element_offset(16 * kk + k, 32 * g + n))
              << "k-step " << kk << " group " << g << " token " << k << " channel " << n;
        }
      }
    }
    const Desc d = decode(pw::make_desc(kBase + pw::nmajor_step_offset(0, kk), pw::kLboNMajor));
    for (int k = 0; k < 16; ++k) {
      for (int n = 0; n < kD; ++n) {
        ASSERT_EQ(nmajor_address(d, k, n), kBase + pw::element_offset(16 * kk + k, n))
            << "k-step " << kk << " token " << k << " channel " << n << " (all groups)";
      }
    }
  }
}

TEST(AttentionPrefillWgmmaLayout, DescriptorsSelectWhereTheProducerStores) {
  check_operands<128>();
  check_operands<64>();
}

// The producer's 16-byte chunks tile an operand exactly once, and the swizzle moves one chunk column of 8
// consecutive rows over all four 16-byte positions of the 64-byte rows (rows 2i and 2i + 1 share a 128-byte line).
template <int kD>
void check_tiling() {
  std::set<uint32_t> slots;
  for (int row = 0; row < 64; ++row) {
    for (int c = 0; c < kD / 8; ++c) {
      const uint32_t off = pw::operand_offset(row, c);
      EXPECT_EQ(off % 16, 0u);
      EXPECT_LT(off, static_cast<uint32_t>(pw::Layout<false, kD>::kPartBytes));
      EXPECT_TRUE(slots.insert(off).second) << "row " << row << " chunk " << c << " collides";
    }
  }
  EXPECT_EQ(slots.size(), static_cast<size_t>(64 * kD / 8));
  for (int row0 = 0; row0 < 64; row0 += 8) {
    for (int c = 0; c < 4; ++c) {
      std::set<uint32_t> banks;  // 16-byte position inside a 128-byte line
      for (int r = row0; r < row0 + 8; r += 2) banks.insert((pw::operand_offset(r, c) % 128) / 16);
      EXPECT_EQ(banks.size(), 4u) << "rows " << row0 << ".. chunk " << c;
    }
  }
}

TEST(AttentionPrefillWgmmaLayout, ChunksTileEachOperandOnce) {
  check_tiling<128>();
  check_tiling<64>();
}

// Regions: Q, the stages, the raw pages and the barriers follow each other without overlap, operand regions are
// 1024-byte aligned, and the CTA fits an SM (228 KB, 1 KB reserved per CTA) and its register file.
template <bool kInt4, int kD>
void check_regions() {
  using L = pw::Layout<kInt4, kD>;
  using S = pw::Shape;
  SCOPED_TRACE(testing::Message() << (kInt4 ? "int4" : "bf16") << " head_dim " << kD);
  EXPECT_EQ(L::kQOffset, 0);
  EXPECT_EQ(L::kStageOffset, S::kConsumers * L::kPartBytes);
  EXPECT_EQ(L::kStageOffset % 1024, 0);
  EXPECT_EQ(L::kStageBytes % 1024, 0);
  EXPECT_EQ(L::kStageBytes, 2 * L::kPartBytes);
  EXPECT_EQ(L::kRawOffset, L::kStageOffset + L::kStages * L::kStageBytes);
  EXPECT_EQ(L::kBarOffset, L::kRawOffset + (kInt4 ? L::kRawPages * L::kRawPageBytes : 0));  // the raw page buffers
  EXPECT_GE(L::kRawPages, 2);
  // the stages' full/empty barriers, then (INT4) raw_full and raw_empty per raw page buffer
  EXPECT_EQ(L::kRawFullBarrier, S::kBarriers);
  EXPECT_EQ(L::kRawEmptyBarrier, S::kBarriers + L::kRawBuffers);
  EXPECT_EQ(L::kRawBuffers, kInt4 ? L::kRawPages : 0);
  EXPECT_EQ(L::kBytes, L::kBarOffset + 8 * (S::kBarriers + 2 * L::kRawBuffers));
  EXPECT_EQ(L::kRawPageBytes % 16, 0);  // one bulk copy per page: a multiple of 16 bytes
  EXPECT_LE(S::kMinCtasPerSm * (L::kAllocBytes + 1024), 228 * 1024);
  EXPECT_LE(S::kProducerRegs + S::kConsumers * S::kConsumerRegs, 65536 / S::kMinCtasPerSm / pw::kWarpgroupThreads);
  EXPECT_EQ(S::kThreads, 128 * (1 + S::kConsumers));
  EXPECT_EQ(S::kTileVectors, 64 * S::kConsumers);
}

TEST(AttentionPrefillWgmmaLayout, RegionsAndOccupancy) {
  check_regions<true, 128>();
  check_regions<true, 64>();
  check_regions<false, 128>();
  check_regions<false, 64>();
  EXPECT_EQ((pw::Layout<true, 128>::kRawPageBytes), 9728);  // docs/formats.md's worked example
  EXPECT_EQ((pw::Layout<true, 64>::kRawPageBytes), 4864);
}

// The consumers advance descriptors (advance_desc: stage · stage bytes + the k step's offset added to stage 0's / Q's)
// instead of encoding each address: the same descriptor as make_desc of the address for every stage, k step and
// column group of every layout, and for the aligned window starts the kernel can see.
template <bool kInt4, int kD>
void check_advanced_descriptors() {
  using L = pw::Layout<kInt4, kD>;
  constexpr int kStages = (L::kRawOffset - L::kStageOffset) / L::kStageBytes;
  for (uint32_t base : {0u, 1024u, 7u * 1024u}) {
    for (int c = 0; c < 2; ++c) {
      const uint32_t q = base + L::kQOffset + static_cast<uint32_t>(c) * L::kPartBytes;
      for (int g = 0; g < kD / 64; ++g)
        for (int h = 0; h < 2; ++h)
          ASSERT_EQ(pw::advance_desc(pw::make_desc(q, pw::kLboKMajor), pw::kmajor_step_offset(g, h)),
                    pw::make_desc(q + pw::kmajor_step_offset(g, h), pw::kLboKMajor));
    }
    for (int stage = 0; stage < kStages; ++stage) {
      const uint32_t k0 = base + L::kStageOffset, v0 = k0 + L::kPartBytes;
      const uint32_t at = static_cast<uint32_t>(stage * L::kStageBytes);
      for (int g = 0; g < kD / 64; ++g) {
        for (int h = 0; h < 2; ++h)
          ASSERT_EQ(pw::advance_desc(pw::advance_desc(pw::make_desc(k0, pw::kLboKMajor), at),
                                     pw::kmajor_step_offset(g, h)),
                    pw::make_desc(k0 + at + pw::kmajor_step_offset(g, h), pw::kLboKMajor))
              << "K, stage " << stage;
        for (int kk = 0; kk < 4; ++kk)
          ASSERT_EQ(pw::advance_desc(pw::advance_desc(pw::make_desc(v0, pw::kLboNMajor), at),
                                     pw::nmajor_step_offset(g, kk)),
                    pw::make_desc(v0 + at + pw::nmajor_step_offset(g, kk), pw::kLboNMajor))
              << "V, stage " << stage;
      }
    }
  }
}

// The consumers' Q fragments: ldmatrix.x4 (lane l addresses row l % 8 of matrix l / 8; thread T receives elements
// (T / 4, 2 (T % 4)) and (T / 4, 2 (T % 4) + 1) of matrix j in register j) from a_fragment_row_offset must deliver the
// mma.m16n8k16 A fragment of the warp's rows: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8), where
// g = T / 4, t = T % 4, row offset 16 warp and channel offset 16 ks.
TEST(AttentionPrefillWgmmaLayout, QFragmentAddressesDeliverTheAFragments) {
  for (int warp = 0; warp < 4; ++warp) {
    for (int ks = 0; ks < 8; ++ks) {
      for (int T = 0; T < 32; ++T) {
        const int g = T / 4, t = T % 4;
        for (int j = 0; j < 4; ++j) {
          const uint32_t row_addr = pw::a_fragment_row_offset(warp, 8 * j + g, ks);  // matrix j, row g
          for (int e = 0; e < 2; ++e) {
            const int row = 16 * warp + g + 8 * (j & 1), channel = 16 * ks + 2 * t + 8 * (j >> 1) + e;
            ASSERT_EQ(row_addr + static_cast<uint32_t>(2 * (2 * t + e)), pw::element_offset(row, channel))
                << "warp " << warp << " ks " << ks << " thread " << T << " register " << j << " element " << e;
          }
        }
      }
    }
  }
}

TEST(AttentionPrefillWgmmaLayout, AdvancedDescriptorsEqualEncodedOnes) {
  check_advanced_descriptors<true, 128>();
  check_advanced_descriptors<true, 64>();
  check_advanced_descriptors<false, 128>();
  check_advanced_descriptors<false, 64>();
}

// 128-vector tiles cover a chunk's vectors exactly once, and positions match prefill::tile_work at 64.
TEST(AttentionPrefillWgmmaLayout, TilesCoverEveryVectorOnce) {
  for (int gqa : {1, 3, 4, 8}) {
    for (int rows : {1, 17, 64, 200, 2048}) {
      for (int tv : {64, 128}) {
        std::vector<int> seen(static_cast<size_t>(rows * gqa), 0);
        const int tiles = pw::tiles_for_rows(rows, gqa, tv);
        for (int tile = 0; tile < tiles; ++tile) {
          const auto w = pw::tile_work(rows, gqa, 37, 1 << 20, tile, tv);
          ASSERT_LT(w.v_begin, w.v_end);
          for (int v = w.v_begin; v < w.v_end; ++v) ++seen[static_cast<size_t>(v)];
          EXPECT_EQ(w.kv_len, 37 + (w.v_end - 1) / gqa + 1);
          EXPECT_EQ(pw::tile_vector(w, tv + 5), w.v_end - 1);
          if (tv == 64) {
            const auto ref = futransformer::cuda::prefill::tile_work(rows, gqa, 37, 1 << 20, tile);
            EXPECT_EQ(ref.v_begin, w.v_begin);
            EXPECT_EQ(ref.v_end, w.v_end);
            EXPECT_EQ(ref.blocks, w.blocks);
          }
        }
        for (int c : seen) ASSERT_EQ(c, 1) << "gqa " << gqa << " rows " << rows << " tile " << tv;
      }
    }
  }
}

// The grid's (x, y) = (tile rank, KV head) coordinates map onto (KV head, rank) one to one, KV head fastest in the
// hardware's dispatch order (linear y · grid_x + x): the first n_kv_heads CTAs dispatched are every head's rank 0
// (heaviest) tile, and ranks never decrease along the dispatch order.
TEST(AttentionPrefillWgmmaLayout, TileSlotsAreABijectionHeaviestFirstAcrossKvHeads) {
  namespace pf = futransformer::cuda::prefill;
  for (int n_kv : {1, 3, 8}) {
    for (int tiles : {1, 5, 64}) {
      std::vector<int> seen(static_cast<size_t>(n_kv * tiles), 0);
      int last_rank = 0;
      for (int by = 0; by < n_kv; ++by) {
        for (int bx = 0; bx < tiles; ++bx) {
          const pf::TileSlot s = pf::tile_slot(bx, by, tiles, n_kv);
          ASSERT_GE(s.kv_head, 0);
          ASSERT_LT(s.kv_head, n_kv);
          ASSERT_GE(s.rank, 0);
          ASSERT_LT(s.rank, tiles);
          ++seen[static_cast<size_t>(s.kv_head * tiles + s.rank)];
          EXPECT_GE(s.rank, last_rank) << "dispatch order must not go back to a heavier rank";
          last_rank = s.rank;
          const int linear = by * tiles + bx;
          if (linear < n_kv) {
            EXPECT_EQ(s.rank, 0);
            EXPECT_EQ(s.kv_head, linear);
          }
        }
      }
      for (int c : seen) ASSERT_EQ(c, 1) << "n_kv " << n_kv << " tiles " << tiles;
    }
  }
}

// --- The producer's INT4 -> f16 dequantisation (layout header: the steps), modelled from the PTX ISA. ---
uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {  // byte i = byte (sel nibble i & 7) of {b, a}
  const uint64_t x = a | (static_cast<uint64_t>(b) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
uint32_t lop3_ea(uint32_t a, uint32_t b, uint32_t c) { return (a & b) | c; }  // immediate 0xea
// sub.rn.f16x2 / mul.rn.f16x2: each half computed exactly in fp32 (a difference or product of two fp16 values
// is exact there) and rounded once to fp16 (RNE), which is the instruction's single rounding.
uint32_t f16x2_op(uint32_t a, uint32_t b, bool mul) {
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const float x = futransformer::f16_to_f32(static_cast<uint16_t>(a >> (16 * h)));
    const float y = futransformer::f16_to_f32(static_cast<uint16_t>(b >> (16 * h)));
    r |= static_cast<uint32_t>(futransformer::f32_to_f16(mul ? x * y : x - y)) << (16 * h);
  }
  return r;
}

// Every code of random INT4 / INT4-Hadamard pages (keys with outlier channels and both parts): the producer's
// f16 value is exactly fp16((u − z) · s) of the page's bytes, i.e. formats::kv_decode_token's value rounded once
// to f16 (relative difference ≤ 2^-11).
TEST(AttentionPrefillWgmmaDequant, F16ValuesAreTheDecodedValuesRoundedOnce) {
  using namespace futransformer;
  namespace pf = futransformer::cuda::prefill;
  namespace pw = futransformer::cuda::prefill_wgmma;
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int checked = 0;
  for (formats::KvFormat f : {formats::KvFormat::INT4, formats::KvFormat::INT4_HADAMARD}) {
    for (int hd : {64, 128}) {
      const formats::KvPageLayout L = formats::kv_page_layout(f, hd);
      std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes), 0xFF);
      std::vector<float> x(static_cast<size_t>(hd));
      for (int t = 0; t < 64; ++t) {
        for (int p = 0; p < 2; ++p) {
          for (int c = 0; c < hd; ++c) x[c] = normal(rng) * (c % 17 == 3 ? 30.0f : 1.0f) + (c % 5 == 1 ? 4.0f : 0.0f);
          formats::kv_encode_token(L, page.data(), t, p == 0 ? formats::KvPart::K : formats::KvPart::V, x);
        }
      }
      std::vector<float> decoded(static_cast<size_t>(hd));
      for (int t = 0; t < 64; ++t) {
        for (int p = 0; p < 2; ++p) {
          formats::kv_decode_token(L, page.data(), t, p == 0 ? formats::KvPart::K : formats::KvPart::V, decoded);
          for (int w = 0; w < hd / 8; ++w) {
            const int group = t * static_cast<int>(L.groups) + w / 4;
            uint32_t word, s16 = 0;
            std::memcpy(&word, page.data() + L.codes[p] + t * (hd / 2) + 4 * w, 4);
            std::memcpy(&s16, page.data() + L.scales[p] + 2 * group, 2);
            const uint32_t z = page[static_cast<size_t>(L.zeros[p] + group)];
            for (int j = 0; j < 4; ++j) {
              const uint32_t u2 = lop3_ea(prmt(word, word >> 4, pf::dequant_selector(j)), pw::kF16NibbleMask, pw::kF16Magic);
              const uint32_t v2 = f16x2_op(f16x2_op(u2, pw::f16_bias_pair(z), false), pw::f16_scale_pair(s16), true);
              for (int h = 0; h < 2; ++h) {
                const int c = 8 * w + 2 * j + h;
                const float got = f16_to_f32(static_cast<uint16_t>(v2 >> (16 * h)));
                const float want = decoded[static_cast<size_t>(c)];
                ASSERT_EQ(got, f16_to_f32(f32_to_f16(want)))
                    << formats::kv_format_name(f) << " hd " << hd << " token " << t << " part " << p << " channel "
                    << c;
                ASSERT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -11));
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 64 * 2 * (64 + 128));
}

}  // namespace
