// The FP8 GEMM kernel (src/cuda/gemm_fp8.cuh) emulated on the CPU, thread by thread and tile by tile, with its
// own index maps (src/cuda/gemm_fp8_layout.h) driving independent models of TMA, wgmma descriptors and the
// accumulator fragment (tests/cpu/hopper_model.h); the output must match the CPU twin gemm_fp8_reference and
// every output byte must be written exactly once. Also: the twin's own exactness and contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/hopper_model.h"
#include "cuda/gemm_fp8_heuristics.h"
#include "cuda/gemm_fp8_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/fp8_gemm.h"

namespace {

using namespace futransformer;
namespace fp8 = futransformer::cuda::fp8;
namespace hw = futransformer::test::hopper;

// Bounds for inputs that are not exact (same as tests/gpu/test_gemm_fp8.cpp): one BF16 rounding (half an ulp is
// 2^-9 relative; 2^-8 leaves room for the fp32 scale products) plus the accumulation error, a small multiple of
// 2^-13 of sum |a b| per 128-term block on the hardware (its ~14-bit FP8 accumulator), taken as 2^-10 overall.
constexpr double kBf16Rel = 0x1p-8;
constexpr double kAccumulationRel = 0x1p-10;

float decode(uint8_t c) {
  static const std::array<float, 256> lut = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = formats::fp8_e4m3_decode(static_cast<uint8_t>(i));
    return t;
  }();
  return lut[c];
}

struct Problem {
  int M, N, K;
  std::vector<uint8_t> a, b;
  std::vector<float> sa, sb;
};

// Small integers in [-4, 4] (exact E4M3 codes) with power-of-two scales: every step of the kernel is exact (a
// 128-term block sum is at most 2048 in magnitude, well inside the FP8 accumulator's precision), so the output
// must equal the twin's bit for bit.
Problem integer_problem(int M, int N, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{M, N, K, {}, {}, {}, {}};
  auto code = [&] { return formats::fp8_e4m3_encode(static_cast<float>(static_cast<int>(rng() % 9) - 4)); };
  auto pow2 = [&] { return std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3); };
  p.a.resize(static_cast<size_t>(M) * K);
  p.b.resize(static_cast<size_t>(N) * K);
  for (auto& v : p.a) v = code();
  for (auto& v : p.b) v = code();
  p.sa.resize(static_cast<size_t>(M));
  p.sb.resize(static_cast<size_t>(N));
  for (auto& v : p.sa) v = pow2();
  for (auto& v : p.sb) v = pow2();
  return p;
}

// Every finite code, uniformly, with scales in [2^-8, 2^-4).
Problem random_problem(int M, int N, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{M, N, K, {}, {}, {}, {}};
  auto code = [&] {
    const uint8_t c = static_cast<uint8_t>(rng());
    return (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c ^ 1) : c;  // 0x7F / 0xFF are NaN
  };
  std::uniform_real_distribution<float> scale(0x1p-8f, 0x1p-4f);
  p.a.resize(static_cast<size_t>(M) * K);
  p.b.resize(static_cast<size_t>(N) * K);
  for (auto& v : p.a) v = code();
  for (auto& v : p.b) v = code();
  p.sa.resize(static_cast<size_t>(M));
  p.sb.resize(static_cast<size_t>(N));
  for (auto& v : p.sa) v = scale(rng);
  for (auto& v : p.sb) v = scale(rng);
  return p;
}

struct Launch {
  int block_n, grid, group_m;
};

