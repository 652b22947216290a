#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"

namespace futransformer::formats {
namespace {

// Error model of E4M3 with round-to-nearest: 3 stored mantissa bits give a relative half-ulp of 2^-4 for normals;
// below the smallest normal (2^-6) the grid is uniform with step 2^-9, so the absolute half-step is 2^-10 (in
// units of the scale). kFp32Slack covers the fp32 division x / s and the multiply decode * s.
constexpr float kHalfUlpRel = 0x1p-4f;
constexpr float kSubnormalHalfStep = 0x1p-10f;
constexpr float kFp32Slack = 4 * 0x1p-24f;

// Independent definition of the code -> value map, straight from the OCP spec.
float spec_value(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const double mag = e == 0 ? m / 512.0 : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return static_cast<float>(s ? -mag : mag);
}

// Brute-force RNE: nearest finite code, ties to the even code, |x| beyond 448 saturating.
uint8_t brute_encode(float x) {
  if (std::isnan(x)) return 0x7F;
  const bool neg = std::signbit(x);
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(a - spec_value(c));
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best | (neg ? 0x80 : 0));
}

TEST(Fp8E4M3, DecodeEveryCodeMatchesSpec) {
  for (int c = 0; c < 256; ++c) {
    const float got = fp8_e4m3_decode(static_cast<uint8_t>(c)), want = spec_value(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_TRUE((c & 0x7F) == 0x7F) << "code " << c;
    } else {
      EXPECT_EQ(got, want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    }
  }
  EXPECT_EQ(fp8_e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_decode(0x08), 0x1p-6f);
  EXPECT_EQ(fp8_e4m3_decode(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_decode(0xFE), -448.0f);
}

TEST(Fp8E4M3, EncodeInvertsDecodeForEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // the two NaN codes have no finite value to invert
    EXPECT_EQ(fp8_e4m3_encode(fp8_e4m3_decode(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(Fp8E4M3, MidpointsRoundToEvenCode) {
  for (int c = 0; c < 0x7E; ++c) {
    for (int sign : {0, 0x80}) {
      const float lo = fp8_e4m3_decode(static_cast<uint8_t>(c | sign));
      const float hi = fp8_e4m3_decode(static_cast<uint8_t>((c + 1) | sign));
      const float mid = (lo + hi) / 2;  // exact: both have at most 4 significant bits
      const int even = (c % 2 == 0) ? c : c + 1;
      EXPECT_EQ(fp8_e4m3_encode(mid), even | sign) << "midpoint of codes " << c << " and " << c + 1;
      EXPECT_EQ(fp8_e4m3_encode(std::nextafter(mid, lo)), c | sign) << "just below midpoint after code " << c;
      EXPECT_EQ(fp8_e4m3_encode(std::nextafter(mid, hi)), (c + 1) | sign) << "just above midpoint after " << c;
    }
  }
}

TEST(Fp8E4M3, SaturatesAndMapsNanTo7F) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, 3e38f, inf}) {
    EXPECT_EQ(fp8_e4m3_encode(x), 0x7E) << x;
    EXPECT_EQ(fp8_e4m3_encode(-x), 0xFE) << -x;
  }
  EXPECT_EQ(fp8_e4m3_encode(std::nextafter(448.0f, 0.0f)), 0x7E);
  EXPECT_EQ(fp8_e4m3_encode(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(fp8_e4m3_encode(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

TEST(Fp8E4M3, Subnormals) {
  EXPECT_EQ(fp8_e4m3_encode(0x1p-9f), 0x01);
  EXPECT_EQ(fp8_e4m3_encode(0x1p-10f), 0x00);        // tie between 0 and 2^-9 -> even (0)
  EXPECT_EQ(fp8_e4m3_encode(3 * 0x1p-10f), 0x02);    // tie between 1 and 2 (x 2^-9) -> even
  EXPECT_EQ(fp8_e4m3_encode(15 * 0x1p-10f), 0x08);   // tie between 7 * 2^-9 and the smallest normal -> even
  EXPECT_EQ(fp8_e4m3_encode(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(fp8_e4m3_encode(-0x1p-11f), 0x80);       // rounds to zero, keeps the sign
  EXPECT_EQ(fp8_e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(fp8_e4m3_encode(1e-40f), 0x00);          // fp32 subnormal input
  EXPECT_EQ(fp8_e4m3_encode(7 * 0x1p-9f), 0x07);
}

TEST(Fp8E4M3, EncodeMatchesBruteForceOnRandomValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-13, 10);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(fp8_e4m3_encode(x), brute_encode(x)) << "x = " << x;
  }
}

std::vector<float> random_rows(int64_t rows, int64_t cols, uint32_t seed) {
  // Rows of very different magnitudes (and a few extreme values) so scales and subnormals are exercised.
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::exp(2.0f * nd(rng));
    for (int64_t c = 0; c < cols; ++c) {
      float v = nd(rng) * row_scale;
      if (c % 37 == 5) v *= 30.0f;
      x[static_cast<size_t>(r * cols + c)] = v;
    }
  }
  return x;
}

void expect_within_fp8_bound(const Fp8Matrix& q, const std::vector<float>& x) {
  const std::vector<float> d = fp8_dequantize(q);
  float max_rel = 0;
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const size_t i = static_cast<size_t>(r * q.cols + c);
      const float s = q.scale(r, c);
      ASSERT_EQ(q.codes[i], fp8_e4m3_encode(x[i] / s)) << "row " << r << " col " << c;
      const float bound = (kHalfUlpRel + kFp32Slack) * std::fabs(x[i]) + kSubnormalHalfStep * s * (1 + kFp32Slack);
      ASSERT_LE(std::fabs(d[i] - x[i]), bound) << "row " << r << " col " << c << " x " << x[i];
      if (std::fabs(x[i]) > 0.1f * 448 * s) max_rel = std::max(max_rel, std::fabs(d[i] - x[i]) / std::fabs(x[i]));
    }
  }
  EXPECT_GT(max_rel, kHalfUlpRel / 4) << "errors implausibly small: is the data being quantised at all?";
}

TEST(Fp8Quant, PerChannelWeightWithinBound) {
  const int64_t N = 48, K = 320;
  const auto w = random_rows(N, K, 11);
  const Fp8Matrix q = fp8_quantize_weight(w, N, K, "blk.0.ffn_up.weight");
  ASSERT_EQ(q.block, K);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < K; ++c) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * K + c)]));
    EXPECT_EQ(q.scales[static_cast<size_t>(r)], amax / 448.0f) << "row " << r;
  }
  expect_within_fp8_bound(q, w);
}

TEST(Fp8Quant, PerTokenWithinBoundAndZeroRowGetsUnitScale) {
  const int64_t T = 17, K = 96;
  auto x = random_rows(T, K, 12);
  for (int64_t c = 0; c < K; ++c) x[static_cast<size_t>(3 * K + c)] = 0.0f;
  const Fp8Matrix q = fp8_quantize_per_token(x, T, K, "layer 0 attn input");
  EXPECT_EQ(q.scales[3], 1.0f);
  for (int64_t c = 0; c < K; ++c) EXPECT_EQ(q.codes[static_cast<size_t>(3 * K + c)], 0);
  expect_within_fp8_bound(q, x);
  // Per-token and per-channel quantisation are the same rule on rows.
  EXPECT_EQ(q.codes, fp8_quantize_weight(x, T, K, "same").codes);
}

TEST(Fp8Quant, PerTokenBlockWithinBound) {
  const int64_t T = 9, K = 384;
  const auto x = random_rows(T, K, 13);
  const Fp8Matrix q = fp8_quantize_per_token_block(x, T, K, "layer 3 down input");
  ASSERT_EQ(q.block, kFp8BlockCols);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(T * 3));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < 3; ++b) {
      float amax = 0;
      for (int64_t c = 0; c < 128; ++c) amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * K + b * 128 + c)]));
      EXPECT_EQ(q.scales[static_cast<size_t>(t * 3 + b)], amax / 448.0f);
    }
  }
  expect_within_fp8_bound(q, x);
}

TEST(Fp8Quant, RejectsBadInputs) {
  std::vector<float> x(200, 1.0f);
  try {
    fp8_quantize_per_token_block(x, 1, 200, "blk.7.ffn_down input");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.7.ffn_down input"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("128"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fp8_quantize_weight(x, 3, 100, "w"), Error);  // size mismatch
  EXPECT_THROW(fp8_quantize_weight(x, -1, -200, "w"), Error);
  x[5] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(fp8_quantize_per_token(x, 2, 100, "x"), Error);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(fp8_quantize_per_token(x, 2, 100, "x"), Error);
}

}  // namespace
}  // namespace futransformer::formats
