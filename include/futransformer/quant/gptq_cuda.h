// GPTQ on the GPU: the same algorithm and semantics as quant/gptq.h (damping and its retries, dead inputs, act_order
// column order, static groups, block rule, INT4 group parameters and nibbles as formats/int4.h computes them, the
// same packed Int4Weight), with the Hessian accumulated in fp64 by cuBLAS, the inverse's Cholesky factor by
// cuSOLVER in fp64, the column loop of each block as a kernel (one warp per weight row) and the lazy update of the
// remaining columns as one fp32 cuBLAS GEMM per block. docs/design.md "GPTQ on the GPU" has the data flow.
//
// Results agree with the CPU's up to summation order (fp64 Hessian and factorization, fp32 GEMM): an early nibble
// that flips on one side changes the errors propagated along the rest of its row, so outputs are close, not equal
// (tests/gpu/test_gptq_cuda.cpp states the criterion). Everything else is bit-exact given the same inputs: a weight
// that GPTQ does not update (e.g. an exactly diagonal Hessian) quantises byte for byte as int4_quantize_rtn does.
//
// No CUDA header is needed to include this: builds without CUDA link stubs that throw an Error saying so. Work runs
// on the current CUDA device's default stream, synchronously; one thread at a time per accumulator.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "futransformer/quant/gptq.h"

namespace futransformer::quant {

// HessianAccumulator with H on the device: the same running mean H = (2/n)·Σ_t x_tᵀ·x_t (x pre-scaled by
// sqrt(2/n_total) in fp64, previous H scaled by n_old/n_total), the same checks and messages. H is [K, K] fp64
// row-major, upper triangle filled (below the diagonal unspecified), as HessianAccumulator::upper().
class CudaHessianAccumulator {
 public:
  // k: the layer's input size, in [1, 65536]; name: used in error messages.
  explicit CudaHessianAccumulator(int64_t k, std::string name = "");
  // A copy of a CPU accumulator (its H and token count) on the device: GPTQ of both then starts from the same H.
  explicit CudaHessianAccumulator(const HessianAccumulator& host);
  ~CudaHessianAccumulator();
  CudaHessianAccumulator(CudaHessianAccumulator&&) noexcept;
  CudaHessianAccumulator& operator=(CudaHessianAccumulator&&) noexcept;

  // x: [n_tokens, K] fp32 activations in host memory. Non-finite values are rejected (naming token and input)
  // before H changes.
  void add(const float* x, int64_t n_tokens);
  // The same for activations already in device memory.
  void add_device(const float* x_device, int64_t n_tokens);

  int64_t n_samples() const { return n_; }
  int64_t k() const { return k_; }
  const std::string& name() const { return name_; }
  // H downloaded: [K, K] row-major, upper triangle valid (as HessianAccumulator::upper()).
  std::vector<double> upper() const;
  // Device pointer to the [K, K] fp64 H (upper triangle valid); owned by the accumulator.
  const double* device_upper() const;

 private:
  struct Impl;
  int64_t k_ = 0;
  std::string name_;
  int64_t n_ = 0;
  std::unique_ptr<Impl> impl_;
};

// gptq_quantize_detailed on the GPU: w [rows, cols] fp32 in host memory, H from `h`. Same errors, naming
// tensor_name (an INT4 scale that overflows the scale type also names the row). record_inputs fills
// group_inputs / rounded_inputs as the CPU does. Requested blocks above 128 columns run as 128-column blocks (the
// per-block kernel keeps U's block in shared memory): the lazy batching regroups the same updates, so only rounding
// differs (groups still start on block boundaries or lie inside one block).
GptqResult gptq_quantize_detailed_cuda(std::span<const float> w, int64_t rows, int64_t cols,
                                       const CudaHessianAccumulator& h, const GptqOptions& opt,
                                       const std::string& tensor_name, bool record_inputs = false);

// Phase times of the last gptq_quantize_detailed_cuda call on this thread (seconds, host wall clock around
// synchronised phases), for benchmarks.
struct GptqCudaTimings {
  double prepare_s = 0.0;    // upload, dead inputs, static groups, permutation
  double factor_s = 0.0;     // damped H → U (cuSOLVER), including retries
  double quantize_s = 0.0;   // the block kernels and lazy GEMMs
  double finish_s = 0.0;     // packing and download
};
GptqCudaTimings gptq_cuda_last_timings();

}  // namespace futransformer::quant
