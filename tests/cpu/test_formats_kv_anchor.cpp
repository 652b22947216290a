// The key anchor of int4-hadamard (formats/kv_cache.h): the anchor is fp16 of the rotated chunk mean, anchored
// keys are exactly the int4 rule on H·k − c, attention does not see the anchor, and on keys whose outlier channels
// carry a consistent offset (as real keys do) it makes int4-hadamard beat plain int4 by >= 3x from offsets of 50σ
// on (2-3x at 20σ).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/hadamard.h"
#include "attention_fp64.h"
#include "futransformer/formats/kv_cache.h"

namespace futransformer::formats {
namespace {

constexpr int64_t kT = 512, kHd = 128, kNq = 8, kPrefill = 64;
constexpr KvFormat kHad = KvFormat::INT4_HADAMARD;

std::vector<float> rotated(std::vector<float> x, int64_t hd) {
  hadamard_blocks(x.data(), static_cast<int64_t>(x.size()), hadamard_block_for(hd));
  return x;
}

std::vector<float> normal(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Keys N(0,1) whose `outliers` channels (random, distinct) hold a consistent offset ±a plus N(0,1) noise.
std::vector<float> offset_outlier_keys(std::mt19937& rng, int64_t tokens, int64_t hd, int outliers, float a) {
  std::vector<float> k = normal(static_cast<size_t>(tokens * hd), rng);
  std::vector<int64_t> ch(static_cast<size_t>(hd));
  for (int64_t i = 0; i < hd; ++i) ch[static_cast<size_t>(i)] = i;
  std::shuffle(ch.begin(), ch.end(), rng);
  for (int o = 0; o < outliers; ++o) {
    const float offset = (rng() & 1) ? a : -a;
    for (int64_t t = 0; t < tokens; ++t) k[static_cast<size_t>(t * hd + ch[static_cast<size_t>(o)])] += offset;
  }
  return k;
}

// The anchor spelled out: the mean of the raw keys (fp64 sums of 32-token blocks in token order, added in block
// order), rounded to fp32, rotated once, to fp16.
std::vector<uint16_t> anchor_by_hand(const std::vector<float>& keys, int64_t tokens, int64_t hd) {
  std::vector<float> m(static_cast<size_t>(hd));
  for (int64_t i = 0; i < hd; ++i) {
    double s = 0;
    for (int64_t b = 0; b * kKvAnchorBlockTokens < tokens; ++b) {
      double sb = 0;
      for (int64_t t = kKvAnchorBlockTokens * b; t < std::min(tokens, kKvAnchorBlockTokens * (b + 1)); ++t)
        sb += keys[static_cast<size_t>(t * hd + i)];
      s += sb;
    }
    m[static_cast<size_t>(i)] = static_cast<float>(s / static_cast<double>(tokens));
  }
  const std::vector<float> hm = rotated(m, hd);
  std::vector<uint16_t> c(static_cast<size_t>(hd));
  for (int64_t i = 0; i < hd; ++i) c[static_cast<size_t>(i)] = f32_to_f16(hm[static_cast<size_t>(i)]);
  return c;
}

TEST(KvAnchor, AnchorIsFp16OfTheRotatedChunkMean) {
  std::mt19937 rng(7);
  // |fp16(H·m) − fp16(mean of H·k)|: H·m and the mean of the rotated keys differ by fp32 rounding only, so after
  // fp16 rounding they agree to within one fp16 ulp (2^-10 relative) plus an absolute 2^-14 near zero.
  constexpr double kFp16Ulp = 1.0 / 1024.0, kNearZero = 1.0 / 16384.0;
  for (int64_t hd : {64, 128}) {
    for (int64_t n : {1, 37, 64, 100}) {
      const std::vector<float> keys = offset_outlier_keys(rng, n, hd, 2, 50.0f);
      const std::vector<uint16_t> c = kv_key_anchor(kHad, keys, n, hd);
      EXPECT_EQ(c, anchor_by_hand(keys, n, hd)) << "head_dim " << hd << " tokens " << n;
      const std::vector<float> rot = rotated(keys, hd);
      if (n == 1) {  // a decode-only start: the anchor is the token's rotated key, rounded to fp16
        for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], f32_to_f16(rot[i]));
      }
      for (int64_t i = 0; i < hd; ++i) {  // the mean of the rotated keys, up to rounding
        double s = 0;
        for (int64_t t = 0; t < n; ++t) s += rot[static_cast<size_t>(t * hd + i)];
        const double mean_rot = s / static_cast<double>(n);
        EXPECT_NEAR(f16_to_f32(c[static_cast<size_t>(i)]), mean_rot, 2 * kFp16Ulp * std::abs(mean_rot) + kNearZero)
            << "head_dim " << hd << " tokens " << n << " channel " << i;
      }
    }
  }
  // The sum's order is part of the result: +2^60 opens block 0 and -2^60 opens block 1, every other key is 1. In
  // token order the ones of block 0 vanish into 2^60, the sum returns to 0 at token 32, and block 1's 31 ones
  // survive (mean 31/64); by blocks, each block's ones vanish into its own ±2^60 and the block sums cancel (mean 0).
  std::vector<float> order(64, 1.0f);
  order[0] = 0x1p60f;
  order[32] = -0x1p60f;
  EXPECT_EQ(kv_key_anchor(KvFormat::INT4, order, 64, 1), (std::vector<uint16_t>{f32_to_f16(0.0f)}))
      << "the block sums are added, not the keys one by one";
  // Means beyond fp16's range saturate to the largest finite value instead of inf (INT4: no rotation, so the
  // values are the means themselves).
  const std::vector<float> huge = {1e6f, -1e6f, 65504.0f, 1.0f};
  EXPECT_EQ(kv_key_anchor(KvFormat::INT4, huge, 1, 4), (std::vector<uint16_t>{0x7BFF, 0xFBFF, 0x7BFF, 0x3C00}));
  // Butterflies of means near fp32's limit overflow to ±inf and then inf − inf = NaN: saturated or 0, never NaN.
  std::vector<float> edge(64, 3.0e38f);
  edge[1] = -3.0e38f;
  for (uint16_t b : kv_key_anchor(kHad, edge, 1, 64)) EXPECT_NE(b & 0x7C00, 0x7C00) << "fp16 bits " << b;
}

TEST(KvAnchor, AnchoredEncodeIsTheInt4RuleOnRotatedKeyMinusAnchor) {
  for (int64_t hd : {64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    std::mt19937 rng(static_cast<uint32_t>(hd));
    const KvPageLayout L = kv_page_layout(kHad, hd), Lp = kv_page_layout(KvFormat::INT4, hd);
    ASSERT_EQ(L.page_bytes, Lp.page_bytes);  // the same bytes: an anchored page is a plain int4 page of y
    const int64_t P = L.page_tokens;
    const std::vector<float> k = offset_outlier_keys(rng, P, hd, 4, 40.0f);
    const std::vector<float> v = normal(static_cast<size_t>(P * hd), rng);
    const std::vector<float> rk = rotated(k, hd), rv = rotated(v, hd);
    const std::span<const float> chunk = std::span<const float>(k).first(static_cast<size_t>(16 * hd));
    const std::vector<uint16_t> c = kv_key_anchor(kHad, chunk, 16, hd);
    std::vector<uint8_t> got(static_cast<size_t>(L.page_bytes), 0xAB), want(got.size(), 0xCD);
    std::vector<float> y(static_cast<size_t>(hd));
    for (int64_t s = 0; s < P; ++s) {
      const size_t off = static_cast<size_t>(s * hd);
      const auto row = [&](const std::vector<float>& a) { return std::span<const float>(a.data() + off, hd); };
      kv_encode_token(L, got.data(), s, KvPart::K, row(k), c);
      kv_encode_token(L, got.data(), s, KvPart::V, row(v));
      for (int64_t i = 0; i < hd; ++i) y[static_cast<size_t>(i)] = rk[off + i] - f16_to_f32(c[static_cast<size_t>(i)]);
      kv_encode_token(Lp, want.data(), s, KvPart::K, y);
      kv_encode_token(Lp, want.data(), s, KvPart::V, row(rv));
    }
    // Every region is written in full by the encoder, so the fill bytes (0xAB vs 0xCD) must be gone everywhere.
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);

    // Round trip: decode gives y; adding c and un-rotating gives k back within int4's error. Per element int4 errs
    // by at most half a step, step = group range / 15 ≈ 5σ / 15 for the N(0,1) residual, so the RMS error is about
    // 0.1σ; the outlier offsets make |k| several times σ·√hd, so 0.05 of |k| has margin either way.
    constexpr double kMaxRelKeyError = 0.05;
    double num = 0, den = 0;
    for (int64_t s = 0; s < P; ++s) {
      std::vector<float> dec(static_cast<size_t>(hd)), plain(static_cast<size_t>(hd));
      kv_decode_token(L, got.data(), s, KvPart::K, dec);
      kv_decode_token(Lp, want.data(), s, KvPart::K, plain);
      ASSERT_EQ(dec, plain) << "slot " << s;
      for (int64_t i = 0; i < hd; ++i) dec[static_cast<size_t>(i)] += f16_to_f32(c[static_cast<size_t>(i)]);
      kv_unrotate_output(kHad, hd, dec);
      for (int64_t i = 0; i < hd; ++i) {
        const double d = double(dec[static_cast<size_t>(i)]) - k[static_cast<size_t>(s * hd + i)];
        num += d * d;
        den += double(k[static_cast<size_t>(s * hd + i)]) * k[static_cast<size_t>(s * hd + i)];
      }
    }
    EXPECT_LT(std::sqrt(num / den), kMaxRelKeyError);
  }
}

TEST(KvAnchor, RejectedWhereItDoesNotApply) {
  const KvPageLayout L = kv_page_layout(kHad, 64), Lp = kv_page_layout(KvFormat::INT4, 64);
  std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes));
  const std::vector<float> x(64, 0.5f);
  const std::vector<uint16_t> c(64, 0x3C00), shorter(32, 0x3C00);
  EXPECT_NO_THROW(kv_encode_token(L, page.data(), 0, KvPart::K, x, c));
  EXPECT_THROW(kv_encode_token(Lp, page.data(), 0, KvPart::K, x, c), Error);  // plain int4 has no anchor
  EXPECT_THROW(kv_encode_token(L, page.data(), 0, KvPart::V, x, c), Error);   // values are not anchored
  EXPECT_THROW(kv_encode_token(L, page.data(), 0, KvPart::K, x, shorter), Error);
  for (uint16_t bad : {uint16_t{0x7C00}, uint16_t{0x7E00}}) {  // inf, nan
    std::vector<uint16_t> b = c;
    b[9] = bad;
    EXPECT_THROW(kv_encode_token(L, page.data(), 0, KvPart::K, x, b), Error);
  }
  const std::vector<float> two(128, 1.0f);
  EXPECT_THROW(kv_key_anchor(kHad, two, 0, 64), Error);
  EXPECT_THROW(kv_key_anchor(kHad, two, 3, 64), Error);   // 128 values are not 3 x 64
  EXPECT_THROW(kv_key_anchor(kHad, two, 2, -64), Error);
  EXPECT_THROW(kv_key_anchor(kHad, two, int64_t{1} << 62, 64), Error);  // tokens x head_dim would overflow
  std::vector<float> nan = two;
  nan[70] = std::nanf("");
  EXPECT_THROW(kv_key_anchor(kHad, nan, 2, 64), Error);
}

