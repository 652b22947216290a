#include "futransformer/quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>

#include "futransformer/error.h"
#include "quant/dense.h"
#include "quant/gptq_common.h"

namespace futransformer::quant {
namespace {

// Activations are converted to double in chunks of this many tokens, bounding the temporary copy.
constexpr int64_t kAddChunkTokens = 512;
// Each damping retry uses kRetryDampFactor times more damping, starting from at least kMinRetryDamp (for a request
// of 0); detail::kMaxDampRetries of them.
constexpr double kRetryDampFactor = 10.0;
constexpr double kMinRetryDamp = 0.01;

using detail::hessian_label;
using detail::kMaxHessianInputs;

}  // namespace

HessianAccumulator::HessianAccumulator(int64_t k, std::string name) : k_(k), name_(std::move(name)) {
  check(k > 0 && k <= kMaxHessianInputs, hessian_label(name_), ": Hessian input size must be in [1, ",
        kMaxHessianInputs, "], got ", k);
  h_.assign(static_cast<size_t>(k * k), 0.0);
}

void HessianAccumulator::add(const float* x, int64_t n_tokens) {
  const std::string label = hessian_label(name_);
  if (!detail::check_calibration_batch(x, n_tokens, n_, k_, label)) return;
  // Reject before touching H, so that a bad batch leaves the accumulator as it was.
  detail::check_activations_finite(x, n_tokens, k_, label);
  // Running mean: H ← H·n/(n+m) + (2/(n+m))·Σ xᵀx, with x pre-scaled by sqrt(2/(n+m)) so syrk does the sum.
  const int64_t total = n_ + n_tokens;
  const double scale = std::sqrt(2.0 / static_cast<double>(total));
  double beta = static_cast<double>(n_) / static_cast<double>(total);
  const int64_t chunk = std::min(n_tokens, kAddChunkTokens);
  std::vector<double> xd(static_cast<size_t>(chunk * k_));
  for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
    const int64_t m = std::min(chunk, n_tokens - t0);
    const float* src = x + t0 * k_;
    for (int64_t e = 0; e < m * k_; ++e) xd[static_cast<size_t>(e)] = scale * static_cast<double>(src[e]);
    detail::syrk_upper_accumulate(xd.data(), m, k_, beta, h_.data());
    beta = 1.0;
  }
  n_ = total;
}

double HessianAccumulator::at(int64_t i, int64_t j) const {
  check(i >= 0 && i < k_ && j >= 0 && j < k_, hessian_label(name_), ": Hessian index (", i, ", ", j,
        ") outside ", k_, " x ", k_);
  return i <= j ? h_[static_cast<size_t>(i * k_ + j)] : h_[static_cast<size_t>(j * k_ + i)];
}

std::vector<double> HessianAccumulator::hessian() const {
  std::vector<double> full(static_cast<size_t>(k_ * k_));
  for (int64_t i = 0; i < k_; ++i)
    for (int64_t j = i; j < k_; ++j)
      full[static_cast<size_t>(i * k_ + j)] = full[static_cast<size_t>(j * k_ + i)] =
          h_[static_cast<size_t>(i * k_ + j)];
  return full;
}

namespace detail {

std::string hessian_label(const std::string& name) { return name.empty() ? std::string("Hessian") : name; }

bool check_calibration_batch(const float* x, int64_t n_tokens, int64_t seen, int64_t k, const std::string& label) {
  check(n_tokens >= 0, label, ": negative calibration token count ", n_tokens);
  if (n_tokens == 0) return false;
  check(x != nullptr, label, ": null calibration activations for ", n_tokens, " tokens");
  check(n_tokens <= std::numeric_limits<int64_t>::max() / k - seen, label, ": calibration token count overflows (",
        seen, " + ", n_tokens, " tokens of ", k, " inputs)");
  return true;
}

void check_activations_finite(const float* x, int64_t n_tokens, int64_t k, const std::string& label) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < k; ++i)
      if (!std::isfinite(x[t * k + i])) fail_activation_not_finite(label, t, i, x[t * k + i]);
}

void fail_activation_not_finite(const std::string& label, int64_t token, int64_t input, float value) {
  fail(label, ": calibration activation (token ", token, " of this batch, input ", input, ") is not finite: ", value);
}

