// src/cuda/shared_divisor.h on the host (the same source the kernels compile, with std::fma for __fmaf_rn): the
// three-operation division by a shared divisor equals IEEE division on the quantisers' domains — every positive
// fp16 value as an INT4 group scale, FP8 row scales amax / 448 over the whole usable range, random divisors and
// quotients — and exhaustively over one binade of dividends for divisors with awkward mantissas. Dividends below
// kMinExactDividend may differ in the last bit; the test checks that they give the same FP8 code and INT4 rounding.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "cuda/shared_divisor.h"
#include "futransformer/formats/fp8.h"

namespace futransformer::cuda::divisor {
namespace {

constexpr int kDividendsPerF16Scale = 48;
constexpr int kFp8Rows = 20000;
constexpr int kDividendsPerFp8Row = 64;
constexpr int kRandomPairs = 2000000;

float f16_bits_to_float(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -24) : std::ldexp(1.0f + m / 1024.0f, e - 15);
  return (h & 0x8000) ? -mag : mag;
}

// Bit equality (distinguishes -0 from +0; both NaN counts as equal).
bool same_bits(float x, float y) {
  return std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y) || (std::isnan(x) && std::isnan(y));
}

// A log-uniform magnitude 2^[lo, hi) with a random sign when `signed_`.
float log_uniform(std::mt19937& rng, float lo, float hi, bool signed_) {
  std::uniform_real_distribution<float> e(lo, hi);
  const float v = std::exp2(e(rng));
  return signed_ && (rng() & 1) ? -v : v;
}

// Checks divide(a, d) against a / b: bit-identical where the header promises it, else a quotient below 2^-40 with
// the same FP8 code and the same rint. Returns false (and records the failure) on a mismatch.
bool check_pair(float a, const SharedDivisor& d) {
  const float want = a / d.b, got = divide(a, d);
  if (std::fabs(a) >= kMinExactDividend || a == 0.0f) {
    EXPECT_TRUE(same_bits(got, want)) << "a = " << std::hexfloat << a << ", b = " << d.b << ": got " << got
                                      << ", IEEE " << want;
    return same_bits(got, want);
  }
  const bool ok = std::fabs(got) < 0x1p-40f && std::fabs(want) < 0x1p-40f &&
                  formats::fp8_e4m3_encode(got) == formats::fp8_e4m3_encode(want) &&
                  same_bits(std::nearbyint(got), std::nearbyint(want));
  EXPECT_TRUE(ok) << "tiny quotient: a = " << std::hexfloat << a << ", b = " << d.b << ": got " << got << ", IEEE "
                  << want;
  return ok;
}

TEST(SharedDivisor, EveryPositiveF16ScaleAsAnInt4GroupScale) {
  std::mt19937 rng(20261201u);
  int failures = 0;
  for (uint32_t h = 1; h < 0x7C00u && failures < 10; ++h) {
    const float scale = f16_bits_to_float(static_cast<uint16_t>(h));
    ASSERT_TRUE(usable(scale)) << scale;
    const SharedDivisor d = make_shared_divisor(scale);
    // Group values span about [-15 scale, 15 scale]; include the rounding midpoints k / 2 · scale and their
    // neighbours, where a wrong last bit would change rint.
    std::uniform_real_distribution<float> u(-16.0f, 16.0f);
    for (int i = 0; i < kDividendsPerF16Scale; ++i) {
      float a = u(rng) * scale;
      if (i % 4 == 1) a = (static_cast<float>(i % 32) - 15.5f) * scale;
      if (i % 4 == 2) a = std::nextafter((static_cast<float>(i % 32) - 15.5f) * scale, INFINITY);
      if (i % 4 == 3) a = std::nextafter((static_cast<float>(i % 32) - 15.5f) * scale, -INFINITY);
      failures += check_pair(a, d) ? 0 : 1;
    }
    failures += check_pair(0.0f, d) ? 0 : 1;
    failures += check_pair(-0.0f, d) ? 0 : 1;
  }
  EXPECT_EQ(failures, 0);
}