std::vector<double> attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v) {
  return test::attention_fp64(q, k, v, kNq, kHd);
}

using test::rel_l2;

struct Case {
  std::vector<float> q, k, v;
};

Case make_case(uint32_t seed, int outliers, float a) {
  std::mt19937 rng(seed);
  Case d;
  d.k = offset_outlier_keys(rng, kT, kHd, outliers, a);
  d.v = normal(static_cast<size_t>(kT * kHd), rng);
  d.q = normal(static_cast<size_t>(kNq * kHd), rng);
  return d;
}

// Through the real pages: every token encoded (keys with `anchor` when non-empty) and decoded.
void encode_decode(KvFormat f, const Case& d, const std::vector<uint16_t>& anchor, std::vector<float>& kd,
                   std::vector<float>& vd) {
  const KvPageLayout L = kv_page_layout(f, kHd);
  std::vector<uint8_t> pages(static_cast<size_t>(kT / L.page_tokens * L.page_bytes));
  kd.assign(d.k.size(), 0.0f);
  vd.assign(d.v.size(), 0.0f);
  for (int64_t t = 0; t < kT; ++t) {
    uint8_t* page = pages.data() + (t / L.page_tokens) * L.page_bytes;
    const int64_t slot = t % L.page_tokens;
    const size_t off = static_cast<size_t>(t * kHd);
    kv_encode_token(L, page, slot, KvPart::K, std::span<const float>(d.k.data() + off, kHd), anchor);
    kv_encode_token(L, page, slot, KvPart::V, std::span<const float>(d.v.data() + off, kHd));
    kv_decode_token(L, page, slot, KvPart::K, std::span<float>(kd.data() + off, kHd));
    kv_decode_token(L, page, slot, KvPart::V, std::span<float>(vd.data() + off, kHd));
  }
}

