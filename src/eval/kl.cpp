// Next-token distributions of several engines against a baseline over the perplexity windows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>

#include "futransformer/error.h"
#include "futransformer/eval/report.h"

namespace futransformer::eval {
namespace {

// max and Σ exp(x − max) of one row, in double, in the order token_nll uses (so the NLL here is bit-identical to
// evaluate_perplexity's).
struct RowStats {
  double mx = 0, sum = 0;
};

RowStats row_stats(std::span<const float> x) {
  RowStats s;
  s.mx = -INFINITY;
  for (float v : x) s.mx = std::max(s.mx, static_cast<double>(v));
  check(std::isfinite(s.mx), "distribution comparison: logits are not finite");
  for (float v : x) s.sum += std::exp(static_cast<double>(v) - s.mx);
  // A NaN logit passes the max (comparisons with NaN are false) but not the sum.
  check(std::isfinite(s.sum), "distribution comparison: logits are not finite");
  return s;
}

double nll(std::span<const float> x, const RowStats& s, int32_t target) {
  return std::log(s.sum) + s.mx - static_cast<double>(x[static_cast<size_t>(target)]);
}

// KL(P || Q) from P's log-probabilities (lp) and probabilities (p) and Q's logits: log q_i = (y_i − max_y) − log Σ,
// each term p_i (lp_i − lq_i), so identical rows give exactly 0, and so do rows that differ by an exact constant.
double kl_from_base(std::span<const double> lp, std::span<const double> p, std::span<const float> y,
                    const RowStats& ys) {
  const double log_sum = std::log(ys.sum);
  double kl = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (p[i] == 0.0) continue;
    const double lq = (static_cast<double>(y[i]) - ys.mx) - log_sum;
    kl += p[i] * (lp[i] - lq);
  }
  return kl;
}

void base_log_probs(std::span<const float> x, const RowStats& s, std::vector<double>& lp, std::vector<double>& p) {
  const double log_sum = std::log(s.sum);
  lp.resize(x.size());
  p.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    lp[i] = (static_cast<double>(x[i]) - s.mx) - log_sum;
    p[i] = std::exp(lp[i]);
  }
}

}  // namespace

int64_t argmax(std::span<const float> logits) {
  check(!logits.empty(), "argmax: empty logits");
  int64_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  return best;
}

double kl_divergence(std::span<const float> base_logits, std::span<const float> other_logits) {
  check(!base_logits.empty() && base_logits.size() == other_logits.size(), "kl_divergence: logits of sizes ",
        base_logits.size(), " and ", other_logits.size(), " (expected equal and non-empty)");
  const RowStats bs = row_stats(base_logits), os = row_stats(other_logits);
  std::vector<double> lp, p;
  base_log_probs(base_logits, bs, lp, p);
  return kl_from_base(lp, p, other_logits, os);
}