TEST(SharedDivisor, Fp8RowScalesOverTheUsableRange) {
  std::mt19937 rng(7u);
  int failures = 0;
  for (int row = 0; row < kFp8Rows && failures < 10; ++row) {
    const float amax = log_uniform(rng, -51.0f, 108.0f, false);
    const float s = amax / 448.0f;  // fp8_scale_for_amax's IEEE division
    ASSERT_TRUE(usable(s)) << s;
    const SharedDivisor d = make_shared_divisor(s);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int i = 0; i < kDividendsPerFp8Row; ++i) {
      float a = u(rng) * amax;
      if (i == 0) a = amax;
      if (i == 1) a = -amax;
      if (i == 2) a = log_uniform(rng, -149.0f, std::log2(amax), true);  // down to fp32 subnormals
      failures += check_pair(a, d) ? 0 : 1;
      EXPECT_EQ(formats::fp8_e4m3_encode(divide(a, d)), formats::fp8_e4m3_encode(a / s));
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(SharedDivisor, RandomDivisorsAndQuotients) {
  std::mt19937 rng(11u);
  int failures = 0;
  for (int i = 0; i < kRandomPairs && failures < 10; ++i) {
    const float b = log_uniform(rng, -60.0f, 100.0f, false);
    if (!usable(b)) continue;
    const float quotient = log_uniform(rng, -110.0f, 100.0f, true);
    const float a = quotient * b;
    if (!std::isfinite(a)) continue;
    failures += check_pair(a, make_shared_divisor(b)) ? 0 : 1;
  }
  EXPECT_EQ(failures, 0);
}

// Every dividend of [1, 2) (2^23 values) for divisors whose reciprocals round awkwardly.
TEST(SharedDivisor, ExhaustiveBinadeForAwkwardDivisors) {
  const float divisors[] = {1.0f, 3.0f, std::bit_cast<float>(0x3FFFFFFFu), std::bit_cast<float>(0x3F800001u),
                            15.0f / 448.0f};
  for (const float b : divisors) {
    const SharedDivisor d = make_shared_divisor(b);
    int failures = 0;
    for (uint32_t bits = 0x3F800000u; bits < 0x40000000u && failures < 5; ++bits) {
      const float a = std::bit_cast<float>(bits);
      if (!same_bits(divide(a, d), a / b)) {
        ++failures;
        ADD_FAILURE() << "a = " << std::hexfloat << a << ", b = " << b;
      }
    }
    EXPECT_EQ(failures, 0) << "b = " << std::hexfloat << b;
  }
}

TEST(SharedDivisor, DomainExcludesNanSubnormalAndHugeDivisors) {
  EXPECT_FALSE(usable(std::nanf("")));
  EXPECT_FALSE(usable(0.0f));
  EXPECT_FALSE(usable(0x1p-127f));
  EXPECT_FALSE(usable(0x1p-61f));
  EXPECT_FALSE(usable(0x1p101f));
  EXPECT_FALSE(usable(INFINITY));
  EXPECT_TRUE(usable(kMinDivisor));
  EXPECT_TRUE(usable(kMaxDivisor));
  EXPECT_TRUE(usable(1.0f / 448.0f));
}

// with_divisor hands its body the reciprocal path inside the domain and IEEE division outside it (a NaN, a tiny or a
// huge scale): the quotients are IEEE's either way.
TEST(SharedDivisor, WithDivisorGivesIeeeQuotientsInAndOutOfTheDomain) {
  const float dividends[] = {1.0f, -3.5f, 0x1.fffffep-1f, 1e-30f, -0.0f, 448.0f};
  for (const float b : {1.0f / 448.0f, 3.0f, 0x1p-70f, 0x1p-130f, 0x1p110f, std::nanf("")}) {
    with_divisor(b, [&](const auto& div) {
      for (const float a : dividends) EXPECT_TRUE(same_bits(div(a), a / b)) << std::hexfloat << a << " / " << b;
    });
  }
}

}  // namespace
}  // namespace futransformer::cuda::divisor
