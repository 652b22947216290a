// GPU tests of the FP8 prefill MLP's block-scaled pieces:
// - gemm_fp8_block_a / _residual (A scaled per token per 128-deep K block) against formats::gemm_fp8_block_a_reference,
//   and the residual form bit for bit against gemm_fp8_block_a + add_residual_bf16;
// - swiglu_fp8_block (SwiGLU → FP8 per token per 128 channels) against the quantiser rule on the host's y;
// - gemm_fp8_swiglu (gate|up GEMM with SwiGLU → FP8 blocks in its epilogue, packed weight) bit for bit against
//   gemm_fp8 on the canonical weight followed by swiglu_fp8_block: the two orders the engine can run.
// Outputs are poisoned (0xFF: NaN codes / scales) before each launch. SKIPPED without an sm_90 device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fp8_producers.h"
#include "futransformer/cuda/gemm_fp8.h"
#include "futransformer/cuda/gemm_fp8_swiglu.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/fp8_gemm.h"
#include "gpu_test_util.h"

namespace {

using namespace futransformer;
using test::DeviceBuffer;

// Tolerances, from the number formats (as test_gemm_fp8.cpp): D is rounded once to BF16 (2^-8 leaves room for the
// fp32 scale products and the per-block fma promotion); the tensor cores' FP8 accumulation keeps ~14 bits per
// 128-deep block, 2^-10 of sum |a b| bounds it with margin.
constexpr double kBf16Rel = 0x1p-8;
constexpr double kAccumulationRel = 0x1p-10;
constexpr double kRelL2Tol = 1e-2;
// E4M3 dequantisation: half an ulp of a 4-significant-bit format (2^-4 relative) plus half the subnormal step
// (2^-10 of the scale); y itself may differ from the host's by the device expf's 2 ulps (2^-21 relative).
constexpr double kFp8Rel = 0x1p-4 + 0x1p-20;
constexpr double kFp8ScaleAbs = 0x1p-10;

constexpr int kBlock = 128;

std::vector<uint8_t> random_codes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint8_t c = static_cast<uint8_t>(rng() & 0xBF);  // |value| <= 1.875: long sums stay far from overflow
    if ((c & 0x7F) == 0x7F) c ^= 1;                   // 0x7F / 0xFF are NaN
    v[i] = c;
  }
  return v;
}

std::vector<float> random_scales(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(0x1p-8f, 0x1p-4f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// gemm_fp8_block_a

void check_block_a(int M, int N, int K, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K);
  std::mt19937_64 rng(seed);
  const int kb = (K + kBlock - 1) / kBlock;
  const std::vector<uint8_t> a = random_codes(static_cast<size_t>(M) * K, rng);
  const std::vector<uint8_t> b = random_codes(static_cast<size_t>(N) * K, rng);
  const std::vector<float> sa = random_scales(static_cast<size_t>(M) * kb, rng);
  const std::vector<float> sb = random_scales(static_cast<size_t>(N), rng);
  DeviceBuffer<uint8_t> da(a), db(b);
  DeviceBuffer<float> dsa(sa), dsb(sb);
  DeviceBuffer<uint16_t> d(static_cast<size_t>(M) * N);
  ASSERT_EQ(d.poison(), cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8_block_a(da.p, db.p, dsa.p, dsb.p, reinterpret_cast<__nv_bfloat16*>(d.p), M, N, K, nullptr),
            cudaSuccess)
      << cuda::gemm_fp8_last_error();
  // The residual form: bit for bit the BF16 store followed by add_residual_bf16.
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::mt19937 xr(seed);
  std::vector<float> x(static_cast<size_t>(M) * N);
  for (float& v : x) v = nd(xr);
  DeviceBuffer<float> want(x), got(x);
  ASSERT_EQ(cuda::add_residual_bf16(want.p, reinterpret_cast<const __nv_bfloat16*>(d.p), M, N, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8_block_a_residual(da.p, db.p, dsa.p, dsb.p, got.p, M, N, K, nullptr), cudaSuccess)
      << cuda::gemm_fp8_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> out = d.download();
  const std::vector<float> w = want.download(), g = got.download();
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t wb, gb;
    std::memcpy(&wb, &w[i], 4);
    std::memcpy(&gb, &g[i], 4);
    ASSERT_EQ(gb, wb) << "residual row " << i / N << " col " << i % N << ": fused " << g[i] << ", store + add " << w[i];
  }
  // Against the twin on a sample of rows (every row for small M).
  std::vector<int> rows;
  for (int m = 0; m < M; m += (M > 64 ? 37 : 1)) rows.push_back(m);
  if (rows.back() != M - 1) rows.push_back(M - 1);
  std::vector<uint8_t> a_rows;
  std::vector<float> sa_rows;
  for (int m : rows) {
    a_rows.insert(a_rows.end(), a.begin() + static_cast<ptrdiff_t>(m) * K, a.begin() + static_cast<ptrdiff_t>(m + 1) * K);
    sa_rows.insert(sa_rows.end(), sa.begin() + static_cast<ptrdiff_t>(m) * kb,
                   sa.begin() + static_cast<ptrdiff_t>(m + 1) * kb);
  }
  const formats::Fp8GemmReference ref = formats::gemm_fp8_block_a_reference(
      a_rows, b, sa_rows, sb, static_cast<int64_t>(rows.size()), N, K);
  double err2 = 0.0, ref2 = 0.0;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int n = 0; n < N; ++n) {
      const size_t gi = static_cast<size_t>(rows[r]) * N + n, ri = r * N + n;
      ASSERT_NE(out[gi], 0xFFFF) << "row " << rows[r] << " col " << n << " not written";
      const double got_v = bf16_to_f32(out[gi]), want_v = ref.value[ri];
      const double bound = kBf16Rel * std::fabs(want_v) + kAccumulationRel * ref.abs_dot[ri];
      ASSERT_LE(std::fabs(got_v - want_v), bound) << "row " << rows[r] << " col " << n << ": got " << got_v
                                                  << ", ref " << want_v << ", sum|ab| " << ref.abs_dot[ri];
      err2 += (got_v - want_v) * (got_v - want_v);
      ref2 += want_v * want_v;
    }
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), kRelL2Tol);
}

