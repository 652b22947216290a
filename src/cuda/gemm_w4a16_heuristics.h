// Launch configuration of the W4A16 GEMM as a pure function of the problem shape and the device's limits,
// kept apart from the kernel so it can be read, printed (FT_PRINT_HEURISTICS=1) and tested on its own.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/gemm_w4a16_layout.h"

namespace futransformer::cuda::w4a16 {

struct DeviceLimits {
  int sm_count = 132;                   // H100/H200 SXM
  int64_t smem_per_sm = 228 * 1024;     // shared memory per multiprocessor
  int64_t smem_per_block = 227 * 1024;  // opt-in maximum for one CTA
};

// The tiling for a shape that gemm_w4a16_can_implement accepts (M in 1..64, N % 32 == 0, K % group == 0,
// group in {32, 64, 128}). Always returns a launchable tiling for such shapes.
Tiling choose_tiling(int M, int N, int K, int group, const DeviceLimits& limits);

// Bytes of fp32 workspace a tiling needs (0 when it does not split K).
int64_t workspace_bytes_for(const Tiling& t, int M, int N);

// One line describing the choice, for FT_PRINT_HEURISTICS.
std::string describe_tiling(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& limits);

}  // namespace futransformer::cuda::w4a16
