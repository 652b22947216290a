#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/formats/int4.h"

namespace futransformer::formats {
namespace {

// Half-ulp relative rounding of the stored scale: F16 has 11 significant bits, BF16 has 8.
float scale_rounding(ScaleType t) { return t == ScaleType::F16 ? 0x1p-11f : 0x1p-8f; }
// RTN puts every in-range value within s/2 of a grid point. At the top of the range the value can sit up to
// 15 * (scale rounding) * s beyond the last grid point (the stored s was rounded down), so the bound is
// s * (1/2 + 16 * rounding); kFp32Slack covers the fp32 division and multiply.
constexpr float kFp32Slack = 0x1p-20f;

TEST(Int4Pack, EveryNibbleAtEvenAndOddColumns) {
  std::vector<uint8_t> nib;
  for (int hi = 0; hi < 16; ++hi) {
    for (int lo = 0; lo < 16; ++lo) {  // pair b = (hi, lo) must pack to the byte value b
      nib.push_back(static_cast<uint8_t>(lo));
      nib.push_back(static_cast<uint8_t>(hi));
    }
  }
  const auto packed = int4_pack(nib);
  ASSERT_EQ(packed.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(packed[static_cast<size_t>(b)], b) << "low nibble = even column";
  EXPECT_EQ(int4_unpack(packed), nib);
  EXPECT_THROW(int4_pack(std::vector<uint8_t>{1, 2, 3}), Error);
  EXPECT_THROW(int4_pack(std::vector<uint8_t>{1, 16}), Error);
}

std::vector<float> random_weight(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = 0.05f * std::exp(nd(rng));
    for (int64_t c = 0; c < cols; ++c) {
      // Skewed rows (a positive shift on odd rows) make the asymmetric zero-point matter.
      w[static_cast<size_t>(r * cols + c)] = row_scale * (nd(rng) + (r % 2 ? 1.5f : 0.0f));
    }
  }
  return w;
}

struct Case {
  int64_t group;
  bool symmetric;
  ScaleType scale_type;
};

TEST(Int4Rtn, ErrorWithinHalfScaleAndBytesConsistent) {
  const int64_t N = 12, K = 256;
  const auto w = random_weight(N, K, 21);
  std::vector<Case> cases;
  for (int64_t g : {32, 64, 128, 0}) {
    for (bool sym : {true, false}) {
      for (ScaleType t : {ScaleType::F16, ScaleType::BF16}) cases.push_back({g, sym, t});
    }
  }
  for (const Case& cs : cases) {
    SCOPED_TRACE("group " + std::to_string(cs.group) + (cs.symmetric ? " symmetric" : " asymmetric") +
                 (cs.scale_type == ScaleType::F16 ? " f16" : " bf16"));
    Int4Spec spec;
    spec.group_size = cs.group;
    spec.symmetric = cs.symmetric;
    spec.scale_type = cs.scale_type;
    const Int4Weight q = int4_quantize_rtn(w, N, K, spec, "test.weight");
    const int64_t g = cs.group == 0 ? K : cs.group;
    ASSERT_EQ(q.group, g);
    ASSERT_EQ(q.scales.size(), static_cast<size_t>(N * K / g));
    ASSERT_EQ(q.zeros.size(), cs.symmetric ? 0u : static_cast<size_t>(N * K / g));
    const auto d = int4_dequantize(q);
    const auto nib = int4_unpack(q.qweight);
    float worst = 0;
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t gi = 0; gi < K / g; ++gi) {
        const float* src = w.data() + r * K + gi * g;
        const GroupParams p = int4_group_params(std::span<const float>(src, static_cast<size_t>(g)), spec);
        ASSERT_EQ(q.scales[static_cast<size_t>(r * (K / g) + gi)], p.scale_bits);
        ASSERT_EQ(q.zero(r, gi), p.zero);
        const float bound = p.scale * (0.5f + 16 * scale_rounding(cs.scale_type)) + kFp32Slack * p.scale * 16;
        for (int64_t i = 0; i < g; ++i) {
          const size_t idx = static_cast<size_t>(r * K + gi * g + i);
          ASSERT_EQ(nib[idx], int4_quantize_value(src[i], p));
          ASSERT_EQ(q.nibble(r, gi * g + i), nib[idx]);
          ASSERT_EQ(d[idx], (static_cast<int>(nib[idx]) - p.zero) * p.scale);
          ASSERT_LE(std::fabs(d[idx] - src[i]), bound) << "row " << r << " col " << gi * g + i;
          worst = std::max(worst, std::fabs(d[idx] - src[i]) / p.scale);
        }
      }
    }
    EXPECT_GT(worst, 0.4f) << "RTN error never approached s/2: is the data being rounded at all?";
  }
}

TEST(Int4Rtn, AsymmetricBeatsSymmetricOnSkewedRows) {
  // A row that is all positive: symmetric wastes the negative half of the grid.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  std::vector<float> w(128);
  for (auto& x : w) x = u(rng);
  Int4Spec sym, asym;
  asym.symmetric = false;
  const auto ds = int4_dequantize(int4_quantize_rtn(w, 1, 128, sym, "w"));
  const auto da = int4_dequantize(int4_quantize_rtn(w, 1, 128, asym, "w"));
  double es = 0, ea = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    es += (ds[i] - w[i]) * (ds[i] - w[i]);
    ea += (da[i] - w[i]) * (da[i] - w[i]);
  }
  EXPECT_LT(ea, es);
}

TEST(Int4Rtn, RejectsShapesNamingTheTensor) {
  std::vector<float> w(2 * 96, 0.5f);
  Int4Spec spec;
  spec.group_size = 64;
  try {
    int4_quantize_rtn(w, 2, 96, spec, "blk.3.attn_q.weight");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.3.attn_q.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
  spec.group_size = 48;
  EXPECT_THROW(int4_quantize_rtn(w, 2, 96, spec, "w"), Error);
  spec.group_size = 0;
  std::vector<float> odd(3 * 5, 1.0f);
  EXPECT_THROW(int4_quantize_rtn(odd, 3, 5, spec, "w"), Error);
  EXPECT_THROW(int4_quantize_rtn(w, 3, 96, spec, "w"), Error);  // size mismatch
  w[10] = std::nanf("");
  EXPECT_THROW(int4_quantize_rtn(w, 2, 96, spec, "w"), Error);
}

TEST(Int4Rtn, AllZeroGroupUsesUnitScale) {
  std::vector<float> w(64, 0.0f);
  Int4Spec spec;
  spec.group_size = 32;
  const auto q = int4_quantize_rtn(w, 1, 64, spec, "w");
  EXPECT_EQ(q.scale(0, 0), 1.0f);
  for (float v : int4_dequantize(q)) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace futransformer::formats

namespace futransformer::formats {
namespace {

TEST(Int4Rtn, ScaleOverflowingF16IsAnError) {
  std::vector<float> w(32, 1.0f);
  w[0] = 1e6f;  // 2 * 1e6 / 15 > 65504: the FP16 scale would be inf
  EXPECT_THROW(int4_quantize_rtn(w, 1, 32, Int4Spec{32, true, ScaleType::F16}, "w"), Error);
  EXPECT_NO_THROW(int4_quantize_rtn(w, 1, 32, Int4Spec{32, true, ScaleType::BF16}, "w"));
}

}  // namespace
}  // namespace futransformer::formats
