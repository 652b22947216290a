#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/hadamard.h"
#include "attention_fp64.h"
#include "futransformer/formats/kv_cache.h"

namespace futransformer::formats {
namespace {

constexpr KvFormat kAll[] = {KvFormat::BF16, KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD};
constexpr float kBf16HalfUlpRel = 0x1p-8f;   // 8 significant bits
constexpr float kFp8HalfUlpRel = 0x1p-4f;    // 4 significant bits
constexpr float kFp8SubnormalHalfStep = 0x1p-10f;
constexpr float kF16ScaleRounding = 0x1p-11f;
constexpr float kFp32Slack = 0x1p-20f;

std::vector<float> random_head(int64_t head_dim, std::mt19937& rng, float outlier) {
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<size_t>(head_dim));
  for (auto& x : v) x = nd(rng);
  v[3] *= outlier;  // an outlier channel, as keys have
  return v;
}

TEST(KvFormat, NamesRoundTripAndUnknownNameListsValidOnes) {
  for (KvFormat f : kAll) EXPECT_EQ(parse_kv_format(kv_format_name(f)), f);
  try {
    parse_kv_format("int3");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (KvFormat f : kAll) EXPECT_NE(m.find(kv_format_name(f)), std::string::npos) << m;
    EXPECT_NE(m.find("int3"), std::string::npos) << m;
  }
}

TEST(KvLayout, RegionsAlignedDisjointAndInsideThePage) {
  for (KvFormat f : kAll) {
    for (int64_t hd : {32, 64, 96, 128, 256}) {
      for (int64_t P : {16, 64, 128}) {
        SCOPED_TRACE(std::string(kv_format_name(f)) + " head_dim " + std::to_string(hd) + " P " + std::to_string(P));
        const KvPageLayout L = kv_page_layout(f, hd, P);
        EXPECT_EQ(L.page_bytes % kKvAlign, 0);
        EXPECT_EQ(L.code_row_bytes % 16, 0);
        const int64_t meta_scale = f == KvFormat::FP8 ? P * 4 : L.groups * P * 2;
        const int64_t meta_zero = L.groups * P;
        int64_t end = 0;
        for (int p = 0; p < 2; ++p) {
          for (int64_t off : {L.codes[p], L.scales[p], L.zeros[p]}) EXPECT_EQ(off % kKvAlign, 0);
          EXPECT_GE(L.codes[p], end);
          EXPECT_GE(L.scales[p], L.codes[p] + P * L.code_row_bytes);
          EXPECT_GE(L.zeros[p], L.scales[p] + (f == KvFormat::BF16 ? 0 : meta_scale));
          end = L.zeros[p] + meta_zero;
        }
        EXPECT_LE(end, L.page_bytes);
        EXPECT_LT(L.page_bytes - end, kKvAlign);
      }
    }
  }
}

TEST(KvLayout, WorkedExamplesFromDocs) {
  // docs/formats.md, "Worked example": int4 head_dim 128 and 64, P = 64.
  const KvPageLayout a = kv_page_layout(KvFormat::INT4, 128);
  EXPECT_EQ(a.code_row_bytes, 64);
  EXPECT_EQ(a.groups, 4);
  EXPECT_EQ(a.codes[0], 0);
  EXPECT_EQ(a.scales[0], 4096);
  EXPECT_EQ(a.zeros[0], 4608);
  EXPECT_EQ(a.codes[1], 4864);
  EXPECT_EQ(a.scales[1], 8960);
  EXPECT_EQ(a.zeros[1], 9472);
  EXPECT_EQ(a.page_bytes, 9728);
  EXPECT_EQ(a.bytes_per_token(), 152);
  const KvPageLayout b = kv_page_layout(KvFormat::INT4_HADAMARD, 64);
  EXPECT_EQ(b.code_row_bytes, 32);
  EXPECT_EQ(b.scales[0], 2048);
  EXPECT_EQ(b.zeros[0], 2304);
  EXPECT_EQ(b.codes[1], 2432);
  EXPECT_EQ(b.scales[1], 4480);
  EXPECT_EQ(b.zeros[1], 4736);
  EXPECT_EQ(b.page_bytes, 4864);
  const KvPageLayout c = kv_page_layout(KvFormat::FP8, 128);
  EXPECT_EQ(c.scales[0], 8192);
  EXPECT_EQ(c.codes[1], 8448);
  EXPECT_EQ(c.scales[1], 16640);
  EXPECT_EQ(c.page_bytes, 16896);
  const KvPageLayout d = kv_page_layout(KvFormat::BF16, 128);
  EXPECT_EQ(d.codes[1], 16384);
  EXPECT_EQ(d.page_bytes, 32768);
}

TEST(KvLayout, RejectsUnsupportedShapes) {
  EXPECT_THROW(kv_page_layout(KvFormat::INT4, 48), Error);
  EXPECT_THROW(kv_page_layout(KvFormat::INT4_HADAMARD, 100), Error);
  EXPECT_THROW(kv_page_layout(KvFormat::FP8, 40), Error);
  EXPECT_THROW(kv_page_layout(KvFormat::BF16, 0), Error);
  EXPECT_THROW(kv_page_layout(KvFormat::BF16, 2048), Error);
  EXPECT_THROW(kv_page_layout(KvFormat::BF16, 64, 10), Error);
  EXPECT_THROW(kv_page_layout(KvFormat::BF16, 64, 0), Error);
  EXPECT_THROW(kv_page_layout(KvFormat::BF16, 64, 1 << 20), Error);
  try {
    kv_page_layout(KvFormat::INT4, 100);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("100"), std::string::npos) << e.what();
  }
}

