// CPU checks of the W4A16 GEMM's v4 kernel (src/cuda/gemm_w4a16_v4.cuh), which can run without a GPU:
//  1. fragments: in the swapped path (M <= 8) each packed word, dequantised to 128 + u in the order v4_slot gives,
//     is the PTX A fragment of its 16 x 16 weight tile, and one ldmatrix.x4 at xb_frag_offset gives the PTX B
//     fragments of the activations for both k16 steps of a block; in the 16-row path the words are the B
//     fragments (128 + u);
//  2. a lane-by-lane emulation of the whole v4 kernel (staging, ring slots and cp.async group accounting of the
//     pair loop, swapped and 16-row MMAs, the 136 * sum(x) chain, flushes at group and warp-range ends,
//     cross-warp and split-K reductions, output addresses) over the explicit tilings of w4a16_cases.h matches
//     the fp64 reference within the derived bound and writes every output exactly once.
// Fragments are checked against tests/mma_m16n8k16_model.h (PTX ISA tables), not against the layout header.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/w4a16_emu.h"
#include "cuda/gemm_w4a16_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "mma_m16n8k16_model.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4Weight;
using formats::ScaleType;
namespace w4 = futransformer::cuda::w4a16;
using namespace test::mma;
using namespace test::w4a16;

// ---------------------------------------------------------------------------------------------------------
// 1. Fragments.

TEST(W4A16V4Fragments, SwappedWordsAreThePtxAFragmentsOfTheWeightTile) {
  const int64_t N = 64, K = 128;
  const Int4Weight w = random_weight(N, K, 32, ScaleType::BF16, 11);
  const std::vector<uint32_t> packed = formats::repack_int4_for_mma(w);
  std::vector<int> seen(static_cast<size_t>(N * K), 0);
  for (int64_t nb = 0; nb < N / 32; ++nb) {
    for (int64_t kb = 0; kb < K / 32; ++kb) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int ks = 0; ks < 2; ++ks) {
          for (int np = 0; np < 2; ++np) {
            const uint32_t word =
                packed[static_cast<size_t>(w4::packed_word_index(nb, kb, K / 32, lane, ks * 2 + np))];
            for (int r = 0; r < 4; ++r) {
              const uint32_t a = emu_biased(word, 4 * w4::v4_slot(true, r));
              for (int h = 0; h < 2; ++h) {
                const RC rc = ptx_a(lane, r, h);  // A row = n within the 16-row tile, column = k within the step
                const int64_t n = nb * 32 + np * 16 + rc.r, k = kb * 32 + ks * 16 + rc.c;
                ASSERT_EQ(h ? hi_f(a) : lo_f(a), 128.0f + static_cast<float>(w.nibble(n, k)))
                    << "lane " << lane << " ks " << ks << " np " << np << " reg " << r;
                ++seen[static_cast<size_t>(n * K + k)];
              }
            }
          }
        }
      }
    }
  }
  for (int s : seen) ASSERT_EQ(s, 1);
}

TEST(W4A16V4Fragments, UnswappedWordsAreThePtxBFragments) {
  const int64_t N = 32, K = 64;
  const Int4Weight w = random_weight(N, K, 32, ScaleType::F16, 12);
  const std::vector<uint32_t> packed = formats::repack_int4_for_mma(w);
  for (int64_t kb = 0; kb < K / 32; ++kb) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int ks = 0; ks < 2; ++ks) {
        for (int np = 0; np < 2; ++np) {
          const uint32_t word = packed[static_cast<size_t>(w4::packed_word_index(0, kb, K / 32, lane, ks * 2 + np))];
          for (int j = 0; j < 4; ++j) {  // j = 0, 1: tile 2np registers 0, 1; j = 2, 3: tile 2np + 1
            const uint32_t b = emu_biased(word, 4 * w4::v4_slot(false, j));
            for (int h = 0; h < 2; ++h) {
              const RC kn = ptx_b(lane, j & 1, h);
              const int64_t n = (2 * np + j / 2) * 8 + kn.c, k = kb * 32 + ks * 16 + kn.r;
              ASSERT_EQ(h ? hi_f(b) : lo_f(b), 128.0f + static_cast<float>(w.nibble(n, k)));
            }
          }
        }
      }
    }
  }
}