TEST(GemmFp8BlockAGpu, MatchesTheTwinAndTheResidualOrder) {
  FT_REQUIRE_HOPPER();
  check_block_a(1, 256, 512, 1);
  check_block_a(17, 520, 1040, 2);      // N tail (not a tile multiple), partial last K block
  check_block_a(130, 1024, 4096, 3);    // an M tail past one 128-row tile
  check_block_a(300, 4096, 14336, 4);   // the 8B down projection (both tile widths are tried by the heuristic)
  check_block_a(129, 6144, 576, 5);     // K of 4.5 blocks
}

// ---------------------------------------------------------------------------------------------------------------
// swiglu_fp8_block

float host_silu_mul(float g, float u) { return (g / (1.0f + std::exp(-g))) * u; }

TEST(SwigluFp8BlockGpu, QuantisesEachBlockByTheFormatsRule) {
  FT_REQUIRE_HOPPER();
  for (const auto& [rows, inter] : {std::pair{1, 128}, std::pair{37, 1536}, std::pair{130, 14336}}) {
    SCOPED_TRACE(testing::Message() << "rows " << rows << " inter " << inter);
    std::mt19937 rng(static_cast<uint32_t>(rows * 7 + inter));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<uint16_t> gu(static_cast<size_t>(rows) * 2 * inter);
    for (size_t i = 0; i < gu.size(); ++i) gu[i] = f32_to_bf16(nd(rng) * (i % 211 == 3 ? 30.0f : 1.0f));
    DeviceBuffer<uint16_t> dgu(gu);
    DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows) * inter);
    DeviceBuffer<float> scales(static_cast<size_t>(rows) * inter / kBlock);
    ASSERT_EQ(codes.poison(), cudaSuccess);
    ASSERT_EQ(scales.poison(), cudaSuccess);
    ASSERT_EQ(cuda::swiglu_fp8_block(reinterpret_cast<const __nv_bfloat16*>(dgu.p), codes.p, scales.p, rows, inter,
                                     nullptr),
              cudaSuccess)
        << cuda::fp8_producers_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> c = codes.download();
    const std::vector<float> s = scales.download();
    for (int r = 0; r < rows; ++r) {
      for (int b = 0; b < inter / kBlock; ++b) {
        float amax = 0.0f;
        std::vector<float> y(kBlock);
        for (int k = 0; k < kBlock; ++k) {
          const size_t gi = static_cast<size_t>(r) * 2 * inter + b * kBlock + k;
          y[k] = host_silu_mul(bf16_to_f32(gu[gi]), bf16_to_f32(gu[gi + inter]));
          amax = std::max(amax, std::fabs(y[k]));
        }
        const float scale = s[static_cast<size_t>(r) * (inter / kBlock) + b];
        ASSERT_NEAR(scale, amax / 448.0f, 1e-5 * amax / 448.0f) << "row " << r << " block " << b;
        for (int k = 0; k < kBlock; ++k) {
          const uint8_t code = c[static_cast<size_t>(r) * inter + b * kBlock + k];
          ASSERT_NE(code & 0x7F, 0x7F) << "row " << r << " channel " << b * kBlock + k << " NaN or not written";
          const double deq = formats::fp8_e4m3_decode(code) * static_cast<double>(scale);
          ASSERT_LE(std::fabs(deq - y[k]), kFp8Rel * std::fabs(y[k]) + kFp8ScaleAbs * scale)
              << "row " << r << " channel " << b * kBlock + k << ": y " << y[k] << ", dequantised " << deq;
        }
      }
    }
  }
}

