// Builds without nvcc: the device quality passes exist and say why they cannot run.
#include "futransformer/error.h"
#include "futransformer/eval/device_quality.h"

namespace futransformer::eval {

PerplexityResult evaluate_perplexity_on_device(CudaEngine&, std::span<const int32_t>, const PerplexityOptions&,
                                               const std::function<void(int64_t, int64_t)>&) {
  fail("perplexity on the GPU: this futransformer was built without CUDA");
}

std::vector<DistributionComparison> compare_distributions_on_device(CudaEngine&, std::span<CudaEngine* const>,
                                                                    std::span<const int32_t>, const PerplexityOptions&,
                                                                    const std::function<void(int64_t, int64_t)>&) {
  fail("distribution comparison on the GPU: this futransformer was built without CUDA");
}

}  // namespace futransformer::eval
