// Per-shape v4 launch configurations of the W4A16 GEMM measured on the H200 (`bench_gemm_w4a16 --sweep`), for the
// Llama-3.1-8B / 70B projection shapes at decode sizes. The cost model (gemm_w4a16_heuristics.h) picks the tiling
// within a configuration; this table only says which compiled configuration (CTA warps, ring slots, CTAs per SM) to
// give it where the sweep found one clearly faster than the default. Host-only, a pure function: testable on the CPU.
#pragma once

#include "cuda/gemm_w4a16_heuristics.h"

namespace futransformer::cuda::w4a16 {

// A configuration is listed only where it beat the default (8 warps, 16 slots, cost model's CTAs per SM) by at least
// 4 % in the sweep; smaller differences are within the sweep's run-to-run spread.
//
// One measured row: shape (N, K), group 128, the M bucket it covers (m_lo..m_hi, bounds included) and the config.
struct TunedV4Entry {
  int N, K;
  int m_lo, m_hi;
  const char* name;  // the sweep's name for it (v4_sweep_configs)
  int warps, stages, ctas_per_sm;
  bool wgmma = false, stream_x = false;  // the warpgroup path, with streamed activations
  int warps_n = 0;                       // V4Config::warps_n (0: the cost model's)
  int splits = 0;                        // V4Config::splits (0: the cost model's)
};

// The table, in the order it is searched (docs/results.md, fifth session, has the sweep it came from).
const TunedV4Entry* tuned_v4_entries(int* count);

// The configuration to run for this problem, or nullptr where the default stays: the table is used for group 128 on
// a device with the H200's SM count and shared memory (it was measured there); FT_W4A16_TUNED=0 turns it off
// (read by the caller, gemm_w4a16.cu).
const TunedV4Entry* find_tuned_v4(int M, int N, int K, int group, const DeviceLimits& d);

// The V4Config of an entry (swap16 / swap32 left at their defaults).
V4Config tuned_config(const TunedV4Entry& e);

// M = 17..32, where the streamed warpgroup path runs on weights of kWg32MinWeightBytes or more: the ring, CTAs per SM
// and K slices of an entry found by in-step screens (scripts/sweep_decode_tilings.sh), the same three fields an
// FT_W4A16_TUNED_EXTRA entry gives there. Same conditions as find_tuned_v4 (group 128, the measured device; the
// caller applies FT_W4A16_TUNED=0 and lets an FT_W4A16_TUNED_EXTRA entry win).
struct TunedWg32Entry {
  int N, K;
  int m_lo, m_hi;
  int stream_stages;  // kWgStreamStages or kWgStreamDeepStages
  int ctas_per_sm;    // 0: the cost model's
  int splits;         // 0: the cost model's
};
const TunedWg32Entry* tuned_wg32_entries(int* count);
const TunedWg32Entry* find_tuned_wg32(int M, int N, int K, int group, const DeviceLimits& d);

// Shapes whose split K is finished inside clusters up to more rows than the rule's kClusterMaxRows
// (cluster_reduce_applies), found by an in-step screen. Same conditions as find_tuned_v4; the caller applies
// FT_W4A16_TUNED=0 and lets FT_W4A16_CLUSTER_MAX_ROWS / set_gemm_w4a16_cluster_limits win.
using TunedClusterRowsEntry = ClusterRowsEntry;  // max_rows above kClusterMaxRows, at most kClusterLimitRows
const TunedClusterRowsEntry* tuned_cluster_rows_entries(int* count);
// The cluster rule's row limit for this shape: the table's where it lists the shape, else kClusterMaxRows.
int tuned_cluster_max_rows(int N, int K, int group, const DeviceLimits& d);

// Shapes and row ranges whose GEMM is launched without programmatic stream serialisation (gemm_w4a16.cu,
// plain_launch_for), found by an in-step screen: their CTAs would otherwise sit beside a predecessor that fills every SM
// and fetch weights early, which cost more than the early fetch gained. Same conditions as find_tuned_v4; the caller
// applies FT_W4A16_TUNED=0.
using TunedPlainLaunchEntry = ShapeRange;
const TunedPlainLaunchEntry* tuned_plain_launch_entries(int* count);
const TunedPlainLaunchEntry* find_tuned_plain_launch(int M, int N, int K, int group, const DeviceLimits& d);

}  // namespace futransformer::cuda::w4a16
