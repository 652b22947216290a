// CPU checks of the W4A16 GEMM's data layout and index maps, which can run without a GPU:
//  1. the repacked weights, read the way the kernel reads them (16-byte lane loads, lop3 magic-number
//     dequant), give exactly the B fragments that the PTX ISA assigns to each lane for mma.m16n8k16, and
//     unpacking them that way restores the canonical nibbles byte for byte (scales likewise);
//  2. a lane-by-lane emulation of the whole kernel (staging, ldmatrix addresses, per-thread ring order,
//     group flushes, cross-warp and split-K reductions, output addressing) over explicit tilings matches the
//     fp64 reference and writes every output exactly once.
// The PTX fragment tables below are written from the PTX ISA, independently of src/cuda/gemm_w4a16_layout.h.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/int4_mma.h"
#include "mma_m16n8k16_model.h"
#include "cpu/w4a16_emu.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4Spec;
using formats::Int4Weight;
using formats::ScaleType;
namespace w4 = futransformer::cuda::w4a16;

// --- PTX ISA "Matrix Fragments for mma.m16n8k16" (.bf16): (row, col) of each register half of a lane. ---
using namespace test::mma;
using test::w4a16::emu_ldmatrix;
using test::w4a16::emu_mma;
using test::w4a16::random_weight;
using test::w4a16::random_x;
using test::w4a16::scale_value;

// The kernel's dequant_slot: lop3 (a & b) | c, then a bf16x2 subtract (exact for these small integers).
uint32_t emu_dequant(uint32_t word, int shift) {
  const uint32_t biased = ((word >> shift) & w4::kMagicMask) | w4::kMagicBias;
  return pack_bf16x2(lo_f(biased) - lo_f(w4::kMagicSub), hi_f(biased) - hi_f(w4::kMagicSub));
}

// ---------------------------------------------------------------------------------------------------------
// 1. Layout: the kernel's view of the repacked words is the PTX B fragment of the canonical weight.

TEST(RepackInt4, LaneFragmentsAreThePtxBFragmentsAndRoundTrip) {
  for (int64_t group : {32, 64, 128}) {
    for (ScaleType st : {ScaleType::BF16, ScaleType::F16}) {
      const int64_t N = 96, K = 256;
      const Int4Weight w = random_weight(N, K, group, st, 7 + static_cast<uint32_t>(group));
      const std::vector<uint32_t> packed = formats::repack_int4_for_mma(w);
      const std::vector<uint16_t> pscales = formats::repack_int4_scales_for_mma(w);
      ASSERT_EQ(packed.size(), static_cast<size_t>(N * K / 8));
      ASSERT_EQ(pscales.size(), w.scales.size());

      std::vector<uint8_t> rebuilt(w.qweight.size(), 0);
      std::vector<int> seen(static_cast<size_t>(N * K), 0);
      for (int64_t nb = 0; nb < N / 32; ++nb) {
        for (int64_t kb = 0; kb < K / 32; ++kb) {
          for (int lane = 0; lane < 32; ++lane) {
            for (int ks = 0; ks < 2; ++ks) {
              for (int tile = 0; tile < 4; ++tile) {
                // As the kernel does: word ks * 2 + tile / 2, slot shifts 0/4 (tile even) or 8/12 (tile odd).
                const uint32_t word =
                    packed[static_cast<size_t>(w4::packed_word_index(nb, kb, K / 32, lane, ks * 2 + tile / 2))];
                for (int reg = 0; reg < 2; ++reg) {
                  const uint32_t b = emu_dequant(word, (tile % 2) * 8 + reg * 4);
                  for (int h = 0; h < 2; ++h) {
                    const RC kn = ptx_b(lane, reg, h);
                    const int64_t n = nb * 32 + tile * 8 + kn.c, k = kb * 32 + ks * 16 + kn.r;
                    const float v = h ? hi_f(b) : lo_f(b);
                    ASSERT_EQ(v, static_cast<float>(w.nibble(n, k)) - 8.0f) << "n " << n << " k " << k;
                    const int u = static_cast<int>(v) + 8;
                    rebuilt[static_cast<size_t>(n * (K / 2) + k / 2)] |= static_cast<uint8_t>(u << (4 * (k & 1)));
                    ++seen[static_cast<size_t>(n * K + k)];
                  }
                }
              }
            }
          }
        }
      }
      for (int s : seen) ASSERT_EQ(s, 1);
      EXPECT_EQ(rebuilt, w.qweight);

      // Scales: lane t's vector holds the scales of its C-fragment columns, tile-major.
      const int64_t groups = K / group;
      std::vector<uint16_t> scales_back(w.scales.size(), 0);
      for (int64_t nb = 0; nb < N / 32; ++nb) {
        for (int64_t g = 0; g < groups; ++g) {
          for (int lane = 0; lane < 32; ++lane) {
            const int64_t base = w4::packed_scale_index(nb, g, groups, lane % 4, 0, 0);
            for (int tile = 0; tile < 4; ++tile) {
              for (int i = 0; i < 4; ++i) {
                const int64_t n = nb * 32 + tile * 8 + ptx_c(lane, i).c;
                scales_back[static_cast<size_t>(n * groups + g)] =
                    pscales[static_cast<size_t>(base + tile * 2 + i % 2)];
              }
            }
          }
        }
      }
      EXPECT_EQ(scales_back, w.scales);
    }
  }
}

