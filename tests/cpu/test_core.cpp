#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/mapped_file.h"
#include "futransformer/tensor.h"

namespace futransformer {
namespace {

TEST(DType, F16RoundTripsEveryCode) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const uint16_t h = static_cast<uint16_t>(code);
    const float f = f16_to_f32(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "code " << code;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
}

TEST(DType, BF16RoundsToNearestEven) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1000.f, 1000.f);
  for (int i = 0; i < 10000; ++i) {
    const float f = dist(rng);
    const float r = bf16_to_f32(f32_to_bf16(f));
    // The nearest bf16 is within half an ulp (8 mantissa bits: relative 2^-8).
    EXPECT_LE(std::fabs(r - f), std::fabs(f) * std::ldexp(1.0f, -8));
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(Tensor, FromBytesChecksSize) {
  EXPECT_THROW(Tensor::from_bytes("t", DType::F32, {2, 3}, std::vector<uint8_t>(20)), Error);
  const Tensor t = Tensor::from_f32("t", {2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(t.to_f32(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(t.shape_str(), "[2, 2]");
}

TEST(MappedFile, MissingFileNamesPath) {
  try {
    MappedFile::open("/nonexistent/file.bin");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/file.bin"), std::string::npos);
  }
}

}  // namespace
}  // namespace futransformer
