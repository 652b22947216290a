// Launch plan of the paged decode attention (number of sequence splits) as a pure function of the problem
// shape and the device's limits, kept apart from the kernel so it can be read, printed (FT_PRINT_HEURISTICS=1)
// and tested on its own.
#pragma once

#include <cstdint>
#include <string>

namespace futransformer::cuda::attn {

struct DeviceLimits {
  int sm_count = 132;                   // H100/H200 SXM
  int64_t smem_per_sm = 228 * 1024;     // shared memory per multiprocessor
  int64_t smem_per_block = 227 * 1024;  // opt-in maximum for one CTA
};

struct Plan {
  int splits = 1;       // CTAs per (sequence, KV head); > 1 needs the workspace and the combine kernel
  int smem_bytes = 0;   // dynamic shared memory of one CTA
  int ctas_per_sm = 1;  // resident CTAs per SM the model assumed
};

// Plan for a shape attention_decode_can_implement accepts (int4: true for INT4 / INT4_HADAMARD, false for BF16).
Plan choose_plan(bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len, const DeviceLimits& limits);

// Workspace bytes of a plan: partial O [batch, n_heads, splits, head_dim] fp32, then the log2-sum-exp
// [batch, n_heads, splits] fp32 at workspace_lse_offset (0 bytes when splits == 1).
int64_t workspace_bytes_for(const Plan& plan, int batch, int n_heads, int head_dim);
int64_t workspace_lse_offset(const Plan& plan, int batch, int n_heads, int head_dim);

// Shared memory of the kernel instance (ring or merge buffers, whichever is larger).
int smem_bytes_for(bool int4, int head_dim);

// One line describing the choice, for FT_PRINT_HEURISTICS.
std::string describe_plan(const Plan& plan, bool int4, int head_dim, int batch, int n_heads, int n_kv_heads,
                          int max_seq_len, const DeviceLimits& limits);

}  // namespace futransformer::cuda::attn