TEST(RepackInt4, RejectsWhatTheKernelCannotRun) {
  Int4Spec asym;
  asym.symmetric = false;
  std::vector<float> v(64 * 128, 0.5f);
  EXPECT_THROW(formats::repack_int4_for_mma(formats::int4_quantize_rtn(v, 64, 128, asym, "a")), Error);
  Int4Spec sym;
  std::vector<float> v2(48 * 128, 0.5f);  // 48 rows: not a multiple of 32
  EXPECT_THROW(formats::repack_int4_for_mma(formats::int4_quantize_rtn(v2, 48, 128, sym, "b")), Error);
  Int4Weight broken = formats::int4_quantize_rtn(v, 64, 128, sym, "c");
  broken.qweight.pop_back();
  EXPECT_THROW(formats::repack_int4_scales_for_mma(broken), Error);
  try {
    formats::repack_int4_for_mma(formats::int4_quantize_rtn(v, 64, 128, asym, "a"));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("symmetric"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------------
// 2. The whole kernel, lane by lane, for one tiling. Mirrors gemm_w4a16_kernel statement for statement; the
//    returned values are the BF16-rounded outputs. writes[m * N + n] counts stores of each final value.

struct EmuResult {
  std::vector<float> y;
  std::vector<int> writes;  // per output element: stores by the GEMM (splits == 1) or by the reduce step
  std::vector<int> partial_writes;
};

EmuResult emulate_kernel(const std::vector<uint16_t>& x, int M, const Int4Weight& w, const w4::Tiling& t) {
  const std::vector<uint32_t> packed = formats::repack_int4_for_mma(w);
  const std::vector<uint16_t> pscales = formats::repack_int4_scales_for_mma(w);
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), group = static_cast<int>(w.group);
  const int MT = t.m_tiles, rows = w4::a_rows(t);
  const int64_t groups = K / group;
  EmuResult res;
  res.y.assign(static_cast<size_t>(M) * N, NAN);
  res.writes.assign(res.y.size(), 0);
  res.partial_writes.assign(static_cast<size_t>(t.splits) * M * N, 0);
  std::vector<float> partial(res.partial_writes.size(), NAN);

  for (int s = 0; s < t.splits; ++s) {
    const w4::Range gr = w4::split_range(groups, t.splits, s);
    const int64_t sgm = w4::slice_groups_max(groups, t.splits), pitch = w4::a_pitch(groups, group, t.splits);
    const int64_t k0 = gr.begin * group;
    const int slice_k = static_cast<int>((gr.end - gr.begin) * group);
    for (int cx = 0; cx < N / (32 * t.warps_n); ++cx) {
      // Staging of the M rows (poison where the kernel writes nothing, so a read outside the staged data shows
      // up; emu_ldmatrix also fails on addresses outside a_s, which catches a missing row clamp).
      EXPECT_EQ(rows, M);
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

      std::vector<float> acc(static_cast<size_t>(w4::kWarps) * 32 * MT * 16, 0.0f);  // [warp][lane][mt][tile][e]
      auto A = [&](int warp, int lane, int mt, int tile, int e) -> float& {
        return acc[static_cast<size_t>((((warp * 32 + lane) * MT + mt) * 4 + tile) * 4 + e)];
      };
      for (int warp = 0; warp < w4::kWarps; ++warp) {
        const int wn = warp % t.warps_n, wk = warp / t.warps_n;
        const int64_t nb = nb0 + wn;
        const w4::Range steps = w4::split_range(slice_k / 32, t.warps_k, wk);
        const int n_steps = static_cast<int>(steps.end - steps.begin);
        const int64_t kb0 = k0 / 32 + steps.begin;
        std::vector<float> part(static_cast<size_t>(MT) * 4 * 32 * 4, 0.0f);  // [mt][tile][lane][e]
        for (int i = 0; i < n_steps; ++i) {
          for (int ks = 0; ks < 2; ++ks) {
            std::vector<std::array<std::array<uint32_t, 4>, 32>> a(static_cast<size_t>(MT));
            for (int mt = 0; mt < MT; ++mt) {
              int64_t addr[32];
              for (int lane = 0; lane < 32; ++lane)
                addr[lane] = w4::a_frag_offset(lane, mt, (steps.begin + i) * 32 + ks * 16, pitch, t.rows8, rows);
              uint32_t regs[32][4] = {};
              emu_ldmatrix(a_s, addr, t.rows8 ? 2 : 4, regs);
              for (int lane = 0; lane < 32; ++lane) {
                if (t.rows8) {
                  a[mt][lane] = {regs[lane][0], 0u, regs[lane][1], 0u};
                } else {
                  a[mt][lane] = {regs[lane][0], regs[lane][1], regs[lane][2], regs[lane][3]};
                }
              }
            }
            for (int np = 0; np < 2; ++np) {
              uint32_t b_lo[32][2], b_hi[32][2];
              for (int lane = 0; lane < 32; ++lane) {
                const uint32_t word =
                    packed[static_cast<size_t>(w4::packed_word_index(nb, kb0 + i, K / 32, lane, ks * 2 + np))];
                b_lo[lane][0] = emu_dequant(word, 0);
                b_lo[lane][1] = emu_dequant(word, 4);
                b_hi[lane][0] = emu_dequant(word, 8);
                b_hi[lane][1] = emu_dequant(word, 12);
              }
              for (int mt = 0; mt < MT; ++mt) {
                uint32_t am[32][4];
                for (int lane = 0; lane < 32; ++lane)
                  for (int r = 0; r < 4; ++r) am[lane][r] = a[mt][lane][r];
                for (int half = 0; half < 2; ++half) {
                  float c[32][4];
                  const int tile = np * 2 + half;
                  for (int lane = 0; lane < 32; ++lane)
                    for (int e = 0; e < 4; ++e)
                      c[lane][e] = part[static_cast<size_t>(((mt * 4 + tile) * 32 + lane) * 4 + e)];
                  emu_mma(c, am, half ? b_hi : b_lo);
                  for (int lane = 0; lane < 32; ++lane)
                    for (int e = 0; e < 4; ++e)
                      part[static_cast<size_t>(((mt * 4 + tile) * 32 + lane) * 4 + e)] = c[lane][e];
                }
              }
            }
          }
          const int kcol = static_cast<int>(kb0 + i) * 32;
          if (((kcol + 32) & (group - 1)) == 0 || i == n_steps - 1) {
            const int gl = kcol / group - static_cast<int>(gr.begin);
            for (int lane = 0; lane < 32; ++lane) {
              const int64_t so = w4::s_frag_offset(wn, gl, sgm, lane & 3);
              for (int mt = 0; mt < MT; ++mt)
                for (int tile = 0; tile < 4; ++tile)
                  for (int e = 0; e < 4; ++e) {
                    const float sc = scale_value(s_s[static_cast<size_t>(so + tile * 2 + (e & 1))], w.spec.scale_type);
                    float& p = part[static_cast<size_t>(((mt * 4 + tile) * 32 + lane) * 4 + e)];
                    A(warp, lane, mt, tile, e) = std::fma(p, sc, A(warp, lane, mt, tile, e));
                    p = 0.0f;
                  }
            }
          }
        }
      }
      // Cross-warp reduction (warp wk == 0 adds wk = 1, 2, ... in order), then the stores.
      for (int wn = 0; wn < t.warps_n; ++wn) {
        for (int w2 = 1; w2 < t.warps_k; ++w2)
          for (int lane = 0; lane < 32; ++lane)
            for (int j = 0; j < MT * 16; ++j)
              acc[static_cast<size_t>(wn * 32 * MT * 16 + lane * MT * 16 + j)] +=
                  acc[static_cast<size_t>((w2 * t.warps_n + wn) * 32 * MT * 16 + lane * MT * 16 + j)];
        for (int lane = 0; lane < 32; ++lane)
          for (int mt = 0; mt < MT; ++mt)
            for (int tile = 0; tile < 4; ++tile)
              for (int r = 0; r < 2; ++r) {
                const int row = mt * 16 + w4::c_frag_row(lane, 2 * r);
                if (row >= M) continue;
                for (int e = 0; e < 2; ++e) {
                  const int64_t col = (nb0 + wn) * 32 + tile * 8 + w4::c_frag_col(lane, e);
                  const float v = A(wn, lane, mt, tile, 2 * r + e);
                  if (t.splits == 1) {
                    res.y[static_cast<size_t>(row * N + col)] = bf16_to_f32(f32_to_bf16(v));
                    ++res.writes[static_cast<size_t>(row * N + col)];
                  } else {
                    partial[static_cast<size_t>((int64_t{s} * M + row) * N + col)] = v;
                    ++res.partial_writes[static_cast<size_t>((int64_t{s} * M + row) * N + col)];
                  }
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

struct EmuCase {
  int M, N, K, group;
  ScaleType st;
  w4::Tiling t;
};

// Tolerances derived from the formats: the output is rounded once to BF16 (relative 2^-8 at most); the fp32
// accumulation (per group, then scaled) differs from the fp64 reference by far less than 2^-16 of sum |x w|.
constexpr float kBf16Rounding = 1.0f / 256.0f;
constexpr float kFp32AccumulationRel = 1.0f / 65536.0f;

TEST(W4A16Emulation, KernelMatchesReferenceForExplicitTilings) {
  auto tiling = [](int M, int warps_n, int splits) {
    w4::Tiling t;
    t.m_tiles = (M + 15) / 16;
    t.rows8 = M <= 8;
    t.rows = M;
    t.warps_n = warps_n;
    t.warps_k = w4::kWarps / warps_n;
    t.splits = splits;
    return t;
  };
  const std::vector<EmuCase> cases = {
      {1, 256, 256, 128, ScaleType::BF16, tiling(1, 8, 1)},   // decode: 8-row path, one slice
      {5, 256, 640, 128, ScaleType::F16, tiling(5, 8, 3)},    // uneven split-K slices (5 groups / 3)
      {8, 128, 640, 64, ScaleType::BF16, tiling(8, 4, 2)},    // warps_k = 2
      {9, 64, 640, 32, ScaleType::F16, tiling(9, 2, 3)},      // warps_k = 4, warp ranges end mid-group
      {16, 32, 384, 128, ScaleType::BF16, tiling(16, 1, 2)},  // warps_k = 8, some warps with one block
      {17, 64, 256, 64, ScaleType::BF16, tiling(17, 2, 1)},   // two m tiles, rows 17..31 clamped to row 16
      {33, 128, 256, 128, ScaleType::F16, tiling(33, 4, 2)},  // three m tiles
      {64, 256, 512, 32, ScaleType::BF16, tiling(64, 8, 4)},  // four m tiles, group 32 flushes every block
      {3, 32, 128, 128, ScaleType::BF16, tiling(3, 1, 1)},    // more K warps than blocks: idle warps
  };
  uint32_t seed = 100;
  for (const EmuCase& c : cases) {
    SCOPED_TRACE(testing::Message() << "M " << c.M << " N " << c.N << " K " << c.K << " group " << c.group
                                    << " warps_n " << c.t.warps_n << " splits " << c.t.splits);
    const Int4Weight w = random_weight(c.N, c.K, c.group, c.st, ++seed);
    const std::vector<uint16_t> x = random_x(c.M, c.K, ++seed);
    std::vector<float> abs_dot;
    const std::vector<float> ref = formats::gemm_w4a16_reference(x, c.M, w, &abs_dot);
    const EmuResult got = emulate_kernel(x, c.M, w, c.t);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(got.writes[i], 1) << "output " << i << " written " << got.writes[i] << " times";
      const float bound = kBf16Rounding * std::fabs(ref[i]) + kFp32AccumulationRel * abs_dot[i];
      ASSERT_LE(std::fabs(got.y[i] - ref[i]), bound) << "output " << i << " got " << got.y[i] << " ref " << ref[i];
    }
    if (c.t.splits > 1)
      for (int pw : got.partial_writes) ASSERT_EQ(pw, 1);
  }
}

TEST(W4A16Emulation, SmemLayoutFitsAndAlignsForEmulatedTilings) {
  w4::Tiling t;
  t.m_tiles = 4;
  t.rows = 64;
  t.warps_n = 2;
  t.warps_k = 4;
  t.splits = 3;
  const w4::SmemLayout s = w4::smem_layout(t, 640, 32);
  EXPECT_EQ(s.a_bytes % 16, 0);
  EXPECT_EQ(s.ring_offset % 16, 0);
  EXPECT_GE(s.ring_offset, s.a_bytes + s.s_bytes);
  EXPECT_GE(s.ring_offset, s.red_bytes);
  // A pitch that is an odd multiple of 16 bytes modulo 128 keeps ldmatrix's 8 rows in distinct bank groups.
  for (int group : {32, 64, 128})
    for (int splits : {1, 2, 3, 5}) EXPECT_EQ((w4::a_pitch(4096 / group, group, splits) * 2) % 32, 16);
}

}  // namespace