// Per-element bound of format f for the value x (in the cache's domain), given the page's metadata.
float element_bound(const KvPageLayout& L, const uint8_t* page, int64_t slot, KvPart part, int64_t c, float x) {
  const int p = static_cast<int>(part);
  switch (L.format) {
    case KvFormat::BF16: return kBf16HalfUlpRel * std::fabs(x);
    case KvFormat::FP8: {
      float s;
      std::memcpy(&s, page + L.scales[p] + slot * 4, 4);
      return (kFp8HalfUlpRel + kFp32Slack) * std::fabs(x) + kFp8SubnormalHalfStep * s;
    }
    default: {
      uint16_t bits;
      std::memcpy(&bits, page + L.scales[p] + (slot * L.groups + c / kKvInt4Group) * 2, 2);
      const float s = f16_to_f32(bits);
      return s * (0.5f + 16 * kF16ScaleRounding + kFp32Slack);
    }
  }
}

TEST(KvCache, RoundTripWithinFormatBoundsForEverySlot) {
  for (KvFormat f : kAll) {
    for (int64_t hd : {64, 128}) {
      SCOPED_TRACE(std::string(kv_format_name(f)) + " head_dim " + std::to_string(hd));
      const KvPageLayout L = kv_page_layout(f, hd);
      std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes), 0xAB);  // garbage: encode must overwrite
      std::mt19937 rng(static_cast<uint32_t>(hd) + 31 * static_cast<uint32_t>(f));
      std::vector<std::vector<float>> src[2];
      // Fill slots in a scrambled order, K and V interleaved, so a write that strays is caught by its neighbours.
      for (int p = 0; p < 2; ++p) src[p].resize(static_cast<size_t>(L.page_tokens));
      for (int64_t i = 0; i < L.page_tokens; ++i) {
        const int64_t slot = (i * 37) % L.page_tokens;
        for (int p = 0; p < 2; ++p) {
          src[p][static_cast<size_t>(slot)] = random_head(hd, rng, p == 0 ? 25.0f : 1.0f);
          kv_encode_token(L, page.data(), slot, static_cast<KvPart>(p), src[p][static_cast<size_t>(slot)]);
        }
      }
      for (int64_t slot = 0; slot < L.page_tokens; ++slot) {
        for (int p = 0; p < 2; ++p) {
          const KvPart part = static_cast<KvPart>(p);
          std::vector<float> want = src[p][static_cast<size_t>(slot)], got(static_cast<size_t>(hd));
          kv_decode_token(L, page.data(), slot, part, got);
          if (f == KvFormat::INT4_HADAMARD) hadamard_blocks(want.data(), hd, hadamard_block_for(hd));
          for (int64_t c = 0; c < hd; ++c) {
            const float x = want[static_cast<size_t>(c)];
            ASSERT_LE(std::fabs(got[static_cast<size_t>(c)] - x), element_bound(L, page.data(), slot, part, c, x))
                << "slot " << slot << " part " << p << " channel " << c;
          }
          if (f == KvFormat::INT4_HADAMARD) {  // back in the model's basis, the error norm is unchanged
            kv_unrotate_output(f, hd, got);
            double e_model = 0, e_rot = 0;
            std::vector<float> rot = got;
            kv_rotate_query(f, hd, rot);
            for (int64_t c = 0; c < hd; ++c) {
              const double d = got[static_cast<size_t>(c)] - src[p][static_cast<size_t>(slot)][static_cast<size_t>(c)];
              const double r = rot[static_cast<size_t>(c)] - want[static_cast<size_t>(c)];
              e_model += d * d;
              e_rot += r * r;
            }
            ASSERT_NEAR(std::sqrt(e_model), std::sqrt(e_rot), 1e-4 * (1 + std::sqrt(e_rot)));
          }
        }
      }
    }
  }
}