// The anchor of the first `tokens` keys (a prefill chunk of that length).
std::vector<uint16_t> prefill_anchor(const std::vector<float>& k, int64_t tokens) {
  return kv_key_anchor(kHad, std::span<const float>(k.data(), static_cast<size_t>(tokens * kHd)), tokens, kHd);
}

TEST(KvAnchor, AttentionIsInvariantToSubtractingOneVectorFromEveryKey) {
  // fp32 rounding of H·k and of k − c moves each key by ~2^-23 |k_i| ≈ 1e-5 at |k_i| ≈ 100, so each logit by
  // ≲ |q|·1e-5·√hd/√hd ≈ 1e-4 and the output's relative error by about as much times the logits' weight change;
  // a missing anchor term would change logits by q·c = O(|q|·a), i.e. O(1) relative.
  constexpr double kInvarianceTolerance = 1e-4;
  for (uint32_t seed : {1u, 2u}) {
    const Case d = make_case(seed, 4, 100.0f);
    const std::vector<double> want = attention(d.q, d.k, d.v);
    const std::vector<uint16_t> c = prefill_anchor(d.k, kPrefill);
    std::vector<float> qr = d.q, shifted = rotated(d.k, kHd);
    kv_rotate_query(kHad, kHd, qr);
    for (size_t i = 0; i < shifted.size(); ++i) shifted[i] -= f16_to_f32(c[i % kHd]);
    std::vector<double> o64 = attention(qr, shifted, rotated(d.v, kHd));
    std::vector<float> o(o64.begin(), o64.end());
    kv_unrotate_output(kHad, kHd, o);
    EXPECT_LT(rel_l2(o, want), kInvarianceTolerance) << "seed " << seed;

    // The same through the format: attention over the decoded anchored keys (what the engine reads) equals
    // attention over the decoded keys with the anchor added back.
    std::vector<float> kd, vd;
    encode_decode(kHad, d, c, kd, vd);
    const std::vector<double> anchored = attention(qr, kd, vd);
    for (size_t i = 0; i < kd.size(); ++i) kd[i] += f16_to_f32(c[i % kHd]);
    EXPECT_LT(rel_l2(anchored, attention(qr, kd, vd)), kInvarianceTolerance) << "seed " << seed;
  }
}

