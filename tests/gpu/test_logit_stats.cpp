// logit_row_stats / logit_row_kl against their CPU twin (futransformer/eval/logit_stats_ref.h) on random rows, plus
// the exact cases: argmax ties, identical rows (KL 0), missing targets, non-finite rows, alignment independence.
#include "futransformer/cuda/logit_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "futransformer/eval/logit_stats_ref.h"
#include "gpu_test_util.h"

namespace {

using futransformer::test::DeviceBuffer;
namespace ft = futransformer;

constexpr double kU = 0x1.0p-53;  // unit roundoff of fp64

// lse = m + log S, S = Σ exp(x − m) ∈ [1, vocab]. Both sides round each exp term (CUDA's exp and glibc's: ≤ 1 ulp
// each) and the sum: the twin in index order (error ≤ (vocab − 1)·u·S), the GPU in a per-thread order with
// rescales plus a 13-level tree (≤ (vocab/256 + 40)·u·S). So |ΔS|/S ≤ (2·vocab + 64)·u, log adds ≤ 1 ulp of log S
// and the final m + log S one ulp of |lse| on each side: |Δlse| ≤ (2·vocab + 64)·u + 4·u·(|lse| + 1). NLL = lse − x_t
// adds one more rounding of |nll| per side.
double lse_tolerance(int vocab, double lse) { return (2.0 * vocab + 64.0) * kU + 4.0 * kU * (std::abs(lse) + 1.0); }
double nll_tolerance(int vocab, double lse, double nll) { return lse_tolerance(vocab, lse) + 2.0 * kU * std::abs(nll); }

// KL from the same lse on both sides: the terms p_i (lp_i − lq_i) differ only through exp (≤ 2 ulp apart, lp and
// lq are the same correctly rounded differences), and the sums through their order (index order ≤ vocab·u·Σ|t|,
// the GPU's ≤ (vocab/256 + 40)·u·Σ|t|): |Δkl| ≤ (2·vocab + 64)·u·Σ|t_i| with Σ|t_i| from the twin.
double kl_tolerance(int vocab, double term_abs_sum) { return (2.0 * vocab + 64.0) * kU * term_abs_sum + 1e-300; }

struct Case {
  int rows, vocab;
  int64_t ld;
};

// Logits: normal × 3 (the spread of a trained LM head's output) plus a few peaks of +8 … +16 per row.
std::vector<float> random_logits(int rows, int vocab, int64_t ld, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> pos(0, vocab - 1);
  std::uniform_real_distribution<float> peak(8.0f, 16.0f);
  std::vector<float> x(static_cast<size_t>(rows) * ld, std::nanf(""));  // padding beyond vocab: NaN, never read
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * ld;
    for (int i = 0; i < vocab; ++i) row[i] = normal(rng);
    for (int k = 0; k < 3; ++k) row[pos(rng)] += peak(rng);
  }
  return x;
}

// The other engine: base + normal × 0.3 (a quantised model's perturbation; KL of a few 1e-2 nats).
std::vector<float> perturbed(const std::vector<float>& base, int rows, int vocab, int64_t ld, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> y = base;
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < vocab; ++i) y[static_cast<size_t>(r) * ld + i] += normal(rng);
  return y;
}

// Outputs are filled with 0x7F bytes before each launch: a finite double (~1.4e306) and int32 0x7F7F7F7F, distinct
// from every legitimate answer including a non-finite row's NaN / −1, so an unwritten row shows.
template <typename T>
void poison(DeviceBuffer<T>& b) {
  ASSERT_EQ(cudaMemset(b.p, 0x7F, b.n * sizeof(T)), cudaSuccess);
}

std::span<const float> row_of(const std::vector<float>& x, int64_t ld, int r, int vocab) {
  return {x.data() + static_cast<size_t>(r) * ld, static_cast<size_t>(vocab)};
}

struct GpuStats {
  std::vector<double> lse, nll;
  std::vector<int32_t> argmax;
};

