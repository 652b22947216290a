// The CPU twin of the GPU logit statistics against the evaluation code it will replace (src/eval/kl.cpp's
// kl_divergence and argmax, perplexity.cpp's token_nll) on random rows.
#include "futransformer/eval/logit_stats_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "futransformer/eval/perplexity.h"
#include "futransformer/eval/report.h"

namespace {

namespace ev = futransformer::eval;
constexpr double kU = 0x1.0p-53;

std::vector<float> random_row(int vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> pos(0, vocab - 1);
  std::vector<float> x(static_cast<size_t>(vocab));
  for (float& v : x) v = normal(rng);
  for (int k = 0; k < 3; ++k) x[static_cast<size_t>(pos(rng))] += 12.0f;
  return x;
}

TEST(LogitStatsRef, MatchesEvalFunctions) {
  std::mt19937_64 rng(42);
  for (int vocab : {1, 2, 61, 4099, 49152}) {
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " rep " + std::to_string(rep));
      const std::vector<float> x = random_row(vocab, rng);
      std::vector<float> y = x;
      std::normal_distribution<float> noise(0.0f, 0.3f);
      for (float& v : y) v += noise(rng);
      const int32_t target = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      const ev::LogitRowStats sx = ev::logit_row_stats_ref(x, target);
      const ev::LogitRowStats sy = ev::logit_row_stats_ref(y, target);
      // Same sum in the same order as token_nll; only the grouping of lse − x_t differs: (m + log S) − x_t vs
      // (log S + m) − x_t, two roundings of magnitude ≤ |m| + |log S| + |x_t| on each side.
      const double mag = std::abs(sx.lse) + 2.0 * std::abs(x[static_cast<size_t>(target)]) + std::log(vocab) + 1.0;
      EXPECT_NEAR(sx.nll, ev::token_nll(x, target), 4.0 * kU * mag);
      EXPECT_EQ(sx.argmax, ev::argmax(x));
      EXPECT_EQ(sy.argmax, ev::argmax(y));
      // kl.cpp: lp_i = (x_i − m) − log S; the twin: x_i − (m + log S). Each lp_i, lq_i differs by ≤ 2 roundings of
      // magnitude M = max|x| + |lse| + 1, so each term by ≤ p_i·4uM·(2 + |lp_i − lq_i|) (p_i moves with lp_i), and
      // the index-order sums by ≤ vocab·u·Σ|t|: |Δkl| ≤ 4uM·(2 + max|lp − lq|) + 2·vocab·u·Σ|t|.
      double abs_sum = 0, max_x = 0;
      const double kl = ev::logit_row_kl_ref(x, sx.lse, y, sy.lse, &abs_sum);
      for (size_t i = 0; i < x.size(); ++i) max_x = std::max({max_x, std::abs(double(x[i])), std::abs(double(y[i]))});
      const double M = max_x + std::max(std::abs(sx.lse), std::abs(sy.lse)) + 1.0;
      const double kl_eval = ev::kl_divergence(x, y);
      EXPECT_NEAR(kl, kl_eval, 4.0 * kU * M * (2.0 + 2.0 * M) + 2.0 * vocab * kU * abs_sum);
      if (vocab > 1) EXPECT_GT(kl, 0.0);
      // Identical rows: exactly 0, as in kl.cpp.
      EXPECT_EQ(ev::logit_row_kl_ref(x, sx.lse, x, sx.lse), 0.0);
    }
  }
}

TEST(LogitStatsRef, TiesMissingTargetsAndNonFiniteRows) {
  const std::vector<float> tie = {1.0f, 5.0f, -2.0f, 5.0f, 5.0f};
  EXPECT_EQ(ev::logit_row_stats_ref(tie, 0).argmax, 1);
  EXPECT_TRUE(std::isnan(ev::logit_row_stats_ref(tie, -1).nll));
  EXPECT_TRUE(std::isnan(ev::logit_row_stats_ref(tie, 5).nll));
  EXPECT_FALSE(std::isnan(ev::logit_row_stats_ref(tie, 4).nll));
  // Uniform row: lse = log n exactly enough, nll = log n.
  const std::vector<float> flat(1000, 0.25f);
  EXPECT_NEAR(ev::logit_row_stats_ref(flat, 3).nll, std::log(1000.0), 1e-13);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> x = {0.5f, 1.5f, 2.5f};
    x[1] = bad;
    const ev::LogitRowStats s = ev::logit_row_stats_ref(x, 0);
    EXPECT_TRUE(std::isnan(s.lse));
    EXPECT_TRUE(std::isnan(s.nll));
    EXPECT_EQ(s.argmax, -1);
    const std::vector<float> ok = {0.5f, 1.5f, 2.5f};
    const double lse_ok = ev::logit_row_stats_ref(ok, 0).lse;
    EXPECT_TRUE(std::isnan(ev::logit_row_kl_ref(ok, lse_ok, x, lse_ok)));
    EXPECT_TRUE(std::isnan(ev::logit_row_kl_ref(x, lse_ok, ok, lse_ok)));
  }
  const std::vector<float> ok = {0.5f, 1.5f};
  EXPECT_TRUE(std::isnan(ev::logit_row_kl_ref(ok, NAN, ok, 1.0)));
  EXPECT_THROW(ev::logit_row_stats_ref(std::vector<float>{}, 0), std::exception);
  EXPECT_THROW(ev::logit_row_kl_ref(ok, 1.0, tie, 1.0), std::exception);
}

}  // namespace