// The kernel, step by step. Returns D's BF16 bits (0xFFFF where never written); writes counts stores per byte.
std::vector<uint16_t> emulate(const Problem& p, const Launch& launch, std::vector<int>& writes) {
  const int bn = launch.block_n, stages = fp8::stages_for(bn);
  const fp8::SmemLayout L = fp8::smem_layout(bn, stages);
  const uint32_t raw = 48;  // any 16-byte aligned start of the dynamic window
  const uint32_t base = (raw + 1023u) & ~1023u;
  const int m_blocks = (p.M + fp8::kBlockM - 1) / fp8::kBlockM, n_blocks = (p.N + bn - 1) / bn;
  const int k_blocks = p.K / fp8::kBlockK, tiles = m_blocks * n_blocks;
  std::vector<uint8_t> d(static_cast<size_t>(p.M) * p.N * 2, 0xFF);
  writes.assign(d.size(), 0);
  const int regs = bn / 2;

  for (int cta = 0; cta < launch.grid; ++cta) {
    hw::Smem smem(raw + L.alloc_bytes);
    fp8::PipeState pipe;
    for (int tile = cta; tile < tiles; tile += launch.grid) {
      const fp8::TileCoord tc = fp8::tile_coord(tile, m_blocks, n_blocks, launch.group_m);
      // The scale loader warp: this tile's a and b scales into the slot, zeros past M and N.
      const uint32_t scales = base + L.scale_offset;
      auto put_f32 = [&](uint32_t addr, float v) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        for (int i = 0; i < 4; ++i) smem.at(addr + static_cast<uint32_t>(i)) = static_cast<uint8_t>(u >> (8 * i));
      };
      auto get_f32 = [&](uint32_t addr) {
        EXPECT_TRUE(addr >= scales && addr + 4 <= base + L.bar_offset) << "scale read outside the slot";
        uint32_t u = 0;
        for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(smem.get(addr + static_cast<uint32_t>(i))) << (8 * i);
        float v;
        std::memcpy(&v, &u, 4);
        return v;
      };
      for (int i = 0; i < fp8::kBlockM; ++i) {
        const int m = tc.m_block * fp8::kBlockM + i;
        put_f32(scales + 4u * static_cast<uint32_t>(i), m < p.M ? p.sa[static_cast<size_t>(m)] : 0.0f);
      }
      for (int i = 0; i < bn; ++i) {
        const int n = tc.n_block * bn + i;
        put_f32(scales + 4u * static_cast<uint32_t>(fp8::kBlockM + i), n < p.N ? p.sb[static_cast<size_t>(n)] : 0.0f);
      }
      // sum[cw][thread][reg]: the consumers' fp32 promotion registers.
      std::vector<float> sum(static_cast<size_t>(fp8::kConsumerWarpgroups * 128 * regs), 0.0f);
      for (int kb = 0; kb < k_blocks; ++kb) {
        const uint32_t a_addr = base + L.a_offset + pipe.stage * L.a_stage_bytes;
        const uint32_t b_addr = base + L.b_offset + pipe.stage * L.b_stage_bytes;
        uint32_t tx = hw::tma_load_sw128(smem, a_addr, p.a.data(), p.M, p.K, int64_t{tc.m_block} * fp8::kBlockM,
                                         int64_t{kb} * fp8::kBlockK, fp8::kBlockM);
        tx += hw::tma_load_sw128(smem, b_addr, p.b.data(), p.N, p.K, int64_t{tc.n_block} * bn,
                                 int64_t{kb} * fp8::kBlockK, bn);
        EXPECT_EQ(tx, fp8::stage_tx_bytes(bn)) << "expect_tx must match the bytes TMA delivers";
        for (int cw = 0; cw < fp8::kConsumerWarpgroups; ++cw) {
          // The four wgmmas of the block (the first starts from zero), in exact arithmetic.
          std::vector<double> acc(static_cast<size_t>(fp8::kWgmmaM * bn), 0.0);
          for (int ks = 0; ks < fp8::kKSteps; ++ks) {
            const hw::Descriptor da = hw::decode_descriptor(fp8::make_smem_desc(fp8::a_desc_addr(a_addr, cw, ks)));
            const hw::Descriptor db = hw::decode_descriptor(fp8::make_smem_desc(fp8::b_desc_addr(b_addr, ks)));
            std::vector<float> av(static_cast<size_t>(fp8::kWgmmaM * 32)), bv(static_cast<size_t>(bn * 32));
            for (int i = 0; i < fp8::kWgmmaM; ++i)
              for (int j = 0; j < 32; ++j)
                av[static_cast<size_t>(i * 32 + j)] = decode(smem.get(hw::wgmma_sw128_kmajor_address(da, i, j)));
            for (int i = 0; i < bn; ++i)
              for (int j = 0; j < 32; ++j)
                bv[static_cast<size_t>(i * 32 + j)] = decode(smem.get(hw::wgmma_sw128_kmajor_address(db, i, j)));
            for (int r = 0; r < fp8::kWgmmaM; ++r)
              for (int c = 0; c < bn; ++c)
                for (int j = 0; j < 32; ++j)
                  acc[static_cast<size_t>(r * bn + c)] +=
                      static_cast<double>(av[static_cast<size_t>(r * 32 + j)] * bv[static_cast<size_t>(c * 32 + j)]);
          }
          // The hardware hands register i of each thread the element of the PTX fragment; the kernel adds it.
          for (int t = 0; t < 128; ++t)
            for (int i = 0; i < regs; ++i)
              sum[static_cast<size_t>((cw * 128 + t) * regs + i)] += static_cast<float>(
                  acc[static_cast<size_t>(hw::ptx_d_row(t / 32, t % 32, i) * bn + hw::ptx_d_col(t % 32, i))]);
        }
        fp8::advance(pipe, stages);
      }
      // Epilogue, as in the kernel: scale, round, stage, then one TMA store per 64-column box.
      for (int cw = 0; cw < fp8::kConsumerWarpgroups; ++cw) {
        const int m0 = tc.m_block * fp8::kBlockM + cw * fp8::kWgmmaM, n0 = tc.n_block * bn;
        const uint32_t d_stage = base + L.d_offset + static_cast<uint32_t>(cw) * L.d_wg_bytes;
        for (int t = 0; t < 128; ++t) {
          const int warp = t / 32, lane = t % 32;
          const float* s = &sum[static_cast<size_t>((cw * 128 + t) * regs)];
          const int r_lo = fp8::acc_row(warp, lane, 0), r_hi = fp8::acc_row(warp, lane, 2);
          const float sa_lo = get_f32(scales + 4u * static_cast<uint32_t>(cw * fp8::kWgmmaM + r_lo));
          const float sa_hi = get_f32(scales + 4u * static_cast<uint32_t>(cw * fp8::kWgmmaM + r_hi));
          for (int j = 0; j < bn / 8; ++j) {
            const int c = fp8::acc_col(lane, 4 * j);
            EXPECT_EQ((fp8::kBlockM + c) % 2, 0) << "the b-scale pair load needs 8-byte alignment";
            const float sb0 = get_f32(scales + 4u * static_cast<uint32_t>(fp8::kBlockM + c));
            const float sb1 = get_f32(scales + 4u * static_cast<uint32_t>(fp8::kBlockM + c + 1));
            auto store = [&](int r, float lo, float hi) {
              const uint16_t l = f32_to_bf16(lo), h = f32_to_bf16(hi);
              const uint32_t a = d_stage + fp8::d_stage_offset(r, c);
              smem.at(a) = static_cast<uint8_t>(l);
              smem.at(a + 1) = static_cast<uint8_t>(l >> 8);
              smem.at(a + 2) = static_cast<uint8_t>(h);
              smem.at(a + 3) = static_cast<uint8_t>(h >> 8);
            };
            store(r_lo, s[4 * j] * sa_lo * sb0, s[4 * j + 1] * sa_lo * sb1);
            store(r_hi, s[4 * j + 2] * sa_hi * sb0, s[4 * j + 3] * sa_hi * sb1);
          }
        }
        if (m0 < p.M) {
          for (int b = 0; b < bn / fp8::kDBoxCols; ++b) {
            if (n0 + b * fp8::kDBoxCols < p.N)
              hw::tma_store_sw128(smem, d_stage + static_cast<uint32_t>(b * fp8::kDBoxBytes), d.data(), writes, p.M,
                                  int64_t{p.N} * 2, m0, int64_t{n0 + b * fp8::kDBoxCols} * 2, fp8::kWgmmaM);
          }
        }
      }
    }
  }
  std::vector<uint16_t> out(d.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint16_t>(d[2 * i] | (d[2 * i + 1] << 8));
  return out;
}