TEST(KvCache, Fp8BytesEqualPerTokenQuantiser) {
  const KvPageLayout L = kv_page_layout(KvFormat::FP8, 128);
  std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes));
  std::mt19937 rng(8);
  const auto x = random_head(128, rng, 40.0f);
  kv_encode_token(L, page.data(), 5, KvPart::V, x);
  const Fp8Matrix q = fp8_quantize_per_token(x, 1, 128, "ref");
  for (int64_t c = 0; c < 128; ++c) EXPECT_EQ(page[static_cast<size_t>(L.codes[1] + 5 * 128 + c)], q.codes[c]);
  float s;
  std::memcpy(&s, page.data() + L.scales[1] + 5 * 4, 4);
  EXPECT_EQ(s, q.scales[0]);
}

TEST(KvCache, Int4NibbleOrderLowIsEvenChannel) {
  // Values chosen so the group's grid is exact: s = 1, z = 0 (min 0, max 15).
  const KvPageLayout L = kv_page_layout(KvFormat::INT4, 32);
  std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes));
  std::vector<float> x(32);
  for (int c = 0; c < 32; ++c) x[static_cast<size_t>(c)] = static_cast<float>(c % 16);
  kv_encode_token(L, page.data(), 0, KvPart::K, x);
  for (int j = 0; j < 16; ++j) {
    const int even = (2 * j) % 16, odd = (2 * j + 1) % 16;
    EXPECT_EQ(page[static_cast<size_t>(j)], even | (odd << 4)) << "byte " << j;
  }
  EXPECT_EQ(page[static_cast<size_t>(L.zeros[0])], 0);
  std::vector<float> y(32);
  kv_decode_token(L, page.data(), 0, KvPart::K, y);
  EXPECT_EQ(y, x);
}

TEST(KvCache, RotationPreservesDotProducts) {
  std::mt19937 rng(4);
  for (int64_t hd : {64, 96, 128}) {
    const auto q0 = random_head(hd, rng, 1.0f), k0 = random_head(hd, rng, 30.0f);
    auto q = q0, k = k0;
    kv_rotate_query(KvFormat::INT4_HADAMARD, hd, q);
    kv_rotate_query(KvFormat::INT4_HADAMARD, hd, k);
    double a = 0, b = 0, l1 = 0;
    for (int64_t i = 0; i < hd; ++i) {
      a += double(q0[static_cast<size_t>(i)]) * k0[static_cast<size_t>(i)];
      b += double(q[static_cast<size_t>(i)]) * k[static_cast<size_t>(i)];
      l1 += std::fabs(q0[static_cast<size_t>(i)]) * std::fabs(k0[static_cast<size_t>(i)]);
    }
    EXPECT_NEAR(a, b, 1e-5 * l1 * hd / 8) << "head_dim " << hd;
    auto same = q0;
    kv_rotate_query(KvFormat::INT4, hd, same);  // formats without rotation leave vectors alone
    EXPECT_EQ(same, q0);
  }
  EXPECT_EQ(kv_hadamard_block(KvFormat::INT4_HADAMARD, 128), 128);
  EXPECT_EQ(kv_hadamard_block(KvFormat::FP8, 128), 0);
}