// A block holding a non-finite y gets scale NaN and NaN codes (where the CPU quantiser throws); its row's other
// blocks are untouched by it.
TEST(SwigluFp8BlockGpu, NonFiniteBlockGetsNaNScaleAndCodes) {
  FT_REQUIRE_HOPPER();
  const int rows = 2, inter = 384;
  std::vector<uint16_t> gu(static_cast<size_t>(rows) * 2 * inter, f32_to_bf16(0.5f));
  gu[static_cast<size_t>(inter) + 130] = f32_to_bf16(INFINITY);  // row 0, up of channel 130 (block 1)
  DeviceBuffer<uint16_t> dgu(gu);
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows) * inter);
  DeviceBuffer<float> scales(static_cast<size_t>(rows) * inter / kBlock);
  ASSERT_EQ(cuda::swiglu_fp8_block(reinterpret_cast<const __nv_bfloat16*>(dgu.p), codes.p, scales.p, rows, inter,
                                   nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> s = scales.download();
  const std::vector<uint8_t> c = codes.download();
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < inter / kBlock; ++b) {
      const bool bad = r == 0 && b == 1;
      EXPECT_EQ(std::isnan(s[static_cast<size_t>(r) * (inter / kBlock) + b]), bad) << "row " << r << " block " << b;
      for (int k = 0; k < kBlock; ++k)
        ASSERT_EQ((c[static_cast<size_t>(r) * inter + b * kBlock + k] & 0x7F) == 0x7F, bad)
            << "row " << r << " channel " << b * kBlock + k;
    }
  }
}

TEST(SwigluFp8BlockHost, RejectsAChannelCountThatIsNotAMultipleOf128) {
  uint16_t* gu = reinterpret_cast<uint16_t*>(uintptr_t{0x10000});
  uint8_t* codes = reinterpret_cast<uint8_t*>(uintptr_t{0x100000});
  float* scales = reinterpret_cast<float*>(uintptr_t{0x200000});
  EXPECT_EQ(cuda::swiglu_fp8_block(reinterpret_cast<const __nv_bfloat16*>(gu), codes, scales, 4, 200, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::fp8_producers_last_error()).find("inter = 200"), std::string::npos)
      << cuda::fp8_producers_last_error();
}

// ---------------------------------------------------------------------------------------------------------------
// gemm_fp8_swiglu

struct SwigluCase {
  int M, inter, K;
};

