// Launch configuration of the FP8 GEMM as a pure function of the problem shape and the device's limits, kept
// apart from the kernel so it can be read, printed (FT_PRINT_HEURISTICS=1) and tested on the CPU.
//
// The kernel is tensor-core bound for the prefill shapes it serves, and every CTA runs tiles of equal work, so
// the launch takes about (waves of tiles) x (time of one tile), with waves = ceil(tiles / SMs). The time of a
// tile grows with block_n x (K + kEpilogueK): kEpilogueK stands for the epilogue and the pipeline refill, worth
// about two 128-deep K blocks. A wider tile reads less shared memory per MMA but quantises worse; e.g. Llama-3
// 8B qkv (N = 6144) at M = 512 is 192 tiles of 128 x 128 (two waves on 132 SMs, the second half empty) but 128
// tiles of 128 x 192 (one wave). The constant is a first estimate, to be calibrated with bench_gemm_fp8.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "cuda/gemm_fp8_layout.h"

namespace futransformer::cuda::fp8 {

struct DeviceLimits {
  int sm_count = 132;                   // H100/H200 SXM
  int64_t smem_per_block = 227 * 1024;  // opt-in maximum for one CTA
};

// The instantiated tiles (gemm_fp8.cu dispatches on block_n) and the deepest ring each fits in 227 KB.
constexpr int kBlockNs[] = {128, 192};
constexpr int stages_for(int block_n) { return block_n == 128 ? 6 : 4; }
constexpr int64_t kEpilogueK = 256;
constexpr int kGroupM = 16;  // 2048 rows of A (8 MB at K = 4096) stay in L2 while a group walks N

struct Config {
  int block_n = 128;
  int stages = stages_for(128);
  int group_m = kGroupM;
  int m_blocks = 0, n_blocks = 0;
  int grid = 0;  // persistent CTAs: min(tiles, SMs)
};

inline int ceil_div_int(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The configuration for a shape gemm_fp8_can_implement accepts (M >= 1, N % 8 == 0, K % 128 == 0).
// forced_block_n, when one of kBlockNs, overrides the choice (calibration: FT_FP8_GEMM_BLOCK_N).
inline Config choose_config(int M, int N, int K, const DeviceLimits& d, int forced_block_n = 0) {
  Config best;
  double best_cost = -1.0;
  bool forced = false;
  for (int bn : kBlockNs) forced = forced || bn == forced_block_n;
  for (int bn : kBlockNs) {
    if (static_cast<int64_t>(smem_layout(bn, stages_for(bn)).alloc_bytes) > d.smem_per_block) continue;
    if (forced && bn != forced_block_n) continue;
    const int64_t m_blocks = ceil_div_int(M, kBlockM), n_blocks = ceil_div_int(N, bn);
    const int64_t waves = (m_blocks * n_blocks + d.sm_count - 1) / d.sm_count;
    const double cost = static_cast<double>(waves) * bn * static_cast<double>(K + kEpilogueK);
    if (best_cost < 0.0 || cost < best_cost) {  // strict: ties keep the narrower tile, which has more stages
      best_cost = cost;
      best.block_n = bn;
    }
  }
  best.stages = stages_for(best.block_n);
  best.m_blocks = ceil_div_int(M, kBlockM);
  best.n_blocks = ceil_div_int(N, best.block_n);
  const int64_t tiles = static_cast<int64_t>(best.m_blocks) * best.n_blocks;
  best.grid = static_cast<int>(tiles < d.sm_count ? tiles : d.sm_count);
  return best;
}

// One line describing the choice, for FT_PRINT_HEURISTICS.
inline std::string describe_config(const Config& c, int M, int N, int K, const DeviceLimits& d) {
  const int64_t tiles = static_cast<int64_t>(c.m_blocks) * c.n_blocks;
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "gemm_fp8 M=%d N=%d K=%d: tile %dx%dx%d stages=%d group_m=%d tiles=%lld (%dx%d) grid=%d "
                "waves=%.2f smem=%u B (sm=%d)",
                M, N, K, kBlockM, c.block_n, kBlockK, c.stages, c.group_m, static_cast<long long>(tiles), c.m_blocks,
                c.n_blocks, c.grid, static_cast<double>(tiles) / d.sm_count,
                smem_layout(c.block_n, c.stages).alloc_bytes, d.sm_count);
  return buf;
}

}  // namespace futransformer::cuda::fp8