double gptq_retry_damp(double requested, int attempt) {
  if (attempt == 0) return requested;
  return std::max(requested, kMinRetryDamp) * std::pow(kRetryDampFactor, attempt - 1);
}

// Without act_order a group's scale/zero come from the group's *current* weights when the loop reaches its first
// column; that is only true for columns inside the current block (already updated by every earlier column) or at a
// block start (all lazy updates applied). So a block must hold whole groups, or a group must start on a block
// boundary. (The reference gptq.py reads a mid-block group's params from W, which has not yet received the in-block
// updates of the block's earlier columns; we use the updated values.)
int64_t gptq_effective_block(int64_t requested, int64_t group, int64_t K) {
  if (group == K || group % requested == 0) return requested;
  return requested > group ? requested - requested % group : group;
}

void gptq_validate(std::span<const float> w, int64_t rows, int64_t cols, int64_t h_k, int64_t h_samples,
                   const std::string& h_name, const GptqOptions& opt, const std::string& name) {
  check(rows > 0 && cols > 0, name, ": GPTQ needs a non-empty weight, got ", rows, " x ", cols);
  check(rows <= std::numeric_limits<int64_t>::max() / cols && static_cast<int64_t>(w.size()) == rows * cols, name,
        ": GPTQ got ", w.size(), " values for a ", rows, " x ", cols, " weight");
  check(h_k == cols, name, ": the Hessian (", hessian_label(h_name), ") has ", h_k, " inputs but the weight has ", cols,
        " columns");
  check(h_samples > 0, name, ": GPTQ needs calibration data, but the Hessian saw no tokens");
  check(std::isfinite(opt.damp_percent) && opt.damp_percent >= 0.0, name,
        ": GPTQ damping must be a finite fraction >= 0, got ", opt.damp_percent);
  check(opt.block_size > 0, name, ": GPTQ block size must be positive, got ", opt.block_size);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = w[static_cast<size_t>(r * cols + c)];
      check(std::isfinite(v), name, ": weight [", r, ", ", c, "] is not finite (", v, "); GPTQ needs finite weights");
    }
}

// Dead inputs (never active in calibration) cannot be judged by the Hessian: their weights are zeroed and they get a
// unit diagonal so H stays invertible, as the reference does.
GptqColumnPlan gptq_plan_columns(std::span<const double> h_diag, bool act_order) {
  GptqColumnPlan plan;
  const int64_t K = static_cast<int64_t>(h_diag.size());
  plan.diag.assign(h_diag.begin(), h_diag.end());
  for (int64_t i = 0; i < K; ++i) {
    if (plan.diag[static_cast<size_t>(i)] == 0.0) {
      plan.diag[static_cast<size_t>(i)] = 1.0;
      plan.dead.push_back(i);
    }
  }
  // Column order: descending diag(H) with act_order (stable, so ties keep their index order deterministically).
  plan.perm.resize(static_cast<size_t>(K));
  std::iota(plan.perm.begin(), plan.perm.end(), 0);
  if (act_order)
    std::stable_sort(plan.perm.begin(), plan.perm.end(), [&](int64_t a, int64_t b) {
      return plan.diag[static_cast<size_t>(a)] > plan.diag[static_cast<size_t>(b)];
    });
  plan.mean_diag = std::accumulate(plan.diag.begin(), plan.diag.end(), 0.0) / static_cast<double>(K);
  return plan;
}

void gptq_fail_not_positive_definite(const std::string& tensor_name, double damp) {
  fail(tensor_name, ": the calibration Hessian is not positive definite even with damping ", damp,
       " x mean(diag H) after ", kMaxDampRetries, " retries (degenerate calibration data?)");
}

void gptq_fail_row_non_finite(const std::string& tensor_name, int64_t row) {
  fail(tensor_name, ": GPTQ error updates made row ", row, " non-finite (ill-conditioned Hessian?)");
}

}  // namespace detail