TEST(W4A16V4Fragments, SwappedActivationLdmatrixGivesThePtxBFragments) {
  for (int rows : {1, 3, 8}) {
    const int64_t pitch = 64 + w4::kAPadElems, k_local = 32;  // second block of a 64-column slice
    std::vector<uint16_t> a_s(static_cast<size_t>(rows * pitch), 0xFFFF);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < 64; ++k)  // (k + 1) 2^r: exact in bf16 and distinct for every (row, column)
        a_s[static_cast<size_t>(r * pitch + k)] = f32_to_bf16(std::ldexp(static_cast<float>(k + 1), r));
    int64_t addr[32];
    for (int lane = 0; lane < 32; ++lane) addr[lane] = w4::xb_frag_offset(lane, k_local, pitch, rows);
    uint32_t regs[32][4];
    emu_ldmatrix(a_s, addr, 4, regs);
    for (int lane = 0; lane < 32; ++lane) {
      for (int j = 0; j < 4; ++j) {  // k16 step j / 2, B register j % 2
        for (int h = 0; h < 2; ++h) {
          const RC kn = ptx_b(lane, j % 2, h);  // k within the step, n = token row m
          const int m = kn.c < rows ? kn.c : rows - 1;  // rows past M read the last staged row
          const float want = std::ldexp(static_cast<float>(k_local + (j / 2) * 16 + kn.r + 1), m);
          ASSERT_EQ(h ? hi_f(regs[lane][j]) : lo_f(regs[lane][j]), want) << "rows " << rows << " lane " << lane;
        }
      }
    }
  }
}

TEST(W4A16V4Fragments, SwappedAccumulatorAndScaleMaps) {
  // Accumulator element (np, e) of lane is the PTX C element e of 16-row tile np with rows = n, columns = m.
  std::vector<int> seen(32 * 8, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int np = 0; np < 2; ++np) {
      for (int e = 0; e < 4; ++e) {
        const RC rc = ptx_c(lane, e);
        ASSERT_EQ(w4::swap_c_n(lane, np, e), np * 16 + rc.r);
        ASSERT_EQ(w4::swap_c_m(lane, e), rc.c);
        ++seen[static_cast<size_t>(w4::swap_c_n(lane, np, e) * 8 + w4::swap_c_m(lane, e))];
      }
      // Its scale: column n of the block is entry (t', tile, half) of the packed scales with n = 8 tile + 2t' + half.
      for (int tile = 0; tile < 4; ++tile)
        ASSERT_EQ(w4::scale_column(w4::swap_scale_t(lane), tile, w4::swap_scale_half(lane)), tile * 8 + lane / 4);
    }
  }
  for (int s : seen) ASSERT_EQ(s, 1);
}

// Two-tile swapped path (M = 9..16): the ldmatrix of tile mt gives the B fragments of token rows 8 mt .. 8 mt + 7;
// the two tiles' registers, taken as swap16_a_tile / swap16_a_breg say, are the PTX A fragment of the 16-row
// activation tile; and the lane / element the flush shuffles from holds the offset row each accumulator needs.
TEST(W4A16V4Fragments, SwappedTwoTileActivationsAndOffsetShuffle) {
  for (int rows : {9, 12, 16}) {
    const int64_t pitch = 64 + w4::kAPadElems, k_local = 32;
    std::vector<uint16_t> a_s(static_cast<size_t>(rows * pitch), 0xFFFF);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < 64; ++k)  // (2k + 1) 2^r: exact in bf16 (odd part < 2^7), one value per (row, column)
        a_s[static_cast<size_t>(r * pitch + k)] = f32_to_bf16(std::ldexp(static_cast<float>(2 * k + 1), r));
    uint32_t xb[2][32][4];
    for (int mt = 0; mt < 2; ++mt) {
      int64_t addr[32];
      for (int lane = 0; lane < 32; ++lane) addr[lane] = w4::xb_frag_offset(lane, k_local, pitch, rows, mt);
      emu_ldmatrix(a_s, addr, 4, xb[mt]);
    }
    auto value = [&](int m, int64_t k) {  // rows past M read the last staged row
      return std::ldexp(static_cast<float>(2 * k + 1), m < rows ? m : rows - 1);
    };
    for (int lane = 0; lane < 32; ++lane) {
      for (int mt = 0; mt < 2; ++mt) {
        for (int j = 0; j < 4; ++j) {
          for (int h = 0; h < 2; ++h) {
            const RC kn = ptx_b(lane, j % 2, h);
            ASSERT_EQ(h ? hi_f(xb[mt][lane][j]) : lo_f(xb[mt][lane][j]),
                      value(8 * mt + kn.c, k_local + (j / 2) * 16 + kn.r))
                << "rows " << rows << " tile " << mt << " lane " << lane;
          }
        }
      }
      for (int ks = 0; ks < 2; ++ks) {
        for (int r = 0; r < 4; ++r) {
          const uint32_t reg = xb[w4::swap16_a_tile(r)][lane][2 * ks + w4::swap16_a_breg(r)];
          for (int h = 0; h < 2; ++h) {
            const RC mk = ptx_a(lane, r, h);  // A row = token row m, column = k within the step
            ASSERT_EQ(h ? hi_f(reg) : lo_f(reg), value(mk.r, k_local + ks * 16 + mk.c)) << "lane " << lane;
          }
        }
      }
    }
  }
  // The activations-as-A chain's C element i of lane holds row ptx_c(lane, i).r; accumulator (mt, e) of lane needs
  // token row 8 mt + swap_c_m(lane, e).
  for (int lane = 0; lane < 32; ++lane)
    for (int mt = 0; mt < 2; ++mt)
      for (int e = 0; e < 4; ++e)
        ASSERT_EQ(ptx_c(w4::swap16_corr_src_lane(lane, e), w4::swap16_corr_src_elem(mt)).r,
                  8 * mt + w4::swap_c_m(lane, e))
            << "lane " << lane << " mt " << mt << " e " << e;
}