std::vector<DistributionComparison> compare_distributions(Engine& base, std::span<Engine* const> others,
                                                          std::span<const int32_t> tokens, const PerplexityOptions& o,
                                                          const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t windows = perplexity_windows(static_cast<int64_t>(tokens.size()), o);
  const int64_t vocab = base.config().vocab_size;
  const size_t n_other = others.size();
  check(o.ctx <= base.max_sequence_length(), "distribution comparison: --ctx ", o.ctx, " exceeds the baseline ",
        "engine's maximum sequence length ", base.max_sequence_length());
  for (Engine* e : others) {
    check(e != nullptr, "distribution comparison: null engine");
    check(e->config().vocab_size == vocab, "distribution comparison: vocabularies differ (", vocab, " vs ",
          e->config().vocab_size, ")");
    check(o.ctx <= e->max_sequence_length(), "distribution comparison: --ctx ", o.ctx, " exceeds an engine's ",
          "maximum sequence length ", e->max_sequence_length());
  }
  double base_seconds = 0;
  const int64_t total = windows * (o.ctx - 1);
  // Per-row results are written to row-indexed slots and summed in row order afterwards, so the sums do not depend
  // on the number of threads.
  double base_nll = 0;
  std::vector<ComparisonSums> sums(n_other);
  int64_t done = 0;
  constexpr int32_t kSeq = 0;
  auto timed_forward = [&](Engine& e, const SequenceChunk& chunk, double& seconds) {
    const auto s = std::chrono::steady_clock::now();
    std::vector<std::vector<float>> out = e.forward(std::span<const SequenceChunk>(&chunk, 1), true);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    check(out.size() == 1 && static_cast<int64_t>(out[0].size()) ==
                                 static_cast<int64_t>(chunk.tokens.size()) * vocab,
          "distribution comparison: engine returned logits of the wrong size");
    return std::move(out[0]);
  };
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* win = tokens.data() + w * o.ctx;
    base.reset(kSeq);
    for (Engine* e : others) e->reset(kSeq);
    for (int64_t start = 0; start < o.ctx; start += o.chunk) {
      const int64_t n = std::min(o.chunk, o.ctx - start);
      const SequenceChunk chunk{kSeq, std::vector<int32_t>(win + start, win + start + n)};
      const std::vector<float> bl = timed_forward(base, chunk, base_seconds);
      std::vector<std::vector<float>> ol(n_other);
      for (size_t k = 0; k < n_other; ++k) ol[k] = timed_forward(*others[k], chunk, sums[k].seconds);
      // Row i predicts token start + i + 1 of the window; the window's last row has nothing to predict.
      const int64_t rows = std::min(n, o.ctx - 1 - start);
      std::vector<double> row_base_nll(static_cast<size_t>(std::max<int64_t>(rows, 0)));
      std::vector<double> row_nll(row_base_nll.size() * n_other), row_kl(row_base_nll.size() * n_other);
      std::vector<uint8_t> row_agree(row_base_nll.size() * n_other);
      std::exception_ptr error;
#ifdef _OPENMP
#pragma omp parallel
#endif
      {
        std::vector<double> lp, p;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < rows; ++i) {
          // An exception must not leave an OpenMP region: the first one is kept and rethrown after it.
          try {
            const int32_t target = win[start + i + 1];
            check(target >= 0 && target < vocab, "distribution comparison: token ", target, " outside the vocabulary");
            const std::span<const float> x(bl.data() + i * vocab, static_cast<size_t>(vocab));
            const RowStats bs = row_stats(x);
            row_base_nll[static_cast<size_t>(i)] = nll(x, bs, target);
            base_log_probs(x, bs, lp, p);
            const int64_t top = argmax(x);
            for (size_t k = 0; k < n_other; ++k) {
              const std::span<const float> y(ol[k].data() + i * vocab, static_cast<size_t>(vocab));
              const RowStats ys = row_stats(y);
              const size_t slot = static_cast<size_t>(i) * n_other + k;
              row_nll[slot] = nll(y, ys, target);
              row_kl[slot] = kl_from_base(lp, p, y, ys);
              row_agree[slot] = argmax(y) == top;
            }
          } catch (...) {
#ifdef _OPENMP
#pragma omp critical(ft_compare_error)
#endif
            if (!error) error = std::current_exception();
          }
        }
      }
      if (error) std::rethrow_exception(error);
      for (int64_t i = 0; i < rows; ++i) {
        base_nll += row_base_nll[static_cast<size_t>(i)];
        for (size_t k = 0; k < n_other; ++k) {
          const size_t slot = static_cast<size_t>(i) * n_other + k;
          sums[k].nll += row_nll[slot];
          sums[k].kl_sum += row_kl[slot];
          sums[k].kl_max = std::max(sums[k].kl_max, row_kl[slot]);
          sums[k].agree += row_agree[slot];
        }
      }
      done += std::max<int64_t>(rows, 0);
      if (progress) progress(done, total);
    }
  }
  base.reset(kSeq);
  for (Engine* e : others) e->reset(kSeq);

  return distribution_comparisons(perplexity_result(windows, done, base_nll, base_seconds), sums);
}

std::vector<DistributionComparison> distribution_comparisons(const PerplexityResult& base,
                                                             const std::vector<ComparisonSums>& others) {
  std::vector<DistributionComparison> out(others.size());
  const double count = static_cast<double>(base.predicted_tokens);
  for (size_t k = 0; k < others.size(); ++k) {
    DistributionComparison& c = out[k];
    c.base = base;
    c.other = perplexity_result(base.windows, base.predicted_tokens, others[k].nll, others[k].seconds);
    c.mean_kl = others[k].kl_sum / count;
    c.max_kl = others[k].kl_max;
    c.top1_agreement = static_cast<double>(others[k].agree) / count;
    c.predicted_tokens = base.predicted_tokens;
  }
  return out;
}

DistributionComparison compare_distributions(Engine& base, Engine& other, std::span<const int32_t> tokens,
                                             const PerplexityOptions& options,
                                             const std::function<void(int64_t, int64_t)>& progress) {
  Engine* const e[1] = {&other};
  return compare_distributions(base, std::span<Engine* const>(e, 1), tokens, options, progress).front();
}

}  // namespace futransformer::eval
