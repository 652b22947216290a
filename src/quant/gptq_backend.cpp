#include "quant/gptq_backend.h"

#include <optional>

#include "futransformer/device.h"
#include "futransformer/error.h"
#include "futransformer/quant/gptq_cuda.h"

namespace futransformer::quant {
namespace {

class CpuBackend final : public GptqBackend {
 public:
  void set_inputs(const float* x, int64_t n_tokens, int64_t k, const std::string& hessian_name) override {
    h_.emplace(k, hessian_name);
    h_->add(x, n_tokens);
  }
  void set_inputs_device(const float*, int64_t, int64_t, const std::string& hessian_name) override {
    fail(hessian_name, ": the CPU GPTQ backend takes host activations; device activations (the GPU calibration ",
         "forward) need the GPU backend");
  }
  GptqResult quantize(std::span<const float> w, int64_t rows, int64_t cols, const GptqOptions& opt,
                      const std::string& tensor_name) override {
    check(h_.has_value(), tensor_name, ": GPTQ backend has no calibration inputs yet");
    return gptq_quantize_detailed(w, rows, cols, *h_, opt, tensor_name);
  }
  GptqDevice device() const override { return GptqDevice::Cpu; }

 private:
  std::optional<HessianAccumulator> h_;
};

class CudaBackend final : public GptqBackend {
 public:
  void set_inputs(const float* x, int64_t n_tokens, int64_t k, const std::string& hessian_name) override {
    h_.reset();  // free the previous H on the device before the next one is allocated
    h_.emplace(k, hessian_name);
    h_->add(x, n_tokens);
  }
  void set_inputs_device(const float* x_device, int64_t n_tokens, int64_t k,
                         const std::string& hessian_name) override {
    h_.reset();
    h_.emplace(k, hessian_name);
    h_->add_device(x_device, n_tokens);
  }
  GptqResult quantize(std::span<const float> w, int64_t rows, int64_t cols, const GptqOptions& opt,
                      const std::string& tensor_name) override {
    check(h_.has_value(), tensor_name, ": GPTQ backend has no calibration inputs yet");
    return gptq_quantize_detailed_cuda(w, rows, cols, *h_, opt, tensor_name);
  }
  GptqDevice device() const override { return GptqDevice::Cuda; }

 private:
  std::optional<CudaHessianAccumulator> h_;
};

}  // namespace

std::unique_ptr<GptqBackend> make_gptq_backend(GptqDevice device) {
  if (device == GptqDevice::Cuda) {
    const DeviceInfo info = query_device();
    check(info.cuda_built, "GPTQ on the GPU: this futransformer was built without CUDA (no nvcc at configure time)");
    check(info.device_count > 0, "GPTQ on the GPU: no CUDA device is available (", info.name, ")");
    return std::make_unique<CudaBackend>();
  }
  return std::make_unique<CpuBackend>();
}

}  // namespace futransformer::quant
