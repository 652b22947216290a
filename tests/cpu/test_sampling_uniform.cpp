// sample_with_uniform (the sampler with its draw as an argument): agreement with Sampler, its order and tie rules,
// the shared fp64 exp, and a host replay of the GPU walk's shortcuts (src/cuda/sampling.cuh) against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sampling_exp.h"
#include "futransformer/error.h"
#include "futransformer/sampling.h"

namespace futransformer {
namespace {

using sampling_detail::sampling_exp;

SamplingParams params(float t, int32_t k, float p, uint64_t seed = 0) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.seed = seed;
  return s;
}

std::vector<float> random_logits(std::mt19937& rng, int n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> l(n);
  for (float& x : l) x = d(rng);
  return l;
}

int64_t ulp_distance(double a, double b) {
  return std::abs(std::bit_cast<int64_t>(a) - std::bit_cast<int64_t>(b));  // both >= 0
}

TEST(SamplingExp, WithinTwoUlpOfStdExpAndExactAtZero) {
  EXPECT_EQ(sampling_exp(0.0), 1.0);
  EXPECT_EQ(sampling_exp(-0.0), 1.0);
  EXPECT_EQ(sampling_exp(-INFINITY), 0.0);
  EXPECT_EQ(sampling_exp(-746.0), 0.0);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> wide(-708.0, 0.0), narrow(-1.0, 0.0);
  int64_t worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? wide(rng) : narrow(rng);
    worst = std::max(worst, ulp_distance(sampling_exp(x), std::exp(x)));
  }
  EXPECT_LE(worst, 2) << "normal results";
  // Subnormal results are rounded once: within one unit of the last (subnormal) place.
  for (double x = -745.0; x < -708.5; x += 0.37) EXPECT_LE(ulp_distance(sampling_exp(x), std::exp(x)), 1) << x;
}

TEST(SampleWithUniform, MatchesSamplerForTheSameDraws) {
  std::mt19937 lrng(11);
  for (float t : {0.0f, 0.3f, 0.8f, 1.5f}) {
    for (int32_t k : {0, 1, 40}) {
      for (float p : {1.0f, 0.95f, 0.5f}) {
        const SamplingParams sp = params(t, k, p, 1000 + k);
        Sampler s(sp);
        std::mt19937_64 draws(sp.seed);  // Sampler's draw: the top 53 bits of one mt19937_64 output
        for (int trial = 0; trial < 30; ++trial) {
          const auto logits = random_logits(lrng, 1 + trial * 37, 3.0f);
          const int32_t got = s.sample(logits);
          const double u = t == 0.0f ? 0.5 : static_cast<double>(draws() >> 11) * 0x1.0p-53;
          EXPECT_EQ(got, sample_with_uniform(logits, sp, u)) << "T " << t << " k " << k << " p " << p;
        }
      }
    }
  }
}

TEST(SampleWithUniform, DrawSelectsByCumulativeMassInSortedOrder) {
  // p = 1, 0.5, 0.25 (T = 1, logits 0, -ln2, -2 ln2 in a shuffled order): total 1.75.
  const float l2 = std::log(2.0f);
  const std::vector<float> logits = {-2 * l2, 0.0f, -l2};
  const SamplingParams sp = params(1.0f, 0, 1.0f);
  EXPECT_EQ(sample_with_uniform(logits, sp, 0.0), 1);
  EXPECT_EQ(sample_with_uniform(logits, sp, 0.5), 1);   // u = 0.875 < 1
  EXPECT_EQ(sample_with_uniform(logits, sp, 0.6), 2);   // 1.05 in [1, 1.5)
  EXPECT_EQ(sample_with_uniform(logits, sp, 0.9), 0);   // 1.575 in [1.5, 1.75)
  EXPECT_EQ(sample_with_uniform(logits, sp, std::nextafter(1.0, 0.0)), 0);
  EXPECT_EQ(sample_with_uniform(logits, params(1.0f, 2, 1.0f), 0.9), 2);  // top-2: 1.35 in [1, 1.5)
  EXPECT_EQ(sample_with_uniform(logits, params(1.0f, 0, 0.5f), 0.99), 1);  // 1 >= 0.5 · 1.75: token 1 alone
}

TEST(SampleWithUniform, EqualLogitsOrderByTokenIdAndMaskedTokensAreNeverChosen) {
  const std::vector<float> logits = {-INFINITY, 2.0f, 5.0f, 2.0f, 5.0f, -INFINITY, 5.0f};
  const SamplingParams sp = params(1.0f, 0, 1.0f);
  // Sorted: 2, 4, 6 (p = 1 each), then 1, 3 (p = e^-3), then 0, 5 (p = 0).
  EXPECT_EQ(sample_with_uniform(logits, sp, 0.0), 2);
  const double total = 3.0 + 2.0 * std::exp(-3.0);
  EXPECT_EQ(sample_with_uniform(logits, sp, 1.5 / total), 4);
  EXPECT_EQ(sample_with_uniform(logits, sp, 2.5 / total), 6);
  EXPECT_EQ(sample_with_uniform(logits, sp, (3.0 + 0.5 * std::exp(-3.0)) / total), 1);
  EXPECT_EQ(sample_with_uniform(logits, sp, std::nextafter(1.0, 0.0)), 3);
  EXPECT_EQ(sample_with_uniform(logits, params(1.0f, 2, 1.0f), 0.99), 4);  // top-2 cuts at the id order
  EXPECT_EQ(sample_with_uniform(logits, params(0.0f, 0, 1.0f), 0.99), 2);  // greedy: the first maximum
}

