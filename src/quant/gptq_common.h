// The host-side rules of GPTQ that the CPU (gptq.cpp) and GPU (cuda/quant/gptq_cuda.cu) implementations share, so
// that both validate, order columns, damp and block identically and fail with the same messages.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "futransformer/quant/gptq.h"

namespace futransformer::quant::detail {

// K x K doubles: 65536 inputs is already a 32 GiB Hessian, far beyond any layer we quantise; larger values are
// treated as a corrupt size rather than attempted.
constexpr int64_t kMaxHessianInputs = 65536;

// The Hessian's name in messages ("Hessian" when it has none).
std::string hessian_label(const std::string& name);
// The checks every Hessian accumulator's add runs before touching H, naming `label`: a negative count, null
// activations for a non-empty batch, `seen` + n_tokens tokens of k inputs overflowing int64. Returns false for an
// empty batch (nothing to add). x may be a host or a device pointer (only compared with null).
bool check_calibration_batch(const float* x, int64_t n_tokens, int64_t seen, int64_t k, const std::string& label);
// Fails, naming label and the first non-finite value's token and input, unless every one of the n_tokens x k host
// activations is finite.
void check_activations_finite(const float* x, int64_t n_tokens, int64_t k, const std::string& label);
[[noreturn]] void fail_activation_not_finite(const std::string& label, int64_t token, int64_t input, float value);

// A Hessian that is not positive definite after the requested damping gets this many more attempts
// (gptq_retry_damp gives each one's damping).
constexpr int kMaxDampRetries = 4;

// The damping of attempt `attempt` (0 = the requested one): from the first retry on, kRetryDampFactor times more per
// attempt, starting from at least kMinRetryDamp (for a request of 0).
double gptq_retry_damp(double requested, int attempt);

// Block size actually used (see gptq.cpp): a block holds whole groups, or a group starts on a block boundary.
int64_t gptq_effective_block(int64_t requested, int64_t group, int64_t K);

// The argument checks of gptq_quantize_detailed, for a Hessian of h_k inputs over h_samples tokens named h_name.
void gptq_validate(std::span<const float> w, int64_t rows, int64_t cols, int64_t h_k, int64_t h_samples,
                   const std::string& h_name, const GptqOptions& opt, const std::string& name);

// Dead inputs and column order from diag(H): diag with each zero entry replaced by 1 (those inputs are "dead": their
// weights are zeroed), the columns in quantisation order (descending diag with act_order, stable; else 0..K-1), and
// mean(diag) after the replacement (the damping's unit).
struct GptqColumnPlan {
  std::vector<double> diag;
  std::vector<int64_t> dead;  // dead input columns, ascending
  std::vector<int64_t> perm;  // perm[j] = the original column quantised j-th
  double mean_diag = 0.0;
};
GptqColumnPlan gptq_plan_columns(std::span<const double> h_diag, bool act_order);

[[noreturn]] void gptq_fail_not_positive_definite(const std::string& tensor_name, double damp);
[[noreturn]] void gptq_fail_row_non_finite(const std::string& tensor_name, int64_t row);

}  // namespace futransformer::quant::detail
