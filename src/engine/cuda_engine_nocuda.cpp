// Builds without nvcc: the CUDA engine entry points exist and say why they cannot run.
#include "futransformer/cuda_engine.h"
#include "futransformer/error.h"

namespace futransformer {

namespace {
[[noreturn]] void no_cuda() {
  fail("CUDA engine: this futransformer was built without CUDA (no nvcc at configure time); use --device cpu");
}
}  // namespace

std::unique_ptr<CudaEngine> make_cuda_engine(const Model&, const CudaEngineOptions&) { no_cuda(); }
std::unique_ptr<CudaEngine> make_cuda_engine(const quant::QuantizedModel&, const CudaEngineOptions&) { no_cuda(); }
std::unique_ptr<CudaEngine> make_cuda_engine(const quant::QuantizedModel&, const quant::QuantizedModel&,
                                             const CudaEngineOptions&) {
  no_cuda();
}
std::unique_ptr<CudaEngine> make_synthetic_cuda_engine(const ModelConfig&, int64_t, const CudaEngineOptions&,
                                                       uint64_t) {
  no_cuda();
}

}  // namespace futransformer