void check_fused_swiglu(const SwigluCase& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "M " << c.M << " inter " << c.inter << " K " << c.K);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.M) * c.K), w(static_cast<size_t>(2) * c.inter * c.K);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % static_cast<size_t>(c.K) % 97 == 5 ? 20.0f : 1.0f);
  for (float& v : w) v = 0.05f * nd(rng);
  const formats::Fp8Matrix qa = formats::fp8_quantize_per_token(x, c.M, c.K, "test.x");
  const formats::Fp8Matrix qb = formats::fp8_quantize_weight(w, 2 * c.inter, c.K, "test.gate_up");
  // The packed copy of the weight and its scales.
  std::vector<uint8_t> packed(qb.codes.size());
  std::vector<float> packed_scales(static_cast<size_t>(2) * c.inter);
  std::vector<int> seen(static_cast<size_t>(2) * c.inter, 0);
  for (int64_t p = 0; p < 2 * c.inter; ++p) {
    const int64_t src = cuda::gemm_fp8_swiglu_packed_row_source(p, c.inter);
    ASSERT_TRUE(src >= 0 && src < 2 * c.inter) << p;
    ++seen[static_cast<size_t>(src)];
    std::copy_n(qb.codes.begin() + src * c.K, c.K, packed.begin() + p * c.K);
    packed_scales[static_cast<size_t>(p)] = qb.scales[static_cast<size_t>(src)];
  }
  for (int v : seen) ASSERT_EQ(v, 1) << "the packing must be a permutation of the rows";

  DeviceBuffer<uint8_t> da(qa.codes), db(qb.codes), dbp(packed);
  DeviceBuffer<float> dsa(qa.scales), dsb(qb.scales), dsbp(packed_scales);
  const size_t n = static_cast<size_t>(c.M) * c.inter, nb = n / kBlock;
  // Unfused: the BF16 gate|up tensor, then the block producer.
  DeviceBuffer<uint16_t> gu(2 * n);
  DeviceBuffer<uint8_t> want_codes(n), got_codes(n);
  DeviceBuffer<float> want_scales(nb), got_scales(nb);
  ASSERT_EQ(got_codes.poison(), cudaSuccess);
  ASSERT_EQ(got_scales.poison(), cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8(da.p, db.p, dsa.p, dsb.p, reinterpret_cast<__nv_bfloat16*>(gu.p), c.M, 2 * c.inter, c.K,
                           nullptr),
            cudaSuccess)
      << cuda::gemm_fp8_last_error();
  ASSERT_EQ(cuda::swiglu_fp8_block(reinterpret_cast<const __nv_bfloat16*>(gu.p), want_codes.p, want_scales.p, c.M,
                                   c.inter, nullptr),
            cudaSuccess)
      << cuda::fp8_producers_last_error();
  ASSERT_EQ(cuda::gemm_fp8_swiglu(da.p, dbp.p, dsa.p, dsbp.p, got_codes.p, got_scales.p, c.M, c.inter, c.K, nullptr),
            cudaSuccess)
      << cuda::gemm_fp8_swiglu_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> wc = want_codes.download(), gc = got_codes.download();
  const std::vector<float> ws = want_scales.download(), gs = got_scales.download();
  for (size_t i = 0; i < nb; ++i) {
    uint32_t wb, gb;
    std::memcpy(&wb, &ws[i], 4);
    std::memcpy(&gb, &gs[i], 4);
    ASSERT_EQ(gb, wb) << "scale of row " << i / (c.inter / kBlock) << " block " << i % (c.inter / kBlock) << ": fused "
                      << gs[i] << ", unfused " << ws[i];
  }
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(gc[i], wc[i]) << "code of row " << i / c.inter << " channel " << i % c.inter;
    nonzero += (gc[i] & 0x7F) != 0;
  }
  EXPECT_GT(nonzero, n / 2) << "the GEMM must have produced mostly nonzero codes";
}

TEST(GemmFp8SwigluGpu, BitIdenticalToGemmThenSwigluBlock) {
  FT_REQUIRE_HOPPER();
  check_fused_swiglu({1, 128, 256}, 11);
  check_fused_swiglu({65, 384, 1040}, 12);    // M tail past one 64-row tile, partial last K block
  check_fused_swiglu({200, 1536, 576}, 13);   // SmolLM2-135M's MLP
  check_fused_swiglu({300, 14336, 4096}, 14); // Llama-3.1-8B's MLP
}