TEST(SampleWithUniform, RejectsBadDrawsParametersAndLogits) {
  const std::vector<float> logits = {0.0f, 1.0f};
  EXPECT_THROW(sample_with_uniform(logits, params(1.0f, 0, 1.0f), 1.0), Error);
  EXPECT_THROW(sample_with_uniform(logits, params(1.0f, 0, 1.0f), -0.1), Error);
  EXPECT_THROW(sample_with_uniform(logits, params(1.0f, 0, 1.0f), NAN), Error);
  EXPECT_THROW(sample_with_uniform(logits, params(1.0f, -1, 1.0f), 0.5), Error);
  EXPECT_THROW(sample_with_uniform(logits, params(1.0f, 0, 0.0f), 0.5), Error);
  EXPECT_THROW(sample_with_uniform(logits, params(-1.0f, 0, 1.0f), 0.5), Error);
  EXPECT_THROW(sample_with_uniform(std::vector<float>{1.0f, NAN}, params(1.0f, 0, 1.0f), 0.5), Error);
  EXPECT_THROW(sample_with_uniform(std::vector<float>{1.0f, INFINITY}, params(1.0f, 0, 1.0f), 0.5), Error);
  EXPECT_THROW(sample_with_uniform(std::vector<float>{-INFINITY}, params(1.0f, 0, 1.0f), 0.5), Error);
}

// The GPU walk's algorithm on the host: stable sort by p descending, running sums that stop at the first
// p < 2^-53, binary searches for the top-p cut and the draw (src/cuda/sampling.cuh, walk_kernel).
int32_t gpu_walk_replay(const std::vector<float>& logits, const SamplingParams& sp, double u01) {
  const int n = static_cast<int>(logits.size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  const double inv_t = 1.0 / static_cast<double>(sp.temperature);
  std::vector<double> p(n);
  for (int i = 0; i < n; ++i) p[i] = sampling_exp((static_cast<double>(logits[i]) - mx) * inv_t);
  std::vector<int32_t> id(n);
  std::iota(id.begin(), id.end(), 0);
  std::stable_sort(id.begin(), id.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  int keep = sp.top_k > 0 && sp.top_k < n ? sp.top_k : n;
  std::vector<double> s;
  double sum = 0.0;
  for (int m = 0; m < keep; ++m) {
    if (m > 0 && p[id[m]] < 0x1.0p-53) break;
    s.push_back(sum += p[id[m]]);
  }
  const int m = static_cast<int>(s.size());
  if (sp.top_p < 1.0f) {
    const double target = static_cast<double>(sp.top_p) * s[std::min(keep, m) - 1];
    const int j = static_cast<int>(std::lower_bound(s.begin(), s.end(), target) - s.begin());
    if (j < m) keep = j + 1;
  }
  const int lim = std::min(keep, m);
  const double u = u01 * s[lim - 1];
  const int j = static_cast<int>(std::upper_bound(s.begin(), s.begin() + lim, u) - s.begin());
  return id[j < lim ? j : keep - 1];
}

TEST(SampleWithUniform, GpuWalkShortcutsChooseTheSameTokens) {
  std::mt19937 rng(5);
  std::mt19937_64 draws(6);
  int checked = 0;
  for (int n : {1, 7, 1000, 5000}) {
    for (float t : {0.3f, 0.8f, 1.5f, 40.0f}) {
      for (int32_t k : {0, 1, 40}) {
        for (float tp : {1.0f, 0.95f, 0.5f}) {
          for (int trial = 0; trial < 6; ++trial) {
            auto logits = random_logits(rng, n, trial % 2 ? 3.0f : 30.0f);
            if (trial == 2)  // ties and masked tokens
              for (int i = 0; i < n; i += 3) logits[i] = i % 2 ? -INFINITY : std::round(logits[i]);
            const double u = static_cast<double>(draws() >> 11) * 0x1.0p-53;
            const SamplingParams sp = params(t, k, tp);
            ASSERT_EQ(gpu_walk_replay(logits, sp, u), sample_with_uniform(logits, sp, u))
                << "n " << n << " T " << t << " k " << k << " p " << tp << " trial " << trial;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 4 * 3 * 3 * 6);
}

}  // namespace
}  // namespace futransformer