void check_emulation(const Problem& p, const Launch& launch, bool exact) {
  SCOPED_TRACE(testing::Message() << "M " << p.M << " N " << p.N << " K " << p.K << " block_n " << launch.block_n
                                  << " grid " << launch.grid << " group_m " << launch.group_m
                                  << (exact ? " exact" : " random"));
  std::vector<int> writes;
  const std::vector<uint16_t> got = emulate(p, launch, writes);
  for (size_t i = 0; i < writes.size(); ++i)
    ASSERT_EQ(writes[i], 1) << "output byte " << i << " (row " << i / 2 / p.N << ", col " << i / 2 % p.N << ")";
  const formats::Fp8GemmReference ref = formats::gemm_fp8_reference(p.a, p.b, p.sa, p.sb, p.M, p.N, p.K);
  for (size_t i = 0; i < got.size(); ++i) {
    if (exact) {
      ASSERT_EQ(got[i], ref.bf16[i]) << "row " << i / p.N << " col " << i % p.N;
    } else {
      const double bound = kBf16Rel * std::fabs(ref.value[i]) + kAccumulationRel * ref.abs_dot[i];
      ASSERT_LE(std::fabs(bf16_to_f32(got[i]) - ref.value[i]), bound) << "row " << i / p.N << " col " << i % p.N;
    }
  }
}