// Three/four-tile swapped path (M = 17..32): per k16 step, the ldmatrix of pair p at swap32_xb_offset gives B
// registers {0, 1} of tile 2p in registers 0, 1 and of tile 2p + 1 in 2, 3 (token rows 8j .. 8j + 7, clamped to the
// staged rows); a third tile alone comes from an .x2 (lanes 0..15 give its addresses). The offset chain of tile j
// (136 as A, these registers as B) leaves 136 * sum(x) of token row swap_c_m(lane, e) in C element e: the row of
// accumulator element e of tile j in the same lane.
TEST(W4A16V4Fragments, SwappedFourTileActivationsAndOffsets) {
  for (int rows : {17, 20, 24, 25, 31, 32}) {
    const int tiles = w4::swap_tiles(false, false, true, rows);
    ASSERT_EQ(tiles, rows <= 24 ? 3 : 4);
    const int64_t pitch = 64 + w4::kAPadElems, k_local = 32;
    std::vector<uint16_t> a_s(static_cast<size_t>(rows * pitch), 0xFFFF);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < 64; ++k)  // (2k + 1) 2^(r - 16): exact in bf16, one value per (row, column)
        a_s[static_cast<size_t>(r * pitch + k)] = f32_to_bf16(std::ldexp(static_cast<float>(2 * k + 1), r - 16));
    auto value = [&](int m, int64_t k) {  // rows past M read the last staged row
      return std::ldexp(static_cast<float>(2 * k + 1), (m < rows ? m : rows - 1) - 16);
    };
    for (int ks = 0; ks < 2; ++ks) {
      for (int p = 0; p < 2; ++p) {
        const int nmat = 2 * p + 1 < tiles ? 4 : 2;
        int64_t addr[32];
        for (int lane = 0; lane < 32; ++lane)
          addr[lane] = w4::swap32_xb_offset(lane, p, k_local + ks * 16, pitch, rows);
        uint32_t xb[32][4];
        emu_ldmatrix(a_s, addr, nmat, xb);
        for (int lane = 0; lane < 32; ++lane) {
          for (int q = 0; q < nmat / 2; ++q) {
            for (int b = 0; b < 2; ++b) {
              for (int h = 0; h < 2; ++h) {
                const RC kn = ptx_b(lane, b, h);  // k within the step, n = token row within tile 2p + q
                const uint32_t reg = xb[lane][2 * q + b];
                ASSERT_EQ(h ? hi_f(reg) : lo_f(reg), value(8 * (2 * p + q) + kn.c, k_local + ks * 16 + kn.r))
                    << "rows " << rows << " ks " << ks << " tile " << 2 * p + q << " lane " << lane;
              }
            }
          }
        }
      }
    }
  }
  // A constant A with B = one tile's registers: C element e of lane is the sum over k of its column 2t + (e & 1).
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) ASSERT_EQ(ptx_c(lane, e).c, w4::swap_c_m(lane, e));
}

// prmt.b32 d, a, b, sel (PTX ISA, default mode): byte i of d is byte (sel >> 4i) & 7 of the 8-byte value {b, a}
// (a = bytes 0..3); selector bit 3 of each nibble (sign replication) is not used by the kernel.
TEST(W4A16V4Fragments, ScaleSelectorsGiveTheFp32OfEachHalf) {
  const uint16_t lo_bf16 = f32_to_bf16(0.0123f), hi_bf16 = f32_to_bf16(-3.5f);
  const uint16_t lo_f16 = f32_to_f16(0.0234f), hi_f16 = f32_to_f16(-65504.0f);
  const uint32_t bf_pair = lo_bf16 | (static_cast<uint32_t>(hi_bf16) << 16);
  const uint32_t f16_pair = lo_f16 | (static_cast<uint32_t>(hi_f16) << 16);
  auto as_float = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  EXPECT_EQ(as_float(emu_prmt(bf_pair, 0, w4::scale_prmt_selector(0, false))), bf16_to_f32(lo_bf16));
  EXPECT_EQ(as_float(emu_prmt(bf_pair, 0, w4::scale_prmt_selector(1, false))), bf16_to_f32(hi_bf16));
  EXPECT_EQ(emu_prmt(f16_pair, 0, w4::scale_prmt_selector(0, true)), lo_f16);
  EXPECT_EQ(emu_prmt(f16_pair, 0, w4::scale_prmt_selector(1, true)), hi_f16);
}