// Relative L2 error of the attention output vs fp64 attention on the fp32 inputs.
double attention_error(KvFormat f, const Case& d, const std::vector<uint16_t>& anchor) {
  std::vector<float> kd, vd, qr = d.q;
  encode_decode(f, d, anchor, kd, vd);
  kv_rotate_query(f, kHd, qr);
  const std::vector<double> o64 = attention(qr, kd, vd);
  std::vector<float> o(o64.begin(), o64.end());
  kv_unrotate_output(f, kHd, o);
  return rel_l2(o, attention(d.q, d.k, d.v));
}

TEST(KvOutliers, HadamardWithAnchorBeatsPlainInt4ThreeTimes) {
  // The scenario with outliers as real keys have them: a consistent per-channel offset ±a (a = 20, 50,
  // 100 times the other channels' σ) plus N(0,1) noise, on 1, 2 or 4 channels; the anchor comes from the first
  // 64 tokens (a prefill chunk). Measured ratios int4 error / anchored int4-hadamard error, seeds 1-3: x50 and
  // x100 3.7-7.0 for 1, 2 and 4 outliers; x20 2.0-3.0 (1 outlier 2.0-2.4, 2 outliers 2.5-3.0, 4 outliers 2.7-4.3).
  // The anchored error sits at the floor of int4 on N(0,1) data (~0.11) for every case, so the ratio is plain
  // int4's excess: an outlier at x20 widens only its own group of 32 (1 of 4), to a step ~5x the others', so plain
  // int4's key error is only about sqrt((5^2 + 3) / 4) ≈ 2.6x the floor, and its attention error less. So >= 3x is
  // asserted from x50 on, and x20 keeps a regression bound under its measured minimum (docs/formats.md). The
  // first-token anchor (a decode-only start) is printed for comparison, not asserted: its ratios are 4-25% lower.
  constexpr double kMinRatio = 3.0, kMinRatioAtX20 = 1.8;
  double worst = INFINITY, worst_first = INFINITY;
  for (int outliers : {1, 2, 4}) {
    for (float a : {20.0f, 50.0f, 100.0f}) {
      for (uint32_t seed : {1u, 2u, 3u}) {
        const Case d = make_case(seed, outliers, a);
        const double plain = attention_error(KvFormat::INT4, d, {});
        const double anchored = attention_error(kHad, d, prefill_anchor(d.k, kPrefill));
        const double first = attention_error(kHad, d, prefill_anchor(d.k, 1));
        const double unanchored = attention_error(kHad, d, {});
        std::cout << "[ anchor ] " << outliers << " outlier(s) x" << a << " seed " << seed << ": int4 " << plain
                  << "  int4-hadamard " << unanchored << "  anchored (64-token mean) " << anchored << "  ratio "
                  << plain / anchored << "  (first-token anchor ratio " << plain / first << ")\n";
        EXPECT_GE(plain / anchored, a == 20.0f ? kMinRatioAtX20 : kMinRatio)
            << outliers << " outliers x" << a << " seed " << seed;
        if (a != 20.0f) worst = std::min(worst, plain / anchored);
        worst_first = std::min(worst_first, plain / first);
      }
    }
  }
  std::cout << "[ anchor ] worst ratio at x50-x100: 64-token mean anchor " << worst
            << "; worst over all cases, first-token anchor " << worst_first << "\n";
}

}  // namespace
}  // namespace futransformer::formats
