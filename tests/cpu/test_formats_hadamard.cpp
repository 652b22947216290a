#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/formats/hadamard.h"

namespace futransformer::formats {
namespace {

constexpr float kEps = 0x1p-24f;  // fp32 unit roundoff

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Sylvester construction: H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]].
std::vector<int> sylvester(int64_t n) {
  std::vector<int> h{1};
  for (int64_t m = 1; m < n; m *= 2) {
    std::vector<int> next(static_cast<size_t>(4 * m * m));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        const int v = h[static_cast<size_t>(i * m + j)];
        next[static_cast<size_t>(i * 2 * m + j)] = v;
        next[static_cast<size_t>(i * 2 * m + j + m)] = v;
        next[static_cast<size_t>((i + m) * 2 * m + j)] = v;
        next[static_cast<size_t>((i + m) * 2 * m + j + m)] = -v;
      }
    }
    h = std::move(next);
  }
  return h;
}

TEST(Hadamard, MatchesSylvesterMatrixProduct) {
  for (int64_t block = 1; block <= 128; block *= 2) {
    const int64_t nblocks = 3;
    const auto x = randn(static_cast<size_t>(block * nblocks), static_cast<uint32_t>(block));
    auto y = x;
    hadamard_blocks(y.data(), block * nblocks, block);
    const auto h = sylvester(block);
    const int stages = static_cast<int>(std::log2(static_cast<double>(block)));
    for (int64_t b = 0; b < nblocks; ++b) {
      double l1 = 0;
      for (int64_t j = 0; j < block; ++j) l1 += std::fabs(x[static_cast<size_t>(b * block + j)]);
      // Each stage rounds once (relative eps on partial sums bounded by the block's L1 norm), plus the scale.
      const double tol = (stages + 2) * kEps * l1 / std::sqrt(static_cast<double>(block));
      for (int64_t i = 0; i < block; ++i) {
        double want = 0;
        for (int64_t j = 0; j < block; ++j)
          want += h[static_cast<size_t>(i * block + j)] * static_cast<double>(x[static_cast<size_t>(b * block + j)]);
        want /= std::sqrt(static_cast<double>(block));
        ASSERT_NEAR(y[static_cast<size_t>(b * block + i)], want, tol) << "block " << block << " row " << i;
      }
    }
  }
}

TEST(Hadamard, IsOrthogonalAndItsOwnInverse) {
  for (int64_t block = 2; block <= 128; block *= 2) {
    const int64_t n = 4 * block;
    const auto x = randn(static_cast<size_t>(n), 100 + static_cast<uint32_t>(block));
    auto y = x;
    hadamard_blocks(y.data(), n, block);
    const int stages = static_cast<int>(std::log2(static_cast<double>(block)));
    for (int64_t b = 0; b < n / block; ++b) {
      double nx = 0, ny = 0, amax = 0;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        nx += double(x[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
        ny += double(y[static_cast<size_t>(i)]) * y[static_cast<size_t>(i)];
        amax = std::max(amax, double(std::fabs(x[static_cast<size_t>(i)])));
      }
      EXPECT_NEAR(std::sqrt(ny), std::sqrt(nx), (stages + 2) * kEps * std::sqrt(double(block)) * std::sqrt(nx))
          << "block " << block;
    }
    auto z = y;
    hadamard_blocks(z.data(), n, block);  // H·H = I
    for (int64_t b = 0; b < n / block; ++b) {
      double l1 = 0;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) l1 += std::fabs(x[static_cast<size_t>(i)]);
      // First pass: element error <= (stages+2) eps L1 / sqrt(block), amplified at most sqrt(block) by the
      // second (orthonormal) pass, which adds its own (stages+2) eps ||y||_2 <= (stages+2) eps L1.
      const double tol = 2 * (stages + 2) * kEps * l1;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        ASSERT_NEAR(z[static_cast<size_t>(i)], x[static_cast<size_t>(i)], tol) << "block " << block << " index " << i;
      }
    }
  }
}

TEST(Hadamard, ScaleIsAppliedOnceAfterExactButterflies) {
  // With small integers every butterfly is exact, so the documented order gives exactly fl(sum * scale):
  // one rounding. A per-stage 1/sqrt(2) (or a different scale constant) would produce other bits.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> d(-100, 100);
  for (int64_t block = 2; block <= 128; block *= 2) {
    std::vector<float> x(static_cast<size_t>(block));
    for (auto& v : x) v = static_cast<float>(d(rng));
    auto y = x;
    hadamard_blocks(y.data(), block, block);
    const auto h = sylvester(block);
    for (int64_t i = 0; i < block; ++i) {
      int sum = 0;
      for (int64_t j = 0; j < block; ++j) {
        sum += h[static_cast<size_t>(i * block + j)] * static_cast<int>(x[static_cast<size_t>(j)]);
      }
      ASSERT_EQ(y[static_cast<size_t>(i)], static_cast<float>(sum) * hadamard_scale(block)) << "block " << block;
    }
  }
}

TEST(Hadamard, ScaleConstants) {
  const auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  EXPECT_EQ(hadamard_scale(1), 1.0f);
  EXPECT_EQ(bits(hadamard_scale(2)), 0x3F3504F3u);
  EXPECT_EQ(hadamard_scale(4), 0.5f);
  EXPECT_EQ(bits(hadamard_scale(8)), 0x3EB504F3u);
  EXPECT_EQ(hadamard_scale(16), 0.25f);
  EXPECT_EQ(bits(hadamard_scale(32)), 0x3E3504F3u);
  EXPECT_EQ(hadamard_scale(64), 0.125f);
  EXPECT_EQ(bits(hadamard_scale(128)), 0x3DB504F3u);
}

TEST(Hadamard, BlockForHeadDim) {
  EXPECT_EQ(hadamard_block_for(128), 128);
  EXPECT_EQ(hadamard_block_for(256), 128);
  EXPECT_EQ(hadamard_block_for(64), 64);
  EXPECT_EQ(hadamard_block_for(96), 32);
  EXPECT_EQ(hadamard_block_for(80), 16);
  EXPECT_EQ(hadamard_block_for(1), 1);
  EXPECT_THROW(hadamard_block_for(0), Error);
  EXPECT_THROW(hadamard_block_for(-64), Error);
}

TEST(Hadamard, RejectsBadBlocks) {
  std::vector<float> x(96, 1.0f);
  EXPECT_THROW(hadamard_blocks(x.data(), 96, 3), Error);
  EXPECT_THROW(hadamard_blocks(x.data(), 96, 0), Error);
  EXPECT_THROW(hadamard_blocks(x.data(), 96, 64), Error);  // 64 does not divide 96
  EXPECT_THROW(hadamard_blocks(nullptr, 64, 64), Error);
  EXPECT_THROW(hadamard_scale(12), Error);
}

}  // namespace
}  // namespace futransformer::formats
