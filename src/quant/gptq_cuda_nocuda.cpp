// Builds without nvcc: GPTQ on the GPU exists and says why it cannot run.
#include "futransformer/error.h"
#include "futransformer/quant/gptq_cuda.h"

namespace futransformer::quant {

struct CudaHessianAccumulator::Impl {};

CudaHessianAccumulator::CudaHessianAccumulator(int64_t k, std::string name) : k_(k), name_(std::move(name)) {
  fail("GPTQ on the GPU: this futransformer was built without CUDA");
}
CudaHessianAccumulator::CudaHessianAccumulator(const HessianAccumulator& host)
    : CudaHessianAccumulator(host.k(), host.name()) {}
CudaHessianAccumulator::~CudaHessianAccumulator() = default;
CudaHessianAccumulator::CudaHessianAccumulator(CudaHessianAccumulator&&) noexcept = default;
CudaHessianAccumulator& CudaHessianAccumulator::operator=(CudaHessianAccumulator&&) noexcept = default;
void CudaHessianAccumulator::add(const float*, int64_t) { fail("GPTQ on the GPU: built without CUDA"); }
void CudaHessianAccumulator::add_device(const float*, int64_t) { fail("GPTQ on the GPU: built without CUDA"); }
std::vector<double> CudaHessianAccumulator::upper() const { fail("GPTQ on the GPU: built without CUDA"); }
const double* CudaHessianAccumulator::device_upper() const { fail("GPTQ on the GPU: built without CUDA"); }

GptqResult gptq_quantize_detailed_cuda(std::span<const float>, int64_t, int64_t, const CudaHessianAccumulator&,
                                       const GptqOptions&, const std::string&, bool) {
  fail("GPTQ on the GPU: this futransformer was built without CUDA");
}

GptqCudaTimings gptq_cuda_last_timings() { return {}; }

}  // namespace futransformer::quant