// Shapes with M and N tails, one K block and several, both tiles, persistent CTAs with several tiles each (and
// stage indices wrapping across tiles), groups longer and shorter than the m-blocks.
const Launch kLaunches[] = {{128, 3, 1}, {192, 2, 2}, {128, 1, 16}, {192, 5, 3}};
struct Shape {
  int M, N, K;
};
const Shape kShapes[] = {{129, 200, 256}, {1, 8, 128}, {17, 392, 384}, {300, 136, 256}, {256, 256, 768}};

TEST(GemmFp8Emulation, IntegerInputsMatchTheTwinBitForBit) {
  uint32_t seed = 100;
  for (const Shape& s : kShapes)
    for (const Launch& l : kLaunches) check_emulation(integer_problem(s.M, s.N, s.K, ++seed), l, true);
}

TEST(GemmFp8Emulation, RandomCodesMatchTheTwinWithinBounds) {
  uint32_t seed = 200;
  for (const Shape& s : kShapes) check_emulation(random_problem(s.M, s.N, s.K, ++seed), {128, 2, 2}, false);
  check_emulation(random_problem(129, 392, 256, 300), {192, 3, 1}, false);
}

TEST(GemmFp8Emulation, HeuristicLaunchesCoverTheOutput) {
  uint32_t seed = 400;
  const fp8::DeviceLimits tiny{3, 227 * 1024};  // three SMs: several tiles per persistent CTA
  for (const Shape& s : kShapes) {
    const fp8::Config c = fp8::choose_config(s.M, s.N, s.K, tiny);
    check_emulation(integer_problem(s.M, s.N, s.K, ++seed), {c.block_n, c.grid, c.group_m}, true);
  }
}

// --- The twin itself. ---

TEST(Fp8GemmReference, HandComputedProduct) {
  // A = [[1, 2], [-0.5, 448]], B = [[3, 1], [0.25, -2]], a_scale = {2, 1}, b_scale = {1, 0.5}.
  auto e = formats::fp8_e4m3_encode;
  const std::vector<uint8_t> a = {e(1), e(2), e(-0.5f), e(448)}, b = {e(3), e(1), e(0.25f), e(-2)};
  const std::vector<float> sa = {2, 1}, sb = {1, 0.5f};
  const formats::Fp8GemmReference r = formats::gemm_fp8_reference(a, b, sa, sb, 2, 2, 2);
  const double want[4] = {(3 + 2) * 2.0, (0.25 - 4) * 2.0 * 0.5, -1.5 + 448, (-0.125 - 896) * 0.5};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.value[static_cast<size_t>(i)], want[i]) << i;
    EXPECT_EQ(r.bf16[static_cast<size_t>(i)], f32_to_bf16(static_cast<float>(want[i]))) << i;
  }
  EXPECT_EQ(r.abs_dot[0], 10.0);
  EXPECT_EQ(r.abs_dot[3], (0.125 + 896) * 0.5);
}

// Every product is an integer multiple of 2^-18: summing them as 128-bit integers is exact by construction.
TEST(Fp8GemmReference, SumsAreExactOverTheWholeCodeRange) {
  const Problem p = random_problem(3, 5, 4096, 9);
  std::vector<float> ones_a(3, 1.0f), ones_b(5, 1.0f);
  const formats::Fp8GemmReference r = formats::gemm_fp8_reference(p.a, p.b, ones_a, ones_b, 3, 5, 4096);
  for (int m = 0; m < 3; ++m) {
    for (int n = 0; n < 5; ++n) {
      __int128 s = 0;
      for (int k = 0; k < 4096; ++k) {
        const double prod = static_cast<double>(decode(p.a[static_cast<size_t>(m * 4096 + k)])) *
                            decode(p.b[static_cast<size_t>(n * 4096 + k)]);
        s += static_cast<__int128>(std::ldexp(prod, 18));
      }
      EXPECT_EQ(r.value[static_cast<size_t>(m * 5 + n)], std::ldexp(static_cast<double>(s), -18)) << m << ", " << n;
    }
  }
}

