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

// The kernel variant for M rows (the tiling is the same for both): v4 for decode sizes, M <= kV4DefaultMaxM.
// gemm_w4a16 lets FT_W4A16_VARIANT=v2|v4 override this (see gemm_w4a16_internal.h).
constexpr int kV4DefaultMaxM = 16;
Variant choose_variant(int M);

// Whether a tiling (any variant) is launchable for this shape on a device with these limits: m_tiles, rows and
// rows8 match M, warps_n x warps_k = 8 warps with N a multiple of 32 * warps_n, 1 <= splits <= min(K / group, 64),
// shared memory within the limit. Otherwise false and, when why is not null, a sentence naming the field.
bool tiling_is_valid(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& limits, std::string* why);

// Bytes of fp32 workspace a tiling needs (0 when it does not split K).
int64_t workspace_bytes_for(const Tiling& t, int M, int N);

// One line describing the choice, for FT_PRINT_HEURISTICS.
std::string describe_tiling(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& limits);

}  // namespace futransformer::cuda::w4a16
