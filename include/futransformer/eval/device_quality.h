// Perplexity, KL divergence and top-1 agreement of CUDA engines with the logits kept on the GPU: the same windows,
// chunks, sequence id and results as eval::evaluate_perplexity / eval::compare_distributions, but each chunk's
// logits stay in the engine's device buffer (CudaEngine::forward_logits_on_device) and only per-row numbers
// (log-sum-exp, NLL, argmax, KL; cuda/logit_stats.h) come back. Per-row values are summed on the host in row
// order, as the CPU versions do; they differ from them only by the order of the fp64 sums inside a row.
// Without CUDA (a build without nvcc) both throw an Error saying so.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "futransformer/cuda_engine.h"
#include "futransformer/eval/perplexity.h"
#include "futransformer/eval/report.h"

namespace futransformer::eval {

PerplexityResult evaluate_perplexity_on_device(CudaEngine& engine, std::span<const int32_t> tokens,
                                               const PerplexityOptions& options,
                                               const std::function<void(int64_t done, int64_t total)>& progress = {});

// As compare_distributions(base, others, …); every engine must be a CUDA engine on the current device.
std::vector<DistributionComparison> compare_distributions_on_device(
    CudaEngine& base, std::span<CudaEngine* const> others, std::span<const int32_t> tokens,
    const PerplexityOptions& options, const std::function<void(int64_t done, int64_t total)>& progress = {});

}  // namespace futransformer::eval