TEST(KvCache, RejectsBadCalls) {
  const KvPageLayout L = kv_page_layout(KvFormat::INT4, 64);
  std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes));
  std::vector<float> x(64, 1.0f), shorter(32, 1.0f);
  EXPECT_THROW(kv_encode_token(L, page.data(), 64, KvPart::K, x), Error);
  EXPECT_THROW(kv_encode_token(L, page.data(), -1, KvPart::K, x), Error);
  EXPECT_THROW(kv_encode_token(L, page.data(), 0, KvPart::K, shorter), Error);
  EXPECT_THROW(kv_encode_token(L, nullptr, 0, KvPart::K, x), Error);
  EXPECT_THROW(kv_decode_token(L, page.data(), 0, KvPart::V, shorter), Error);
  for (KvFormat f : {KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    const KvPageLayout Lf = kv_page_layout(f, 64);
    std::vector<uint8_t> pf(static_cast<size_t>(Lf.page_bytes));
    auto bad = x;
    bad[7] = std::nanf("");
    EXPECT_THROW(kv_encode_token(Lf, pf.data(), 0, KvPart::K, bad), Error) << kv_format_name(f);
    bad[7] = INFINITY;
    EXPECT_THROW(kv_encode_token(Lf, pf.data(), 0, KvPart::K, bad), Error) << kv_format_name(f);
  }
}

// The outlier scenario: keys N(0,1) with 4 outlier channels scaled by `magnitude`, random queries and
// values; attention of 8 query heads (one GQA group) over 512 cached tokens of one KV head, through the real page
// encode/decode path.
constexpr int64_t kT = 512, kHd = 128, kNq = 8;

struct OutlierData {
  std::vector<float> q, k, v;
};

OutlierData outlier_data(uint32_t seed, float magnitude) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  OutlierData d{std::vector<float>(kNq * kHd), std::vector<float>(kT * kHd), std::vector<float>(kT * kHd)};
  for (auto& x : d.k) x = nd(rng);
  for (auto& x : d.v) x = nd(rng);
  for (auto& x : d.q) x = nd(rng);
  std::vector<int64_t> channels(kHd);
  for (int64_t i = 0; i < kHd; ++i) channels[static_cast<size_t>(i)] = i;
  std::shuffle(channels.begin(), channels.end(), rng);
  for (int o = 0; o < 4; ++o) {
    for (int64_t t = 0; t < kT; ++t) d.k[static_cast<size_t>(t * kHd + channels[static_cast<size_t>(o)])] *= magnitude;
  }
  return d;
}

std::vector<double> attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v) {
  return test::attention_fp64(q, k, v, kNq, kHd);
}

using test::rel_l2;

struct CachedErrors {
  double attention;  // relative L2 of the attention output vs fp64 attention on the fp32 inputs
  double keys;       // relative L2 of the decoded keys, back in the model's basis
};