GptqResult gptq_quantize_detailed(std::span<const float> w, int64_t rows, int64_t cols, const HessianAccumulator& h,
                                  const GptqOptions& opt, const std::string& tensor_name, bool record_inputs) {
  detail::gptq_validate(w, rows, cols, h.k(), h.n_samples(), h.name(), opt, tensor_name);
  const int64_t N = rows, K = cols;
  const int64_t G = opt.spec.resolved_group(K, tensor_name);
  const int64_t n_groups = K / G;
  const bool act = opt.act_order;
  GptqResult res;

  const std::span<const double> hu = h.upper();
  std::vector<double> h_diag(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) h_diag[static_cast<size_t>(i)] = hu[static_cast<size_t>(i * K + i)];
  detail::GptqColumnPlan plan = detail::gptq_plan_columns(h_diag, act);
  const std::vector<double>& diag = plan.diag;
  const std::vector<int64_t>& perm = plan.perm;
  res.stats.dead_inputs = static_cast<int64_t>(plan.dead.size());
  std::vector<float> W(w.begin(), w.end());
  for (int64_t i : plan.dead)
    for (int64_t r = 0; r < N; ++r) W[static_cast<size_t>(r * K + i)] = 0.0f;

  std::vector<formats::GroupParams> params(static_cast<size_t>(N * n_groups));
  if (record_inputs) res.group_inputs.assign(static_cast<size_t>(N * K), 0.0f);
  if (act) {
    // Static groups: params from the original weights of each original group, so the packed layout stays the
    // plain one (group g = columns [g·G, (g+1)·G)) whatever order the columns are quantised in.
    for (int64_t r = 0; r < N; ++r)
      for (int64_t g = 0; g < n_groups; ++g)
        params[static_cast<size_t>(r * n_groups + g)] = formats::int4_group_params(
            std::span<const float>(W.data() + r * K + g * G, static_cast<size_t>(G)), opt.spec);
    if (record_inputs) res.group_inputs = W;
    std::vector<float> Wp(W.size());
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < K; ++j)
        Wp[static_cast<size_t>(r * K + j)] = W[static_cast<size_t>(r * K + perm[static_cast<size_t>(j)])];
    W.swap(Wp);
  }

  // U: upper Cholesky factor of (H_perm + λI)⁻¹, retried with more damping when H is not positive definite.
  const double mean_diag = plan.mean_diag;
  std::vector<double> R(static_cast<size_t>(K * K));
  std::vector<float> U;
  std::vector<double> u_diag;
  bool factored = false;
  double damp = opt.damp_percent;
  for (int attempt = 0; attempt <= detail::kMaxDampRetries && !factored; ++attempt) {
    damp = detail::gptq_retry_damp(opt.damp_percent, attempt);
    const double lambda = damp * mean_diag;
#pragma omp parallel for schedule(dynamic, 32) if (K * K / 2 >= detail::kMinParallelWork)
    for (int64_t a = 0; a < K; ++a) {
      const int64_t i = perm[static_cast<size_t>(K - 1 - a)];
      for (int64_t b = 0; b < a; ++b) {
        const int64_t j = perm[static_cast<size_t>(K - 1 - b)];
        R[static_cast<size_t>(a * K + b)] = hu[static_cast<size_t>(std::min(i, j) * K + std::max(i, j))];
      }
      R[static_cast<size_t>(a * K + a)] = diag[static_cast<size_t>(i)] + lambda;
    }
    factored = detail::upper_cholesky_of_inverse_reversed(R, K, U, u_diag);
    res.stats.damp_retries = attempt;
  }
  if (!factored) detail::gptq_fail_not_positive_definite(tensor_name, damp);
  res.stats.damp_percent = damp;
  R = {};

  const int64_t B = detail::gptq_effective_block(opt.block_size, G, K);
  std::vector<uint8_t> nibbles(static_cast<size_t>(N * K));  // quantisation order (permuted with act_order)
  std::vector<float> rounded(record_inputs ? static_cast<size_t>(N * K) : 0);
  std::vector<float> err(static_cast<size_t>(N * B));
  std::vector<double> row_loss(static_cast<size_t>(N), 0.0);
  std::vector<uint8_t> row_bad(static_cast<size_t>(N), 0);
  std::exception_ptr failure;
  for (int64_t i1 = 0; i1 < K; i1 += B) {
    const int64_t i2 = std::min(i1 + B, K);
    // Rows are independent given U: each thread owns whole rows, so the result does not depend on thread count.
#pragma omp parallel for schedule(static) if (N * (i2 - i1) * (i2 - i1) / 2 >= detail::kMinParallelWork)
    for (int64_t r = 0; r < N; ++r) {
      try {
        float* wr = W.data() + r * K;
        float* er = err.data() + r * B;
        double loss = 0.0;
        for (int64_t j = i1; j < i2; ++j) {
          if (!act && j % G == 0) {
            params[static_cast<size_t>(r * n_groups + j / G)] =
                formats::int4_group_params(std::span<const float>(wr + j, static_cast<size_t>(G)), opt.spec);
            if (record_inputs) std::copy(wr + j, wr + j + G, res.group_inputs.begin() + r * K + j);
          }
          const int64_t g = (act ? perm[static_cast<size_t>(j)] : j) / G;
          const formats::GroupParams& p = params[static_cast<size_t>(r * n_groups + g)];
          const float x = wr[j];
          if (!std::isfinite(x)) {
            row_bad[static_cast<size_t>(r)] = 1;
            break;
          }
          const uint8_t u = formats::int4_quantize_value(x, p);
          nibbles[static_cast<size_t>(r * K + j)] = u;
          if (record_inputs) rounded[static_cast<size_t>(r * K + j)] = x;
          const float d = U[static_cast<size_t>(j * K + j)];
          const float e = (x - formats::int4_dequantize_value(u, p)) / d;
          loss += 0.5 * static_cast<double>(e) * static_cast<double>(e);
          const float* uj = U.data() + j * K;
          for (int64_t t = j + 1; t < i2; ++t) wr[t] -= e * uj[t];
          er[j - i1] = e;
        }
        row_loss[static_cast<size_t>(r)] += loss;
      } catch (...) {
#pragma omp critical(ft_gptq_failure)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    for (int64_t r = 0; r < N; ++r)
      if (row_bad[static_cast<size_t>(r)]) detail::gptq_fail_row_non_finite(tensor_name, r);
    // Lazy batch update: the block's errors reach the remaining columns in one GEMM.
    detail::gemm_sub(err.data(), B, U.data() + i1 * K + i2, K, W.data() + i2, K, N, K - i2, i2 - i1);
  }
  res.stats.loss = std::accumulate(row_loss.begin(), row_loss.end(), 0.0);

  formats::Int4Weight& q = res.weight;
  q.rows = N;
  q.cols = K;
  q.spec = opt.spec;
  q.group = G;
  q.qweight.assign(static_cast<size_t>(N * K / 2), 0);
  q.scales.resize(static_cast<size_t>(N * n_groups));
  if (!opt.spec.symmetric) q.zeros.resize(static_cast<size_t>(N * n_groups));
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t g = 0; g < n_groups; ++g) {
      const formats::GroupParams& p = params[static_cast<size_t>(r * n_groups + g)];
      q.scales[static_cast<size_t>(r * n_groups + g)] = p.scale_bits;
      if (!opt.spec.symmetric) q.zeros[static_cast<size_t>(r * n_groups + g)] = static_cast<uint8_t>(p.zero);
    }
    for (int64_t j = 0; j < K; ++j) {
      const int64_t c = perm[static_cast<size_t>(j)];
      const uint8_t u = nibbles[static_cast<size_t>(r * K + j)];
      uint8_t& byte = q.qweight[static_cast<size_t>(r * (K / 2) + c / 2)];
      byte = static_cast<uint8_t>((c & 1) ? (byte | (u << 4)) : (byte | u));
    }
  }
  if (record_inputs) {
    res.rounded_inputs.resize(rounded.size());
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < K; ++j)
        res.rounded_inputs[static_cast<size_t>(r * K + perm[static_cast<size_t>(j)])] =
            rounded[static_cast<size_t>(r * K + j)];
  }
  return res;
}

formats::Int4Weight gptq_quantize(std::span<const float> w, int64_t rows, int64_t cols, const HessianAccumulator& h,
                                  const GptqOptions& opt, const std::string& tensor_name) {
  return gptq_quantize_detailed(w, rows, cols, h, opt, tensor_name).weight;
}

}  // namespace futransformer::quant