GpuStats run_stats(const DeviceBuffer<float>& x, int64_t ld, int rows, int vocab, const std::vector<int32_t>& targets) {
  DeviceBuffer<int32_t> t(targets);
  DeviceBuffer<double> lse(rows), nll(rows);
  DeviceBuffer<int32_t> am(rows);
  poison(lse);
  poison(nll);
  poison(am);
  EXPECT_EQ(ft::cuda::logit_row_stats(x.p, ld, rows, vocab, t.p, lse.p, nll.p, am.p, nullptr), cudaSuccess)
      << ft::cuda::logit_stats_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {lse.download(), nll.download(), am.download()};
}

std::vector<double> run_kl(const DeviceBuffer<float>& x, int64_t ldx, const std::vector<double>& lse_x,
                           const DeviceBuffer<float>& y, int64_t ldy, const std::vector<double>& lse_y, int rows,
                           int vocab) {
  DeviceBuffer<double> lx(lse_x), ly(lse_y), kl(rows);
  poison(kl);
  EXPECT_EQ(ft::cuda::logit_row_kl(x.p, ldx, lx.p, y.p, ldy, ly.p, rows, vocab, kl.p, nullptr), cudaSuccess)
      << ft::cuda::logit_stats_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return kl.download();
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

class LogitStatsRandom : public ::testing::TestWithParam<Case> {};

TEST_P(LogitStatsRandom, MatchesTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  const uint64_t seed = 1000003ull * c.rows + c.vocab;
  const std::vector<float> hx = random_logits(c.rows, c.vocab, c.ld, seed);
  const std::vector<float> hy = perturbed(hx, c.rows, c.vocab, c.ld, seed + 1);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> tok(0, c.vocab - 1);
  std::vector<int32_t> targets(static_cast<size_t>(c.rows));
  for (auto& t : targets) t = tok(rng);
  targets[0] = -1;  // "no target"
  if (c.rows > 2) targets[2] = c.vocab;  // outside the row: NaN, never read
  const DeviceBuffer<float> dx(hx), dy(hy);
  const GpuStats gx = run_stats(dx, c.ld, c.rows, c.vocab, targets);
  const GpuStats gy = run_stats(dy, c.ld, c.rows, c.vocab, targets);
  const std::vector<double> kl = run_kl(dx, c.ld, gx.lse, dy, c.ld, gy.lse, c.rows, c.vocab);
  for (int r = 0; r < c.rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const auto x = row_of(hx, c.ld, r, c.vocab), y = row_of(hy, c.ld, r, c.vocab);
    const ft::eval::LogitRowStats sx = ft::eval::logit_row_stats_ref(x, targets[r]);
    const ft::eval::LogitRowStats sy = ft::eval::logit_row_stats_ref(y, targets[r]);
    ASSERT_TRUE(std::isfinite(sx.lse));
    EXPECT_NEAR(gx.lse[r], sx.lse, lse_tolerance(c.vocab, sx.lse));
    EXPECT_NEAR(gy.lse[r], sy.lse, lse_tolerance(c.vocab, sy.lse));
    EXPECT_EQ(gx.argmax[r], sx.argmax);
    EXPECT_EQ(gy.argmax[r], sy.argmax);
    if (std::isnan(sx.nll)) {
      EXPECT_TRUE(std::isnan(gx.nll[r])) << gx.nll[r];
    } else {
      EXPECT_NEAR(gx.nll[r], sx.nll, nll_tolerance(c.vocab, sx.lse, sx.nll));
      EXPECT_NEAR(gy.nll[r], sy.nll, nll_tolerance(c.vocab, sy.lse, sy.nll));
    }
    // The kernel alone: the twin fed the GPU's lse.
    double abs_sum = 0;
    const double kl_same = ft::eval::logit_row_kl_ref(x, gx.lse[r], y, gy.lse[r], &abs_sum);
    EXPECT_NEAR(kl[r], kl_same, kl_tolerance(c.vocab, abs_sum));
    // End to end against the twin's own lse: each lse difference shifts every lp_i (or lq_i) by the same amount,
    // which moves KL by at most that amount times Σ p_i (= 1 within rounding; 1.01 bounds it).
    const double kl_twin = ft::eval::logit_row_kl_ref(x, sx.lse, y, sy.lse);
    EXPECT_NEAR(kl[r], kl_twin,
                kl_tolerance(c.vocab, abs_sum) +
                    1.01 * (std::abs(gx.lse[r] - sx.lse) + std::abs(gy.lse[r] - sy.lse)) + 4 * kU);
    if (c.vocab > 1) EXPECT_GT(kl[r], 0.0);  // the perturbation is visible
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LogitStatsRandom,
                         ::testing::Values(Case{1, 49152, 49152}, Case{7, 49152, 49160}, Case{2048, 49152, 49152},
                                           Case{1, 128256, 128256}, Case{7, 128256, 128263}, Case{7, 61, 67},
                                           Case{2048, 61, 64}, Case{1, 1, 1}, Case{7, 1, 5},
                                           Case{3, 1 << 20, 1 << 20}));

// Ties: the maximum at several indices walked by different threads (group g goes to thread g % 256), the later
// thread holding the lower index; the first index must win, as in eval::argmax.
TEST(LogitStats, ArgmaxTiesPickFirstIndex) {
  FT_REQUIRE_CUDA_DEVICE();
  const int vocab = 49152, rows = 3;
  std::vector<float> hx = random_logits(rows, vocab, vocab, 7);
  const int ties[rows][3] = {
      {4 * 300 + 1, 4 * 50 + 3, 9999}, {4 * 257 + 2, 4 * 257 + 3, 4 * 1 + 0}, {vocab - 1, 0, 17}};
  const int expect[rows] = {4 * 50 + 3, 4, 0};
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < 3; ++k) hx[static_cast<size_t>(r) * vocab + ties[r][k]] = 40.0f;
  const DeviceBuffer<float> dx(hx);
  const GpuStats g = run_stats(dx, vocab, rows, vocab, std::vector<int32_t>(rows, 0));
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(g.argmax[r], expect[r]) << "row " << r;
    EXPECT_EQ(ft::eval::logit_row_stats_ref(row_of(hx, vocab, r, vocab), 0).argmax, expect[r]) << "row " << r;
  }
}

