#include "futransformer/eval/logit_stats_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "futransformer/error.h"
#include "futransformer/eval/report.h"

namespace futransformer::eval {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool all_finite(std::span<const float> x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

LogitRowStats logit_row_stats_ref(std::span<const float> x, int32_t target) {
  check(!x.empty(), "logit_row_stats_ref: empty row");
  if (!all_finite(x)) return {kNaN, kNaN, -1};
  // kl.cpp's row_stats: the max exactly (a float widened to double), then Σ exp(x − m) in index order.
  double m = -INFINITY;
  for (float v : x) m = std::max(m, static_cast<double>(v));
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - m);
  LogitRowStats s;
  s.lse = m + std::log(sum);
  s.nll = target >= 0 && static_cast<size_t>(target) < x.size()
              ? s.lse - static_cast<double>(x[static_cast<size_t>(target)])
              : kNaN;
  s.argmax = static_cast<int32_t>(argmax(x));
  return s;
}

double logit_row_kl_ref(std::span<const float> x, double lse_p, std::span<const float> y, double lse_q,
                        double* term_abs_sum) {
  check(!x.empty() && x.size() == y.size(), "logit_row_kl_ref: rows of sizes ", x.size(), " and ", y.size(),
        " (expected equal and non-empty)");
  if (term_abs_sum) *term_abs_sum = kNaN;
  if (!std::isfinite(lse_p) || !std::isfinite(lse_q) || !all_finite(x) || !all_finite(y)) return kNaN;
  double kl = 0, abs_sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double lp = static_cast<double>(x[i]) - lse_p;
    const double lq = static_cast<double>(y[i]) - lse_q;
    const double term = std::exp(lp) * (lp - lq);
    kl += term;
    abs_sum += std::abs(term);
  }
  if (term_abs_sum) *term_abs_sum = abs_sum;
  return kl;
}

}  // namespace futransformer::eval
