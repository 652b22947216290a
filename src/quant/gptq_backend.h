// Where quantize_model runs each projection group's Hessian and GPTQ: on the CPU (HessianAccumulator,
// gptq_quantize_detailed) or on the GPU (CudaHessianAccumulator, gptq_quantize_detailed_cuda). quantize_model.cpp
// sees only this interface and no CUDA header; asking for the GPU backend in a build without CUDA, or without a
// CUDA device, throws an Error saying so.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "futransformer/quant/gptq.h"

namespace futransformer::quant {

class GptqBackend {
 public:
  virtual ~GptqBackend() = default;
  // A fresh Hessian over k inputs from these calibration activations [n_tokens, k] (host memory); replaces the last.
  virtual void set_inputs(const float* x, int64_t n_tokens, int64_t k, const std::string& hessian_name) = 0;
  // The same from activations in device memory (the GPU calibration forward's hook inputs): the GPU backend
  // accumulates them in place (CudaHessianAccumulator::add_device); the CPU backend throws.
  virtual void set_inputs_device(const float* x_device, int64_t n_tokens, int64_t k,
                                 const std::string& hessian_name) = 0;
  // GPTQ of one weight [rows, cols] (host memory) with the current Hessian.
  virtual GptqResult quantize(std::span<const float> w, int64_t rows, int64_t cols, const GptqOptions& opt,
                              const std::string& tensor_name) = 0;
  virtual GptqDevice device() const = 0;
};

std::unique_ptr<GptqBackend> make_gptq_backend(GptqDevice device);

}  // namespace futransformer::quant