// ---------------------------------------------------------------------------------------------------------
// 2. The whole v4 kernel, lane by lane. Mirrors gemm_w4a16_v4_kernel statement for statement.

struct EmuResult {
  std::vector<float> y;
  std::vector<int> writes;          // per output element: stores by the GEMM (splits == 1) or by the reduce step
  std::vector<int> partial_writes;  // per split-K partial element
};

using Frag4 = uint32_t[32][4];
using Acc = float[32][4];

EmuResult emulate_v4(const std::vector<uint16_t>& x, int M, const Int4Weight& w, const w4::Tiling& t) {
  const std::vector<uint32_t> packed = formats::repack_int4_for_mma(w);
  const std::vector<uint16_t> pscales = formats::repack_int4_scales_for_mma(w);
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), group = static_cast<int>(w.group);
  const int swap_tiles = w4::swap_tiles(t.rows8, t.swap16, t.swap32, t.rows);  // the kernel's kSwapTiles
  const bool swap = swap_tiles > 0, swap32 = swap_tiles > 2;
  EXPECT_EQ(swap32, t.swap32);
  const int MT = t.m_tiles, rows = t.rows;
  const int acc_tiles = swap ? 2 * swap_tiles : MT * 4, corr_tiles = swap32 ? swap_tiles : (swap ? 1 : MT);
  const int ring = t.stages, pairs = t.stages / 2;
  const int64_t groups = K / group;
  EmuResult res;
  res.y.assign(static_cast<size_t>(M) * N, NAN);
  res.writes.assign(res.y.size(), 0);
  res.partial_writes.assign(static_cast<size_t>(t.splits) * M * N, 0);
  std::vector<float> partial(res.partial_writes.size(), NAN);
  uint32_t k136[32][4], b136[32][2];
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r) k136[lane][r] = w4::kMagicSub;
    for (int r = 0; r < 2; ++r) b136[lane][r] = w4::kMagicSub;
  }
  EXPECT_EQ(lo_f(w4::kMagicSub), 136.0f);

  for (int s = 0; s < t.splits; ++s) {
    const w4::Range gr = w4::split_range(groups, t.splits, s);
    const int64_t sgm = w4::slice_groups_max(groups, t.splits), pitch = w4::a_pitch(groups, group, t.splits);
    const int64_t k0 = gr.begin * group;
    const int slice_k = static_cast<int>((gr.end - gr.begin) * group);
    for (int cx = 0; cx < N / (32 * t.warps_n); ++cx) {
      std::vector<uint16_t> a_s(static_cast<size_t>(rows * pitch), 0xFFFF);
      for (int r = 0; r < rows; ++r)
        for (int k = 0; k < slice_k; ++k)
          a_s[static_cast<size_t>(r * pitch + k)] = x[static_cast<size_t>(int64_t{r} * K + k0 + k)];
      std::vector<uint16_t> s_s(static_cast<size_t>(t.warps_n * sgm * 32), 0xFFFF);
      const int64_t nb0 = int64_t{cx} * t.warps_n;
      for (int b = 0; b < t.warps_n; ++b)
        for (int64_t j = 0; j < (gr.end - gr.begin) * 32; ++j)
          s_s[static_cast<size_t>(b * sgm * 32 + j)] =
              pscales[static_cast<size_t>(w4::packed_scale_index(nb0 + b, gr.begin, groups, 0, 0, 0) + j)];

      // acc[warp][tile][lane][e]
      std::vector<float> acc(static_cast<size_t>(t.warps) * acc_tiles * 32 * 4, 0.0f);
      auto ACC = [&](int warp, int tile, int lane, int e) -> float& {
        return acc[static_cast<size_t>(((warp * acc_tiles + tile) * 32 + lane) * 4 + e)];
      };
      for (int warp = 0; warp < t.warps; ++warp) {
        const int wn = warp % t.warps_n, wk = warp / t.warps_n;
        const int64_t nb = nb0 + wn;
        const w4::Range steps = w4::split_range(slice_k / 32, t.warps_k, wk);
        const int n_steps = static_cast<int>(steps.end - steps.begin);
        const int64_t kb0 = k0 / 32 + steps.begin;

        // The ring as the lanes of this warp see it (same schedule in every lane): the block each slot holds and
        // the cp.async group each block was committed in. Group 0 is the staging group.
        std::vector<int> slot_block(static_cast<size_t>(ring), -1);
        std::vector<int> group_of(static_cast<size_t>(n_steps), -1);
        int committed = 1;
        auto issue = [&](int block, int slot) {
          if (block >= n_steps) return;
          EXPECT_EQ(slot, block % ring);
          group_of[static_cast<size_t>(block)] = committed;
          slot_block[static_cast<size_t>(slot)] = block;
        };
        for (int p = 0; p < pairs - 1; ++p) {
          issue(2 * p, 2 * p);
          issue(2 * p + 1, 2 * p + 1);
          ++committed;
        }
        // wait_group<pairs - 1>: all but the newest pairs - 1 groups are complete; staging (group 0) must be.
        EXPECT_GT(committed - (pairs - 1), 0);

        std::vector<float> part(static_cast<size_t>(acc_tiles) * 32 * 4, 0.0f);
        std::vector<float> corr(static_cast<size_t>(corr_tiles) * 32 * 4, 0.0f);
        auto load_acc = [](const std::vector<float>& v, int tile, Acc& c) {
          for (int lane = 0; lane < 32; ++lane)
            for (int e = 0; e < 4; ++e) c[lane][e] = v[static_cast<size_t>((tile * 32 + lane) * 4 + e)];
        };
        auto store_acc = [](std::vector<float>& v, int tile, const Acc& c) {
          for (int lane = 0; lane < 32; ++lane)
            for (int e = 0; e < 4; ++e) v[static_cast<size_t>((tile * 32 + lane) * 4 + e)] = c[lane][e];
        };
        auto mma_into = [&](std::vector<float>& v, int tile, const Frag4& a, const uint32_t (&b)[32][2]) {
          Acc c;
          load_acc(v, tile, c);
          emu_mma(c, a, b);
          store_acc(v, tile, c);
        };

        auto mma_block = [&](int i) {
          uint32_t words[32][4];
          for (int lane = 0; lane < 32; ++lane)
            for (int wi = 0; wi < 4; ++wi)
              words[lane][wi] = packed[static_cast<size_t>(w4::packed_word_index(nb, kb0 + i, K / 32, lane, wi))];
          const int64_t k_local = (steps.begin + i) * 32;
          if (swap32) {
            for (int ks = 0; ks < 2; ++ks) {
              // Per k16 step: tiles 2p, 2p + 1 from one ldmatrix.x4 (a third tile alone: .x2) at swap32_xb_offset.
              uint32_t xb[2][32][4] = {};
              for (int p = 0; p < MT; ++p) {
                int64_t addr[32];
                for (int lane = 0; lane < 32; ++lane)
                  addr[lane] = w4::swap32_xb_offset(lane, p, k_local + ks * 16, pitch, rows);
                emu_ldmatrix(a_s, addr, 2 * p + 1 < swap_tiles ? 4 : 2, xb[p]);
              }
              auto b_of = [&](int j, uint32_t (&b)[32][2]) {
                for (int lane = 0; lane < 32; ++lane) {
                  b[lane][0] = xb[j >> 1][lane][2 * (j & 1)];
                  b[lane][1] = xb[j >> 1][lane][2 * (j & 1) + 1];
                }
              };
              for (int j = 0; j < swap_tiles; ++j) {
                uint32_t b[32][2];
                b_of(j, b);
                mma_into(corr, j, k136, b);
              }
              for (int np = 0; np < 2; ++np) {
                uint32_t a[32][4];
                for (int lane = 0; lane < 32; ++lane)
                  for (int r = 0; r < 4; ++r)
                    a[lane][r] = emu_biased(words[lane][2 * ks + np], 4 * w4::v4_slot(true, r));
                for (int j = 0; j < swap_tiles; ++j) {
                  uint32_t b[32][2];
                  b_of(j, b);
                  mma_into(part, j * 2 + np, a, b);
                }
              }
            }
          } else if (swap) {
            uint32_t xb[2][32][4];
            for (int mt = 0; mt < swap_tiles; ++mt) {
              int64_t addr[32];
              for (int lane = 0; lane < 32; ++lane) addr[lane] = w4::xb_frag_offset(lane, k_local, pitch, rows, mt);
              emu_ldmatrix(a_s, addr, 4, xb[mt]);
            }
            for (int ks = 0; ks < 2; ++ks) {
              uint32_t b[2][32][2];
              for (int mt = 0; mt < swap_tiles; ++mt) {
                for (int lane = 0; lane < 32; ++lane) {
                  b[mt][lane][0] = xb[mt][lane][2 * ks];
                  b[mt][lane][1] = xb[mt][lane][2 * ks + 1];
                }
              }
              for (int np = 0; np < 2; ++np) {
                uint32_t a[32][4];
                for (int lane = 0; lane < 32; ++lane)
                  for (int r = 0; r < 4; ++r) a[lane][r] = emu_biased(words[lane][2 * ks + np], 4 * w4::v4_slot(true, r));
                for (int mt = 0; mt < swap_tiles; ++mt) mma_into(part, mt * 2 + np, a, b[mt]);
              }
              if (swap_tiles == 1) {
                mma_into(corr, 0, k136, b[0]);
              } else {
                uint32_t xa[32][4];  // the activations as the A fragment of their 16-row tile
                for (int lane = 0; lane < 32; ++lane)
                  for (int r = 0; r < 4; ++r)
                    xa[lane][r] = xb[w4::swap16_a_tile(r)][lane][2 * ks + w4::swap16_a_breg(r)];
                mma_into(corr, 0, xa, b136);
              }
            }
          } else {
            for (int ks = 0; ks < 2; ++ks) {
              std::vector<std::array<std::array<uint32_t, 4>, 32>> am(static_cast<size_t>(MT));
              for (int mt = 0; mt < MT; ++mt) {
                int64_t addr[32];
                for (int lane = 0; lane < 32; ++lane)
                  addr[lane] = w4::a_frag_offset(lane, mt, k_local + ks * 16, pitch, false, rows);
                uint32_t regs[32][4];
                emu_ldmatrix(a_s, addr, 4, regs);
                for (int lane = 0; lane < 32; ++lane)
                  for (int r = 0; r < 4; ++r) am[static_cast<size_t>(mt)][static_cast<size_t>(lane)][static_cast<size_t>(r)] = regs[lane][r];
              }
              auto a_of = [&](int mt, uint32_t (&a)[32][4]) {
                for (int lane = 0; lane < 32; ++lane)
                  for (int r = 0; r < 4; ++r) a[lane][r] = am[static_cast<size_t>(mt)][static_cast<size_t>(lane)][static_cast<size_t>(r)];
              };
              for (int mt = 0; mt < MT; ++mt) {
                uint32_t a[32][4];
                a_of(mt, a);
                mma_into(corr, mt, a, b136);
              }
              for (int np = 0; np < 2; ++np) {
                uint32_t b_lo[32][2], b_hi[32][2];
                for (int lane = 0; lane < 32; ++lane) {
                  const uint32_t word = words[lane][2 * ks + np];
                  b_lo[lane][0] = emu_biased(word, 4 * w4::v4_slot(false, 0));
                  b_lo[lane][1] = emu_biased(word, 4 * w4::v4_slot(false, 1));
                  b_hi[lane][0] = emu_biased(word, 4 * w4::v4_slot(false, 2));
                  b_hi[lane][1] = emu_biased(word, 4 * w4::v4_slot(false, 3));
                }
                for (int mt = 0; mt < MT; ++mt) {
                  uint32_t a[32][4];
                  a_of(mt, a);
                  mma_into(part, mt * 4 + np * 2, a, b_lo);
                  mma_into(part, mt * 4 + np * 2 + 1, a, b_hi);
                }
              }
            }
          }
        };

        auto flush_after = [&](int i) {
          const int kcol = static_cast<int>(kb0 + i) * 32;
          if (((kcol + 32) % group) != 0 && i != n_steps - 1) return;
          const int gl = kcol / group - static_cast<int>(gr.begin);
          for (int lane = 0; lane < 32; ++lane) {
            if (swap) {
              const int64_t so = w4::s_frag_offset(wn, gl, sgm, w4::swap_scale_t(lane));
              // As the kernel: word `tile` of the 16-byte vector, the lane's half picked by prmt.
              const bool f16 = w.spec.scale_type == ScaleType::F16;
              const uint32_t sel = w4::scale_prmt_selector(w4::swap_scale_half(lane), f16);
              float sc[4];
              for (int tile = 0; tile < 4; ++tile) {
                const uint32_t pair = s_s[static_cast<size_t>(so + 2 * tile)] |
                                      (static_cast<uint32_t>(s_s[static_cast<size_t>(so + 2 * tile + 1)]) << 16);
                const uint32_t bits = emu_prmt(pair, 0, sel);
                if (f16) {
                  sc[tile] = f16_to_f32(static_cast<uint16_t>(bits));
                } else {
                  std::memcpy(&sc[tile], &bits, 4);
                }
              }
              // The offsets: in place with one tile and with swap32's chain per tile; with two, from the lane the
              // kernel's shuffle reads.
              float off[4][4];
              for (int mt = 0; mt < swap_tiles; ++mt) {
                for (int e = 0; e < 4; ++e) {
                  if (swap_tiles == 1) {
                    off[mt][e] = corr[static_cast<size_t>(lane * 4 + e)];
                  } else if (swap32) {
                    off[mt][e] = corr[static_cast<size_t>((mt * 32 + lane) * 4 + e)];
                  } else if (e < 2) {
                    off[mt][e] = corr[static_cast<size_t>(w4::swap16_corr_src_lane(lane, e) * 4 +
                                                          w4::swap16_corr_src_elem(mt))];
                  } else {
                    off[mt][e] = off[mt][e & 1];
                  }
                }
              }
              for (int mt = 0; mt < swap_tiles; ++mt)
                for (int np = 0; np < 2; ++np)
                  for (int e = 0; e < 4; ++e) {
                    const int j = mt * 2 + np;
                    const float d = part[static_cast<size_t>((j * 32 + lane) * 4 + e)] - off[mt][e];
                    ACC(warp, j, lane, e) = std::fma(d, sc[2 * np + (e >> 1)], ACC(warp, j, lane, e));
                  }
            } else {
              const int64_t so = w4::s_frag_offset(wn, gl, sgm, lane & 3);
              for (int mt = 0; mt < MT; ++mt)
                for (int tile = 0; tile < 4; ++tile)
                  for (int e = 0; e < 4; ++e) {
                    const float sc = scale_value(s_s[static_cast<size_t>(so + tile * 2 + (e & 1))], w.spec.scale_type);
                    const float d = part[static_cast<size_t>(((mt * 4 + tile) * 32 + lane) * 4 + e)] -
                                    corr[static_cast<size_t>((mt * 32 + lane) * 4 + e)];
                    ACC(warp, mt * 4 + tile, lane, e) = std::fma(d, sc, ACC(warp, mt * 4 + tile, lane, e));
                  }
            }
          }
          std::fill(part.begin(), part.end(), 0.0f);
          std::fill(corr.begin(), corr.end(), 0.0f);
        };

        int fetch = 2 * (pairs - 1);
        for (int i0 = 0; i0 < n_steps; i0 += 2) {
          // The slots about to be refilled must hold blocks this warp has consumed already (or nothing).
          for (int j = 0; j < 2; ++j) {
            const int held = slot_block[static_cast<size_t>((fetch + j) & (ring - 1))];
            EXPECT_TRUE(held < i0) << "slot of block " << held << " refilled before it was read (i0 " << i0 << ")";
          }
          issue(fetch, fetch & (ring - 1));
          issue(fetch + 1, (fetch & (ring - 1)) + 1);
          ++committed;
          fetch += 2;
          // wait_group<pairs - 1>: groups older than the newest pairs - 1 are complete.
          const int complete_below = committed - (pairs - 1);
          const bool has1 = i0 + 1 < n_steps;
          for (int b = i0; b <= i0 + (has1 ? 1 : 0); ++b) {
            EXPECT_LT(group_of[static_cast<size_t>(b)], complete_below) << "block " << b << " read before it landed";
            EXPECT_EQ(slot_block[static_cast<size_t>(((i0 & (ring - 1)) + (b - i0)))], b)
                << "slot read for block " << b << " holds another block";
          }
          mma_block(i0);
          flush_after(i0);
          if (has1) {
            mma_block(i0 + 1);
            flush_after(i0 + 1);
          }
        }
      }
      // Cross-warp reduction (warp wk == 0 adds wk = 1, 2, ... in order), then the stores.
      for (int wn = 0; wn < t.warps_n; ++wn) {
        for (int w2 = 1; w2 < t.warps_k; ++w2)
          for (int tile = 0; tile < acc_tiles; ++tile)
            for (int lane = 0; lane < 32; ++lane)
              for (int e = 0; e < 4; ++e) ACC(wn, tile, lane, e) += ACC(w2 * t.warps_n + wn, tile, lane, e);
        auto store = [&](int m, int64_t col, float v) {
          if (m >= M) return;
          if (t.splits == 1) {
            res.y[static_cast<size_t>(m * N + col)] = bf16_to_f32(f32_to_bf16(v));
            ++res.writes[static_cast<size_t>(m * N + col)];
          } else {
            partial[static_cast<size_t>((int64_t{s} * M + m) * N + col)] = v;
            ++res.partial_writes[static_cast<size_t>((int64_t{s} * M + m) * N + col)];
          }
        };
        for (int lane = 0; lane < 32; ++lane) {
          if (swap) {
            for (int mt = 0; mt < swap_tiles; ++mt)
              for (int np = 0; np < 2; ++np)
                for (int e = 0; e < 4; ++e)
                  store(8 * mt + w4::swap_c_m(lane, e), (nb0 + wn) * 32 + w4::swap_c_n(lane, np, e),
                        ACC(wn, mt * 2 + np, lane, e));
          } else {
            for (int mt = 0; mt < MT; ++mt)
              for (int tile = 0; tile < 4; ++tile)
                for (int e = 0; e < 4; ++e)
                  store(mt * 16 + w4::c_frag_row(lane, e), (nb0 + wn) * 32 + tile * 8 + w4::c_frag_col(lane, e),
                        ACC(wn, mt * 4 + tile, lane, e));
          }
        }
      }
    }
  }
  if (t.splits > 1) {
    for (size_t i = 0; i < res.y.size(); ++i) {
      float sum = partial[i];
      for (int s = 1; s < t.splits; ++s) sum += partial[static_cast<size_t>(s) * res.y.size() + i];
      res.y[i] = bf16_to_f32(f32_to_bf16(sum));
      ++res.writes[i];
    }
  }
  return res;
}