// An infinite token scale makes that row's g and u non-finite: both orders must give it NaN scales and codes, bit
// for bit, and leave the other rows finite.
TEST(GemmFp8SwigluGpu, NonFiniteRowsMatchTheUnfusedOrder) {
  FT_REQUIRE_HOPPER();
  const int M = 70, inter = 256, K = 512;
  std::mt19937_64 rng(31);
  const std::vector<uint8_t> a = random_codes(static_cast<size_t>(M) * K, rng);
  const std::vector<uint8_t> b = random_codes(static_cast<size_t>(2) * inter * K, rng);
  std::vector<float> sa = random_scales(M, rng);
  sa[5] = INFINITY;
  const std::vector<float> sb = random_scales(static_cast<size_t>(2) * inter, rng);
  std::vector<uint8_t> packed(b.size());
  std::vector<float> packed_sb(sb.size());
  for (int64_t p = 0; p < 2 * inter; ++p) {
    const int64_t src = cuda::gemm_fp8_swiglu_packed_row_source(p, inter);
    std::copy_n(b.begin() + src * K, K, packed.begin() + p * K);
    packed_sb[static_cast<size_t>(p)] = sb[static_cast<size_t>(src)];
  }
  const size_t n = static_cast<size_t>(M) * inter, nb = n / kBlock;
  DeviceBuffer<uint8_t> da(a), db(b), dbp(packed), wc(n), gc(n);
  DeviceBuffer<float> dsa(sa), dsb(sb), dsbp(packed_sb), ws(nb), gs(nb);
  DeviceBuffer<uint16_t> gu(2 * n);
  ASSERT_EQ(gc.poison(), cudaSuccess);
  ASSERT_EQ(gs.poison(), cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8(da.p, db.p, dsa.p, dsb.p, reinterpret_cast<__nv_bfloat16*>(gu.p), M, 2 * inter, K, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::swiglu_fp8_block(reinterpret_cast<const __nv_bfloat16*>(gu.p), wc.p, ws.p, M, inter, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8_swiglu(da.p, dbp.p, dsa.p, dsbp.p, gc.p, gs.p, M, inter, K, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> want_s = ws.download(), got_s = gs.download();
  ASSERT_EQ(0, std::memcmp(want_s.data(), got_s.data(), nb * sizeof(float)));
  EXPECT_EQ(wc.download(), gc.download());
  for (size_t i = 0; i < nb; ++i)
    EXPECT_EQ(std::isnan(got_s[i]), i / (inter / kBlock) == 5) << "scale " << i;
}

TEST(GemmFp8SwigluGpu, DeterministicAcrossRuns) {
  FT_REQUIRE_HOPPER();
  const int M = 257, inter = 1024, K = 2048;
  std::mt19937_64 rng(21);
  const std::vector<uint8_t> a = random_codes(static_cast<size_t>(M) * K, rng);
  const std::vector<uint8_t> b = random_codes(static_cast<size_t>(2) * inter * K, rng);
  const std::vector<float> sa = random_scales(M, rng), sb = random_scales(static_cast<size_t>(2) * inter, rng);
  DeviceBuffer<uint8_t> da(a), db(b), c1(static_cast<size_t>(M) * inter), c2(static_cast<size_t>(M) * inter);
  DeviceBuffer<float> dsa(sa), dsb(sb), s1(static_cast<size_t>(M) * inter / kBlock),
      s2(static_cast<size_t>(M) * inter / kBlock);
  for (auto* buf : {&c1, &c2}) ASSERT_EQ(buf->poison(), cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8_swiglu(da.p, db.p, dsa.p, dsb.p, c1.p, s1.p, M, inter, K, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8_swiglu(da.p, db.p, dsa.p, dsb.p, c2.p, s2.p, M, inter, K, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(c1.download(), c2.download());
  EXPECT_EQ(s1.download(), s2.download());
}

TEST(GemmFp8SwigluHost, CanImplementNamesTheProblem) {
  std::string why;
  EXPECT_EQ(cuda::gemm_fp8_swiglu_can_implement(2048, 14336, 4096, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::gemm_fp8_swiglu_can_implement(0, 14336, 4096, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("M = 0"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_fp8_swiglu_can_implement(16, 1000, 4096, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("inter = 1000"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_fp8_swiglu_can_implement(16, 1024, 4100, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("K = 4100"), std::string::npos) << why;
  // Pointer checks come after the shape and name what is wrong; nothing is launched.
  EXPECT_EQ(cuda::gemm_fp8_swiglu(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 16, 1024, 4096, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_fp8_swiglu_last_error()).find("non-null"), std::string::npos)
      << cuda::gemm_fp8_swiglu_last_error();
}

TEST(GemmFp8SwigluHost, PackedRowsPairGateAndUpOfTheSameChannels) {
  const int64_t inter = 384;
  for (int64_t p = 0; p < 2 * inter; ++p) {
    const int64_t src = cuda::gemm_fp8_swiglu_packed_row_source(p, inter);
    const int64_t tile = p / 256, half = p % 256 / 128, q = p % 128;
    // Row q of a half and row q + 64 are gate and up of one channel, inside this tile's 128 channels.
    const int64_t channel = src % inter;
    EXPECT_EQ(src >= inter, q >= 64) << p;
    EXPECT_EQ(channel, tile * 128 + half * 64 + q % 64) << p;
  }
}

}  // namespace
