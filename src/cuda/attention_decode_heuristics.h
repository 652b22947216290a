// Launch plan of the paged decode attention (number of sequence splits) as a pure function of the problem
// shape and the device's limits, kept apart from the kernel so it can be read, printed (FT_PRINT_HEURISTICS=1)
// and tested on its own.
//
// Two process-wide knobs, for measurement (bench_attention_decode --sweep-splits) and A/B runs:
//   - FT_ATTN_DECODE_SPLITS=N (or set_forced_splits(N)): every plan uses N splits, clamped to
//     [1, min(tiles, kMaxSplits)]; 0 or unset: the model's choice.
//   - FT_ATTN_DECODE_MODEL=dram (or set_plan_model): the earlier DRAM-byte cost model; occupancy (default): the
//     rule fitted to the H200 split sweep, about two CTAs per SM (see the .cpp).
// Both are read once, at the first plan. Every caller plans through choose_plan (the launchers,
// attention_decode_workspace_bytes, the engine through that function), so a knob changes the launch and its
// workspace together. Set them before the engine's first decode step: a captured CUDA graph keeps the plan of its
// capture (its workspace only grows, so an older graph stays valid, it just keeps the older split count).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/attention_decode_layout.h"

namespace futransformer::cuda::attn {

struct DeviceLimits {
  int sm_count = 132;                   // H100/H200 SXM
  int64_t smem_per_sm = 228 * 1024;     // shared memory per multiprocessor
  int64_t smem_per_block = 227 * 1024;  // opt-in maximum for one CTA
};

enum class PlanModel {
  kOccupancy,  // enough splits for ~2 CTAs per SM, at most 16, at least 2 tiles per warp (measured on the H200)
  kDram,       // DRAM-byte equivalents of a memory-bound launch (the W4A16 GEMM's model; the choice before the above)
};
const char* plan_model_name(PlanModel model);

struct Plan {
  int splits = 1;       // CTAs per (sequence, KV head); > 1 needs the workspace and the combine kernel
  int smem_bytes = 0;   // dynamic shared memory of one CTA
  int ctas_per_sm = 1;  // resident CTAs per SM (shared memory, then the register cap)
  int warps = 4;        // per CTA: kWarps, or 8 (INT4 head_dim 128 only; cta_warps)
  bool forced = false;  // splits came from FT_ATTN_DECODE_SPLITS / set_forced_splits
  PlanModel model = PlanModel::kOccupancy;  // the model that chose (when not forced)
};

// The forced split count (0: none): set_forced_splits(n) (n <= 0: none) wins over FT_ATTN_DECODE_SPLITS (read
// once).
int forced_splits();
void set_forced_splits(int n);
// The model choose_plan uses: set_plan_model wins over FT_ATTN_DECODE_MODEL (occupancy | dram, read once).
PlanModel plan_model();
void set_plan_model(PlanModel model);
// Warps per CTA (INT4 caches at head_dim 128 only; every other instance has kWarps = 4): set_forced_warps(4 | 8)
// wins over FT_ATTN_DECODE_WARPS (4 | 8; 0 or unset: the rule in cta_warps), read once; 0 from either: the rule.
int forced_warps();
void set_forced_warps(int n);
// The most splits whose partial outputs are merged inside a thread-block cluster (the split CTAs of one sequence and
// KV head form a cluster and combine through distributed shared memory: no combine kernel, no partials in global
// memory); plans with more splits, or with 1, keep the combine kernel. 0: never. set_cluster_combine_splits(n) wins
// over FT_ATTN_CLUSTER_COMBINE (0 .. kMaxClusterCombineSplits of attention_decode_layout.h, read once; unset: kDefaultClusterCombineSplits).
// Same bits either way (the combine's operations in its order).
// Off by default: level at batch 1, slower at 256-CTA grids (docs/results.md, thirtieth session).
constexpr int kDefaultClusterCombineSplits = 0;
int cluster_combine_splits();
void set_cluster_combine_splits(int n);
// Whether a plan with this many splits combines inside a cluster (2 <= splits <= cluster_combine_splits()).
bool combines_in_cluster(int splits);
// Back to the environment's values for all four (undoes set_forced_splits, set_plan_model, set_forced_warps and
// set_cluster_combine_splits).
void reset_plan_knobs();

// Whether a format / head_dim has 8-warp instances, and the warps per CTA a plan for the shape uses: the forced
// count where one applies, else the rule (8 when batch * KV heads >= 48, 4 below; measured in the step, see the .cpp).
// Warps change the merge order, so the bits: every launcher plans the same way for the same shape.
bool has_eight_warp_instances(bool int4, int head_dim);
int cta_warps(bool int4, int head_dim, int batch, int n_kv_heads);

// Plan for a shape attention_decode_can_implement accepts (int4: true for INT4 / INT4_HADAMARD, false for BF16):
// the forced split count when one is set, else the choice of plan_model().
Plan choose_plan(bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len, const DeviceLimits& limits);
// The choice of `model`, ignoring any forced split count (the bench prints both models' choices).
Plan model_plan(PlanModel model, bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len,
                const DeviceLimits& limits);

// Workspace bytes of a plan: partial O [batch, n_heads, splits, head_dim] fp32, then the log2-sum-exp
// [batch, n_heads, splits] fp32 at workspace_lse_offset (0 bytes when splits == 1).
int64_t workspace_bytes_for(const Plan& plan, int batch, int n_heads, int head_dim);
int64_t workspace_lse_offset(const Plan& plan, int batch, int n_heads, int head_dim);

// Shared memory of the kernel instance (ring or merge buffers, whichever is larger).
int smem_bytes_for(bool int4, int head_dim, int warps = 4);

// One line describing the choice, for FT_PRINT_HEURISTICS.
std::string describe_plan(const Plan& plan, bool int4, int head_dim, int batch, int n_heads, int n_kv_heads,
                          int max_seq_len, const DeviceLimits& limits);

}  // namespace futransformer::cuda::attn
