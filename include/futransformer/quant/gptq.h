// GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers"):
// quantises a linear layer's weight column by column to the INT4 format of formats/int4.h, pushing each column's
// rounding error onto the columns not yet quantised through the inverse Hessian of the layer's calibration inputs,
// so that the layer *output* X·Wᵀ (not the weight itself) stays close.
//
// Flow for one layer with K inputs: a HessianAccumulator sees the calibration activations that enter the layer
// (add() per batch), then gptq_quantize() turns the fp32 weight [N, K] into an Int4Weight. The result uses the
// same packing and scale bits as int4_quantize_rtn, so everything that reads INT4 reads GPTQ output unchanged.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "futransformer/formats/int4.h"

namespace futransformer::quant {

// H = (2/n)·Σ_t x_tᵀ·x_t over every calibration token t seen so far (n tokens), kept as a running mean like GPTQ's
// add_batch so that the scale does not grow with the amount of data. Double precision: the sum runs over up to
// millions of tokens and feeds a Cholesky factorization.
class HessianAccumulator {
 public:
  // k: the layer's input size; name: used in error messages (e.g. "model.layers.0.self_attn.q_proj").
  explicit HessianAccumulator(int64_t k, std::string name = "");

  // x: [n_tokens, K] fp32 activations entering the layer. Non-finite values are rejected with an Error.
  void add(const float* x, int64_t n_tokens);

  int64_t n_samples() const { return n_; }  // tokens seen
  int64_t k() const { return k_; }
  const std::string& name() const { return name_; }
  // H[i][j] (symmetric).
  double at(int64_t i, int64_t j) const;
  // The full symmetric H, [K, K] row-major.
  std::vector<double> hessian() const;
  // Only the upper triangle is stored (the factorization reads nothing else, and syrk fills one triangle):
  // upper()[i * K + j] is H[i][j] for j >= i; entries below the diagonal are unspecified.
  std::span<const double> upper() const { return h_; }

 private:
  int64_t k_;
  std::string name_;
  int64_t n_ = 0;
  std::vector<double> h_;
};

// Where GPTQ (and its Hessian) runs: gptq_quantize_detailed or gptq_quantize_detailed_cuda (quant/gptq_cuda.h).
enum class GptqDevice : uint8_t { Cpu, Cuda };
inline const char* gptq_device_name(GptqDevice d) { return d == GptqDevice::Cuda ? "cuda" : "cpu"; }

struct GptqOptions {
  formats::Int4Spec spec;
  double damp_percent = 0.01;  // λ = damp_percent · mean(diag H) is added to the diagonal
  int64_t block_size = 128;    // columns per lazy-batch block (rounded to whole groups, see gptq.cpp)
  bool act_order = false;      // quantise columns in descending diag(H) order, with static groups
};

struct GptqStats {
  // GPTQ's own objective estimate: Σ over weights of (w − q)² / (2·[H⁻¹ Cholesky]_jj²), where w is the value the
  // column had (after earlier updates) when it was rounded.
  double loss = 0.0;
  double damp_percent = 0.0;  // the damping that succeeded (larger than requested after a Cholesky retry)
  int damp_retries = 0;
  int64_t dead_inputs = 0;    // input columns whose H_ii was 0 (weights zeroed, they never affect the output)
};

struct GptqResult {
  formats::Int4Weight weight;
  GptqStats stats;
  // Only filled when record_inputs is set (tests, diagnostics), both [N, K] in the original column order:
  // group_inputs: for each (row, group), the group's weights at the moment its scale/zero were computed — the
  //   error-updated weights (plain order) or the original weights (act_order, static groups);
  // rounded_inputs: the value each weight had when it was rounded to its nibble.
  std::vector<float> group_inputs;
  std::vector<float> rounded_inputs;
};

// w: [rows = N, cols = K] fp32 row-major. Errors (all naming tensor_name): shape mismatch with w or with h, no
// calibration samples, a group size that does not divide K, non-finite weights, bad options, and a Hessian that
// stays not positive definite after the damping retries.
GptqResult gptq_quantize_detailed(std::span<const float> w, int64_t rows, int64_t cols, const HessianAccumulator& h,
                                  const GptqOptions& opt, const std::string& tensor_name, bool record_inputs = false);

formats::Int4Weight gptq_quantize(std::span<const float> w, int64_t rows, int64_t cols, const HessianAccumulator& h,
                                  const GptqOptions& opt, const std::string& tensor_name);

}  // namespace futransformer::quant