void check_emulation(TilingCase c, uint32_t seed) {
  c.t.variant = w4::Variant::v4;
  SCOPED_TRACE(testing::Message() << c.why << ": M " << c.M << " N " << c.N << " K " << c.K << " group " << c.group
                                  << " warps " << c.t.warps << " stages " << c.t.stages << " warps_n "
                                  << c.t.warps_n << " splits " << c.t.splits << " rows8 " << c.t.rows8
                                  << " swap16 " << c.t.swap16 << " swap32 " << c.t.swap32);
  const Int4Weight w = random_weight(c.N, c.K, c.group, c.st, seed);
  const std::vector<uint16_t> x = random_x(c.M, c.K, seed + 1);
  std::vector<float> abs_dot;
  const std::vector<float> ref = formats::gemm_w4a16_reference(x, c.M, w, &abs_dot);
  const std::vector<double> off = offset_dot(x, c.M, w);
  const EmuResult got = emulate_v4(x, c.M, w, c.t);
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got.writes[i], 1) << "output " << i << " written " << got.writes[i] << " times";
    const double bound = error_bound(w4::Variant::v4, ref[i], abs_dot[i], off[i]);
    ASSERT_LE(std::fabs(got.y[i] - ref[i]), bound) << "output " << i << " got " << got.y[i] << " ref " << ref[i];
    err2 += (got.y[i] - ref[i]) * (got.y[i] - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), kRelL2Tol);
  if (c.t.splits > 1)
    for (int pw : got.partial_writes) ASSERT_EQ(pw, 1);
}