TEST(Fp8GemmReference, NanCodesPropagateAndBadSizesThrow) {
  const std::vector<uint8_t> a = {formats::kFp8E4M3NaN, 0x38}, b = {0x38, 0x38};
  const std::vector<float> s1 = {1.0f};
  const formats::Fp8GemmReference r = formats::gemm_fp8_reference(a, b, s1, s1, 1, 1, 2);
  EXPECT_TRUE(std::isnan(r.value[0]));
  EXPECT_TRUE(std::isnan(bf16_to_f32(r.bf16[0])));
  EXPECT_THROW(formats::gemm_fp8_reference(a, b, s1, s1, 1, 1, 3), Error);           // A too short for K = 3
  EXPECT_THROW(formats::gemm_fp8_reference(a, b, s1, s1, 2, 1, 1), Error);           // a_scale too short
  EXPECT_THROW(formats::gemm_fp8_reference(a, b, s1, s1, 1, 1, 0), Error);           // K = 0
  EXPECT_THROW(formats::gemm_fp8_reference(a, b, s1, {}, 1, 1, 2), Error);           // b_scale missing
  EXPECT_THROW(formats::gemm_fp8_reference(a, b, s1, s1, -1, -1, -2), Error);        // negative sizes
}


// --- The block-scaled twin (one A scale per row per 128 K). ---

// a_scale [M] repeated over each row's ceil(K / 128) blocks.
std::vector<float> repeat_per_block(const std::vector<float>& sa, int K) {
  const int blocks = (K + 127) / 128;
  std::vector<float> out;
  for (float s : sa) out.insert(out.end(), static_cast<size_t>(blocks), s);
  return out;
}

TEST(Fp8GemmBlockReference, OneScalePerRowEqualsThePerRowTwinBitForBit) {
  // Random codes and fp32 scales (not powers of two: the scale products round), K with and without a tail block.
  uint32_t seed = 500;
  for (const Shape& s : {Shape{3, 7, 128}, Shape{5, 9, 384}, Shape{4, 6, 200}, Shape{2, 3, 1000}, Shape{1, 1, 1}}) {
    SCOPED_TRACE(testing::Message() << "M " << s.M << " N " << s.N << " K " << s.K);
    const Problem p = random_problem(s.M, s.N, s.K, ++seed);
    const formats::Fp8GemmReference want = formats::gemm_fp8_reference(p.a, p.b, p.sa, p.sb, p.M, p.N, p.K);
    const formats::Fp8GemmReference got =
        formats::gemm_fp8_block_a_reference(p.a, p.b, repeat_per_block(p.sa, p.K), p.sb, p.M, p.N, p.K);
    EXPECT_EQ(got.bf16, want.bf16);
    EXPECT_EQ(got.value, want.value);
    // abs_dot is a tolerance scale, summed per block: equal up to fp64 rounding.
    for (size_t i = 0; i < want.abs_dot.size(); ++i)
      EXPECT_NEAR(got.abs_dot[i], want.abs_dot[i], 1e-12 * want.abs_dot[i]) << i;
  }
}