CachedErrors cached_errors(KvFormat f, uint32_t seed, float magnitude) {
  const OutlierData d = outlier_data(seed, magnitude);
  const KvPageLayout L = kv_page_layout(f, kHd);
  std::vector<uint8_t> pages(static_cast<size_t>(kT / L.page_tokens * L.page_bytes));
  std::vector<float> kd(kT * kHd), vd(kT * kHd);
  for (int64_t t = 0; t < kT; ++t) {
    uint8_t* page = pages.data() + (t / L.page_tokens) * L.page_bytes;
    const int64_t slot = t % L.page_tokens;
    const auto in = [&](const std::vector<float>& a) { return std::span<const float>(a.data() + t * kHd, kHd); };
    const auto out = [&](std::vector<float>& a) { return std::span<float>(a.data() + t * kHd, kHd); };
    kv_encode_token(L, page, slot, KvPart::K, in(d.k));
    kv_encode_token(L, page, slot, KvPart::V, in(d.v));
    kv_decode_token(L, page, slot, KvPart::K, out(kd));
    kv_decode_token(L, page, slot, KvPart::V, out(vd));
  }
  auto qr = d.q;
  kv_rotate_query(f, kHd, qr);
  const auto o64 = attention(qr, kd, vd);
  std::vector<float> o(o64.begin(), o64.end());
  kv_unrotate_output(f, kHd, o);
  kv_unrotate_output(f, kHd, kd);
  return {rel_l2(o, attention(d.q, d.k, d.v)), rel_l2(kd, d.k)};
}

constexpr float kMagnitudes[] = {20.0f, 50.0f, 100.0f};
constexpr uint32_t kSeeds[] = {1, 2, 3};

TEST(KvOutliers, AttentionErrorPerFormat) {
  // Bounds on the relative L2 attention error, with headroom over what the formats give on this data
  // (measured, seeds 1-3: bf16 <= 0.016, fp8 <= 0.10, int4 and int4-hadamard 0.09 .. 0.57). With 4 outliers up
  // to x100 the softmax is nearly one-hot, so int4's logit noise can swap the winning token: errors of tenths are
  // what per-token INT4 gives here, and the bound is a regression guard, not a quality claim.
  constexpr double kBf16Bound = 0.03, kFp8Bound = 0.2, kInt4Bound = 0.8;
  for (float mag : kMagnitudes) {
    for (uint32_t seed : kSeeds) {
      SCOPED_TRACE("magnitude " + std::to_string(mag) + " seed " + std::to_string(seed));
      const double bf16 = cached_errors(KvFormat::BF16, seed, mag).attention;
      const double fp8 = cached_errors(KvFormat::FP8, seed, mag).attention;
      const double i4 = cached_errors(KvFormat::INT4, seed, mag).attention;
      const double i4h = cached_errors(KvFormat::INT4_HADAMARD, seed, mag).attention;
      std::cout << "[ outliers ] x" << mag << " seed " << seed << ": bf16 " << bf16 << "  fp8 " << fp8 << "  int4 "
                << i4 << "  int4-hadamard " << i4h << "\n";
      EXPECT_LT(bf16, kBf16Bound);
      EXPECT_LT(fp8, kFp8Bound);
      EXPECT_LT(i4, kInt4Bound);
      EXPECT_LT(i4h, kInt4Bound);
      EXPECT_LT(bf16, fp8);
      EXPECT_LT(fp8, std::min(i4, i4h));
    }
  }
}

TEST(KvOutliers, KeyErrorRatioHadamardVsPlainInt4) {
  // What the rotation buys on these keys with per-token groups of 32 (measured ratios int4 / int4-hadamard of the
  // key error: x20 1.55-1.64, x50 1.15-1.25, x100 0.72-0.81). The issue expected >= 3x lower *attention* error;
  // that does not hold for this format (docs/formats.md, "Outlier channels"): per-token INT4 noise follows the
  // group's range, and rotating 4 outlier channels into all 128 only moves that range from the outlier groups to
  // every group. Asserted: the gain at moderate outliers, where the rotation is meant to help.
  constexpr double kMinGainAtX20 = 1.3;
  for (float mag : kMagnitudes) {
    for (uint32_t seed : kSeeds) {
      const double i4 = cached_errors(KvFormat::INT4, seed, mag).keys;
      const double i4h = cached_errors(KvFormat::INT4_HADAMARD, seed, mag).keys;
      std::cout << "[ outliers ] x" << mag << " seed " << seed << ": key error int4 " << i4 << "  int4-hadamard "
                << i4h << "  ratio " << i4 / i4h << "\n";
      if (mag == 20.0f) EXPECT_GT(i4 / i4h, kMinGainAtX20) << "seed " << seed;
    }
  }
}

}  // namespace
}  // namespace futransformer::formats