TEST(W4A16V4Emulation, KernelMatchesReferenceForExplicitTilings) {
  uint32_t seed = 300;
  for (const TilingCase& c : tiling_cases()) check_emulation(c, seed += 2);
}

// The same for the other compiled (warps, stages) shapes and the swapped two-tile path (M = 9..16).
TEST(W4A16V4Emulation, KernelMatchesReferenceForV4Configs) {
  uint32_t seed = 700;
  const std::vector<TilingCase> cases = v4_config_cases();
  ASSERT_FALSE(cases.empty());
  for (const TilingCase& c : cases) check_emulation(c, seed += 2);
}


// The offset removal is what v4 adds: without it every output would be off by about 136 s sum(x), far outside the
// bound, so the emulation (and the GPU test with the same bound) can tell a missing or misplaced correction.
TEST(W4A16V4Emulation, BoundDetectsAMissingOffsetCorrection) {
  const TilingCase c = tiling_cases().front();
  const Int4Weight w = random_weight(c.N, c.K, c.group, c.st, 7);
  const std::vector<uint16_t> x = random_x(c.M, c.K, 8);
  std::vector<float> abs_dot;
  const std::vector<float> ref = formats::gemm_w4a16_reference(x, c.M, w, &abs_dot);
  const std::vector<double> off = offset_dot(x, c.M, w);
  // y + 136 * s * sum_g(x) for the first group: what a flush without its correction would give.
  int outside = 0;
  const int64_t groups = c.K / c.group;
  for (int n = 0; n < c.N; ++n) {
    double sx = 0.0;
    for (int k = 0; k < c.group; ++k) sx += bf16_to_f32(x[static_cast<size_t>(k)]);
    const double wrong = ref[static_cast<size_t>(n)] +
                         136.0 * scale_value(w.scales[static_cast<size_t>(n * groups)], c.st) * sx;
    if (std::fabs(wrong - ref[static_cast<size_t>(n)]) >
        error_bound(w4::Variant::v4, ref[static_cast<size_t>(n)], abs_dot[static_cast<size_t>(n)],
                    off[static_cast<size_t>(n)]))
      ++outside;
  }
  EXPECT_GT(outside, c.N * 9 / 10);
}

}  // namespace