// Small integers with a different power-of-two scale per block: every term and every sum is exact in fp64, so the
// twin must equal the hand computation (block sums as integers, times 2^e, summed) bit for bit.
TEST(Fp8GemmBlockReference, IntegerCodesWithPowerOfTwoBlockScalesAreExact) {
  for (const Shape& s : {Shape{3, 5, 384}, Shape{17, 4, 328}, Shape{1, 8, 128}}) {
    SCOPED_TRACE(testing::Message() << "M " << s.M << " N " << s.N << " K " << s.K);
    const Problem p = integer_problem(s.M, s.N, s.K, static_cast<uint32_t>(s.M * 1000 + s.K));
    const int blocks = (s.K + 127) / 128;
    std::mt19937 rng(static_cast<uint32_t>(s.K));
    std::vector<float> sa(static_cast<size_t>(s.M * blocks));
    for (float& v : sa) v = std::ldexp(1.0f, static_cast<int>(rng() % 13) - 6);
    const formats::Fp8GemmReference r = formats::gemm_fp8_block_a_reference(p.a, p.b, sa, p.sb, s.M, s.N, s.K);
    for (int m = 0; m < s.M; ++m) {
      for (int n = 0; n < s.N; ++n) {
        double want = 0, abs_want = 0;
        for (int kb = 0; kb < blocks; ++kb) {
          int64_t sum = 0, abs_sum = 0;
          for (int k = kb * 128; k < std::min(s.K, kb * 128 + 128); ++k) {
            const int64_t prod = static_cast<int64_t>(decode(p.a[static_cast<size_t>(m * s.K + k)])) *
                                 static_cast<int64_t>(decode(p.b[static_cast<size_t>(n * s.K + k)]));
            sum += prod;
            abs_sum += prod < 0 ? -prod : prod;
          }
          const double scale =
              static_cast<double>(sa[static_cast<size_t>(m * blocks + kb)]) * p.sb[static_cast<size_t>(n)];
          want += static_cast<double>(sum) * scale;
          abs_want += static_cast<double>(abs_sum) * scale;
        }
        const size_t i = static_cast<size_t>(m * s.N + n);
        ASSERT_EQ(r.value[i], want) << m << ", " << n;
        ASSERT_EQ(r.bf16[i], f32_to_bf16(static_cast<float>(want))) << m << ", " << n;
        ASSERT_EQ(r.abs_dot[i], abs_want) << m << ", " << n;
      }
    }
  }
}

// The blocks' terms are summed exactly and rounded once: 2^60 + 1 - 2^60 is 1, where adding them in fp64 in order
// would give 0. Each block holds one non-zero product (1, 1, -1) with scales 2^60, 1, 2^60.
TEST(Fp8GemmBlockReference, BlockTermsAreSummedExactly) {
  const int K = 384;
  std::vector<uint8_t> a(K, formats::fp8_e4m3_encode(0.0f)), b(K, formats::fp8_e4m3_encode(0.0f));
  a[0] = a[128] = a[256] = formats::fp8_e4m3_encode(1.0f);
  b[0] = b[128] = formats::fp8_e4m3_encode(1.0f);
  b[256] = formats::fp8_e4m3_encode(-1.0f);
  const std::vector<float> sa = {0x1p60f, 1.0f, 0x1p60f}, sb = {1.0f};
  const formats::Fp8GemmReference r = formats::gemm_fp8_block_a_reference(a, b, sa, sb, 1, 1, K);
  EXPECT_EQ(r.value[0], 1.0);
  EXPECT_EQ(r.bf16[0], f32_to_bf16(1.0f));
  EXPECT_EQ(r.abs_dot[0], 0x1p61);  // a tolerance scale, summed in fp64 (2^60 + 1 rounds to 2^60)
}

TEST(Fp8GemmBlockReference, NanCodesPropagateAndBadSizesThrow) {
  const int K = 200;  // two blocks, the second partial
  std::vector<uint8_t> a(K, 0x38), b(K, 0x38);
  a[150] = formats::kFp8E4M3NaN;
  const std::vector<float> s2 = {1.0f, 1.0f}, s1 = {1.0f};
  const formats::Fp8GemmReference r = formats::gemm_fp8_block_a_reference(a, b, s2, s1, 1, 1, K);
  EXPECT_TRUE(std::isnan(r.value[0]));
  EXPECT_TRUE(std::isnan(bf16_to_f32(r.bf16[0])));
  a[150] = 0x38;
  EXPECT_EQ(formats::gemm_fp8_block_a_reference(a, b, s2, s1, 1, 1, K).value[0], 200.0);  // 0x38 is 1.0
  try {
    formats::gemm_fp8_block_a_reference(a, b, s1, s1, 1, 1, K);  // one scale per row, not one per block
    ADD_FAILURE() << "a_scale of M values accepted for K = 200";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a_scale has 1 values, expected M * ceil(K / 128) = 2"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(formats::gemm_fp8_block_a_reference(a, b, s2, s2, 1, 1, K), Error);  // b_scale too long
  EXPECT_THROW(formats::gemm_fp8_block_a_reference(a, b, s2, s1, 1, 1, K + 1), Error);  // A too short
  EXPECT_THROW(formats::gemm_fp8_block_a_reference(a, b, s2, s1, 1, 1, 0), Error);  // K = 0
}

}  // namespace
