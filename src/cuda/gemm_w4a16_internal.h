// Library-internal entry points of the W4A16 GEMM beside the public launcher (futransformer/cuda/gemm_w4a16.h):
// the GPU tests and the bench use them to run a given kernel variant or tiling, so that one process compares
// v2 and v4 on the same grid. The engine calls only the public gemm_w4a16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm_w4a16_heuristics.h"
#include "futransformer/formats/int4.h"
#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;

namespace futransformer::cuda {

// The variant gemm_w4a16 runs for M rows: FT_W4A16_VARIANT=v2 or v4 when set (read once per process; another
// value is reported on stderr once and ignored), else w4a16::choose_variant(M, swap32) with the environment's
// swap32 (FT_W4A16_SWAP32, else kSwap32ByDefault): v4 for M = 17..32 when that is on.
w4a16::Variant gemm_w4a16_variant_for(int M);

// The tiling gemm_w4a16 uses for this shape on the current device (variant included; for v4 with M <= 16 the
// v4 config of the environment, FT_W4A16_V4_WARPS / _STAGES / _CTAS_PER_SM, FT_W4A16_SPLITK, FT_W4A16_SWAP16, when
// its tiling fits; for v4 with M = 17..32 swap32 from FT_W4A16_SWAP32, else kSwap32ByDefault).
// cudaErrorInvalidValue for shapes gemm_w4a16_can_implement rejects.
cudaError_t gemm_w4a16_plan(int M, int N, int K, int group, formats::ScaleType scale_type, w4a16::Tiling* tiling);

// The v4 tiling a given config gives this shape on the current device (w4a16::choose_tiling with the config,
// variant v4; the config applies to M <= 16 only, its swap32 to M = 17..32). cudaErrorInvalidValue for shapes
// gemm_w4a16_can_implement rejects and for a tiling that does not fit the device (w4a16::tiling_is_valid).
cudaError_t gemm_w4a16_plan_config(int M, int N, int K, int group, formats::ScaleType scale_type,
                                   const w4a16::V4Config& config, w4a16::Tiling* tiling);

// Split-K finished inside thread-block clusters (gemm_w4a16_cluster.cuh) instead of by the reduce kernel, for
// launches that w4a16::cluster_reduce_applies to (2..kMaxClusterSplits K slices, M = kClusterMinRows..kClusterMaxRows,
// the tile fits the shared memory), with the BF16 / residual / SwiGLU epilogues (not the qkv prologue nor the norm
// partials) and a cluster the device can place. Process-wide: FT_W4A16_CLUSTER_REDUCE=0 turns it off (read once;
// default on), set_gemm_w4a16_cluster_reduce overrides (tests; 0 / 1, -1 back to the environment's). The results are
// the reduce kernel's bits either way.
bool gemm_w4a16_cluster_reduce();
void set_gemm_w4a16_cluster_reduce(int on);
// The rule's row and slice limits, for measurements: FT_W4A16_CLUSTER_MAX_ROWS (16..kClusterLimitRows) and
// FT_W4A16_CLUSTER_MAX_SPLITS (2..kClusterLimitSplits; above 8 the clusters are non-portable), read once; unset or
// out of range: w4a16::kClusterMaxRows / kMaxClusterSplits (the measured rule). set_gemm_w4a16_cluster_limits
// overrides both (tests; 0 or less: back to the environment's).
void gemm_w4a16_cluster_limits(int* max_rows, int* max_splits);
void set_gemm_w4a16_cluster_limits(int max_rows, int max_splits);
// The row limit a launch of shape (N, K) uses: the one chosen above where FT_W4A16_CLUSTER_MAX_ROWS or
// set_gemm_w4a16_cluster_limits chose one, else an FT_W4A16_CLUSTER_ROWS_EXTRA entry for the shape
// (w4a16::parse_cluster_rows_extra), else the measured per-shape table's (w4a16::tuned_cluster_max_rows; off with
// FT_W4A16_TUNED=0), else kClusterMaxRows.
int gemm_w4a16_cluster_rows_for(int N, int K, int group, const w4a16::DeviceLimits& d);

// gemm_w4a16 with an explicit tiling: the same argument checks, plus w4a16::tiling_is_valid and the tiling's
// workspace (w4a16::workspace_bytes_for); cudaErrorInvalidValue with gemm_w4a16_last_error() otherwise.
cudaError_t gemm_w4a16_with_tiling(const w4a16::Tiling& tiling, const __nv_bfloat16* x, const uint32_t* w_packed,
                                   const uint16_t* scales, __nv_bfloat16* y, int M, int N, int K, int group,
                                   formats::ScaleType scale_type, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream);

// gemm_w4a16_with_tiling with an epilogue (gemm_w4a16_residual / gemm_w4a16_swiglu on a given tiling): `out` is y
// (BF16 [M, N]), the fp32 residual [M, N] or h (BF16 [M, N / 2]) as `epilogue` says. norm_partials (residual_f32
// only): gemm_w4a16_residual_norm_partials on this tiling.
cudaError_t gemm_w4a16_epilogue_with_tiling(const w4a16::Tiling& tiling, w4a16::Epilogue epilogue,
                                            const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                                            void* out, int M, int N, int K, int group, formats::ScaleType scale_type,
                                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                            float* norm_partials = nullptr);

// gemm_w4a16_residual_rmsnorm on an explicit tiling (tests: the split-K fused reduce + norm and the unsplit path).
cudaError_t gemm_w4a16_residual_rmsnorm_with_tiling(const w4a16::Tiling& tiling, const __nv_bfloat16* x,
                                                    const uint32_t* w_packed, const uint16_t* scales, float* residual,
                                                    int M, int N, int K, int group, formats::ScaleType scale_type,
                                                    const float* norm_weight, float eps, __nv_bfloat16* y,
                                                    void* workspace, size_t workspace_bytes, cudaStream_t stream);

// gemm_w4a16_qkv_rope_append on a given tiling (splits > 1: the prologue in the reduce kernel; 1: GEMM store, then
// qkv_rope_kv_append's kernel, or with head_counters the GEMM's tail where w4a16_qkv_tail_applies), with
// w4a16::tiling_is_valid and the tiling's workspace checked as above.
cudaError_t gemm_w4a16_qkv_rope_append_with_tiling(
    const w4a16::Tiling& tiling, const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales, int M,
    int K, int group, formats::ScaleType scale_type, void* workspace, size_t workspace_bytes, formats::KvFormat format,
    __nv_bfloat16* qkv, int n_heads, int n_kv_heads, int head_dim, const int32_t* positions, const float* inv_freq,
    const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors, const int32_t* row_anchor,
    uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream,
    uint32_t* head_counters = nullptr);
// Whether a launch on tiling t (M rows, K, group) with head_counters runs the qkv prologue in the GEMM's tail on a
// device with these limits: one K slice, M <= kQkvTailMaxRows, an INT4 / int4-hadamard cache at head_dim 128, CTA
// columns that line up with the heads (w4a16::qkv_tail_columns_ok), the scratch within the device's shared memory
// and a compiled tail instance (w4a16::v4_qkv_tail_kernel_any). Needs no device.
bool w4a16_qkv_tail_applies(const w4a16::Tiling& t, int M, int K, int group, formats::KvFormat format, int head_dim,
                            bool f16_scales, const w4a16::DeviceLimits& limits);

// The norm-prologue GEMMs (gemm_w4a16_rmsnorm*, futransformer/cuda/gemm_w4a16.h) on a given tiling, which must be v4
// with rows8 (M <= 8): gemm_w4a16_epilogue_with_tiling's epilogues (residual_f32 included) and the qkv prologue;
// norm_partials as in the public launchers.
cudaError_t gemm_w4a16_rmsnorm_epilogue_with_tiling(const w4a16::Tiling& tiling, w4a16::Epilogue epilogue,
                                                    const float* x, const float* norm_weight, float eps,
                                                    const uint32_t* w_packed, const uint16_t* scales, void* out, int M,
                                                    int N, int K, int group, formats::ScaleType scale_type,
                                                    void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                                    const float* norm_partials = nullptr);
cudaError_t gemm_w4a16_rmsnorm_qkv_rope_append_with_tiling(
    const w4a16::Tiling& tiling, const float* x, const float* norm_weight, float eps, const uint32_t* w_packed,
    const uint16_t* scales, int M, int K, int group, formats::ScaleType scale_type, void* workspace,
    size_t workspace_bytes, formats::KvFormat format, __nv_bfloat16* qkv, int n_heads, int n_kv_heads, int head_dim,
    const int32_t* positions, const float* inv_freq, const int32_t* row_page, const int32_t* row_slot,
    const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool, int hadamard_block,
    __nv_bfloat16* q_out, cudaStream_t stream, const float* norm_partials = nullptr);

}  // namespace futransformer::cuda