// Identical rows give KL exactly 0, also when the copy lies at another alignment (scalar loads instead of 16-byte
// ones) with its own lse: the per-row order does not depend on the alignment, so the lse is bit-identical.
TEST(LogitStats, IdenticalRowsGiveExactlyZeroAndAlignmentDoesNotMatter) {
  FT_REQUIRE_CUDA_DEVICE();
  const int rows = 7, vocab = 128256;
  const int64_t ld_a = vocab, ld_b = vocab + 3;
  const std::vector<float> ha = random_logits(rows, vocab, ld_a, 11);
  std::vector<float> hb(1 + static_cast<size_t>(rows) * ld_b, 0.5f);  // +1: row 0 starts 4 bytes past an alignment
  for (int r = 0; r < rows; ++r)
    std::memcpy(hb.data() + 1 + static_cast<size_t>(r) * ld_b, ha.data() + static_cast<size_t>(r) * ld_a,
                sizeof(float) * vocab);
  const DeviceBuffer<float> da(ha), db(hb);
  const std::vector<int32_t> targets(rows, 5);
  const GpuStats ga = run_stats(da, ld_a, rows, vocab, targets);
  DeviceBuffer<int32_t> t(targets);
  DeviceBuffer<double> lse_b(rows), nll_b(rows);
  DeviceBuffer<int32_t> am_b(rows);
  poison(lse_b);
  poison(nll_b);
  poison(am_b);
  ASSERT_EQ(ft::cuda::logit_row_stats(db.p + 1, ld_b, rows, vocab, t.p, lse_b.p, nll_b.p, am_b.p, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> lb = lse_b.download(), nb = nll_b.download();
  const std::vector<int32_t> ab = am_b.download();
  for (int r = 0; r < rows; ++r) {
    EXPECT_TRUE(same_bits(ga.lse[r], lb[r])) << "row " << r << ": " << ga.lse[r] << " vs " << lb[r];
    EXPECT_TRUE(same_bits(ga.nll[r], nb[r])) << "row " << r;
    EXPECT_EQ(ga.argmax[r], ab[r]) << "row " << r;
  }
  DeviceBuffer<double> la(ga.lse), lbd(lb), kl(rows), kl_self(rows);
  poison(kl);
  poison(kl_self);
  ASSERT_EQ(ft::cuda::logit_row_kl(da.p, ld_a, la.p, db.p + 1, ld_b, lbd.p, rows, vocab, kl.p, nullptr), cudaSuccess);
  ASSERT_EQ(ft::cuda::logit_row_kl(da.p, ld_a, la.p, da.p, ld_a, la.p, rows, vocab, kl_self.p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> k = kl.download(), ks = kl_self.download();
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(k[r], 0.0) << "row " << r;
    EXPECT_EQ(ks[r], 0.0) << "row " << r;
  }
}

// A NaN, +Inf or −Inf logit makes that row's lse, nll and KL NaN and its argmax −1; the other rows are unaffected.
TEST(LogitStats, NonFiniteRowsGiveNaN) {
  FT_REQUIRE_CUDA_DEVICE();
  const int rows = 5, vocab = 61;
  std::vector<float> hx = random_logits(rows, vocab, vocab, 3);
  hx[1 * vocab + 17] = std::nanf("");
  hx[2 * vocab + 60] = INFINITY;
  hx[3 * vocab + 0] = -INFINITY;
  const std::vector<int32_t> targets = {1, 2, 3, 4, -1};
  const DeviceBuffer<float> dx(hx);
  const GpuStats g = run_stats(dx, vocab, rows, vocab, targets);
  const std::vector<float> hy = perturbed(hx, rows, vocab, vocab, 4);
  const DeviceBuffer<float> dy(hy);
  const GpuStats gy = run_stats(dy, vocab, rows, vocab, targets);
  const std::vector<double> kl = run_kl(dx, vocab, g.lse, dy, vocab, gy.lse, rows, vocab);
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const bool bad = r >= 1 && r <= 3;
    EXPECT_EQ(std::isnan(g.lse[r]), bad) << g.lse[r];
    EXPECT_EQ(std::isnan(g.nll[r]), bad || targets[r] < 0) << g.nll[r];
    EXPECT_EQ(std::isnan(kl[r]), bad) << kl[r];
    if (bad) EXPECT_EQ(g.argmax[r], -1);
    const ft::eval::LogitRowStats s = ft::eval::logit_row_stats_ref(row_of(hx, vocab, r, vocab), targets[r]);
    EXPECT_EQ(g.argmax[r], s.argmax);
    EXPECT_EQ(std::isnan(s.lse), bad);
  }
}

// Optional outputs: only lse requested; nll and argmax buffers untouched (still poisoned).
TEST(LogitStats, OnlyRequestedOutputsAreWritten) {
  FT_REQUIRE_CUDA_DEVICE();
  const int rows = 7, vocab = 61;
  const std::vector<float> hx = random_logits(rows, vocab, vocab, 5);
  const DeviceBuffer<float> dx(hx);
  DeviceBuffer<double> lse(rows);
  poison(lse);
  ASSERT_EQ(ft::cuda::logit_row_stats(dx.p, vocab, rows, vocab, nullptr, lse.p, nullptr, nullptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> l = lse.download();
  for (int r = 0; r < rows; ++r) {
    const double ref = ft::eval::logit_row_stats_ref(row_of(hx, vocab, r, vocab), -1).lse;
    EXPECT_NEAR(l[r], ref, lse_tolerance(vocab, ref)) << "row " << r;
  }
}

// Host-side checks: no device needed (the launcher refuses before any CUDA call).
TEST(LogitStatsHost, CanImplementRejectsBadShapes) {
  std::string why;
  EXPECT_EQ(ft::cuda::logit_row_stats_can_implement(100, 3, 100, &why), cudaSuccess);
  EXPECT_EQ(ft::cuda::logit_row_stats_can_implement(100, 0, 100, &why), cudaSuccess);
  EXPECT_EQ(ft::cuda::logit_row_stats_can_implement(1 << 20, 1, 1 << 20, &why), cudaSuccess);
  EXPECT_EQ(ft::cuda::logit_row_stats_can_implement(100, -1, 100, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("rows"), std::string::npos) << why;
  EXPECT_EQ(ft::cuda::logit_row_stats_can_implement(100, 1, 0, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("vocab"), std::string::npos) << why;
  EXPECT_EQ(ft::cuda::logit_row_stats_can_implement((1 << 20) + 1, 1, (1 << 20) + 1, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("vocab"), std::string::npos) << why;
  EXPECT_EQ(ft::cuda::logit_row_stats_can_implement(99, 1, 100, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("ld"), std::string::npos) << why;
  EXPECT_EQ(ft::cuda::logit_row_kl_can_implement(100, 100, 2, 100, &why), cudaSuccess);
  EXPECT_EQ(ft::cuda::logit_row_kl_can_implement(99, 100, 2, 100, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("ld_base"), std::string::npos) << why;
  EXPECT_EQ(ft::cuda::logit_row_kl_can_implement(100, 99, 2, 100, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("ld_other"), std::string::npos) << why;
  EXPECT_EQ(ft::cuda::logit_row_kl_can_implement(100, 100, 2, 0, &why), cudaErrorInvalidValue);
  EXPECT_EQ(ft::cuda::logit_row_kl_can_implement(100, 100, -2, 100, &why), cudaErrorInvalidValue);
}

TEST(LogitStatsHost, LauncherRejectsBadPointers) {
  // Fake, never dereferenced addresses: every call below is refused before any launch.
  const auto* logits = reinterpret_cast<const float*>(uintptr_t{0x1000});
  auto* lse = reinterpret_cast<double*>(uintptr_t{0x2000});
  auto* targets = reinterpret_cast<const int32_t*>(uintptr_t{0x3000});
  EXPECT_EQ(ft::cuda::logit_row_stats(nullptr, 10, 1, 10, nullptr, lse, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(ft::cuda::logit_stats_last_error()).find("logits"), std::string::npos);
  EXPECT_EQ(ft::cuda::logit_row_stats(logits, 10, 1, 10, nullptr, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(ft::cuda::logit_stats_last_error()).find("nothing"), std::string::npos);
  EXPECT_EQ(ft::cuda::logit_row_stats(logits, 10, 1, 10, nullptr, nullptr, lse, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(ft::cuda::logit_stats_last_error()).find("targets"), std::string::npos);
  EXPECT_EQ(ft::cuda::logit_row_stats(logits, 10, 1, 10, targets, lse + 0, reinterpret_cast<double*>(0x2004),
                                      nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(ft::cuda::logit_stats_last_error()).find("aligned"), std::string::npos);
  EXPECT_EQ(ft::cuda::logit_row_stats(logits, 9, 1, 10, targets, lse, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(ft::cuda::logit_stats_last_error()).find("ld"), std::string::npos);
  // rows == 0 is accepted and launches nothing.
  EXPECT_EQ(ft::cuda::logit_row_stats(logits, 10, 0, 10, targets, lse, nullptr, nullptr, nullptr), cudaSuccess);
  EXPECT_STREQ(ft::cuda::logit_stats_last_error(), "");
  EXPECT_EQ(ft::cuda::logit_row_kl(logits, 10, lse, nullptr, 10, lse, 1, 10, lse, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(ft::cuda::logit_stats_last_error()).find("other"), std::string::npos);
  EXPECT_EQ(ft::cuda::logit_row_kl(logits, 10, lse, logits, 10, nullptr, 1, 10, lse, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(ft::cuda::logit_stats_last_error()).find("lse_other"), std::string::npos);
  EXPECT_EQ(ft::cuda::logit_row_kl(logits, 10, lse, logits, 10, lse, 0, 10, lse, nullptr), cudaSuccess);
}

}  // namespace
