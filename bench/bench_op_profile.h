// Per-op GPU time of a CUDA engine run with CudaEngineOptions::profile_ops (CudaEngine::op_profile): one table, ops
// by descending time, each with its share of the whole. Times include each op's launch gap (plain launches, no
// CUDA graphs), so the small ops' shares are upper bounds of what they cost inside a graph.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "futransformer/cuda_engine.h"

namespace futransformer::bench {

inline void print_op_profile(const std::vector<CudaEngine::OpTime>& ops, const std::string& title, int runs) {
  double total = 0;
  for (const CudaEngine::OpTime& t : ops) total += t.total_us;
  std::printf("\nop profile: %s (per run, %d run%s; total %.1f µs)\n| op | calls | µs | share |\n|---|---|---|---|\n",
              title.c_str(), runs, runs == 1 ? "" : "s", total / runs);
  for (const CudaEngine::OpTime& t : ops)
    std::printf("| %s | %lld | %.1f | %.1f%% |\n", t.op.c_str(), static_cast<long long>(t.calls / runs),
                t.total_us / runs, total > 0 ? 100.0 * t.total_us / total : 0.0);
}

}  // namespace futransformer::bench
