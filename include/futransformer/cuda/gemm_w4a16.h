// W4A16 GEMM for decode on Hopper (sm_90a): y[M, N] = x[M, K] * W[N, K]^T.
//   x: BF16 [M, K] row-major, 1 <= M <= 64          y: BF16 [M, N] row-major
//   W: symmetric INT4 (zero point 8), group 32/64/128, FP16 or BF16 scales, repacked once on the host with
//      formats::repack_int4_for_mma / repack_int4_scales_for_mma (futransformer/formats/int4_mma.h).
// Products accumulate in fp32 and group scales are applied in fp32; the result is deterministic.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "futransformer/formats/int4.h"
#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

constexpr int kW4A16MaxM = 64;
constexpr int kW4A16TileN = 32;  // N must be a multiple of this
constexpr int kW4A16TileK = 32;  // K must be a multiple of this and of the group size
constexpr int kW4A16MaxDim = 1 << 18;
constexpr int kW4A16NormMaxM = 8;  // rows of the RMSNorm-prologue GEMMs (gemm_w4a16_rmsnorm*)

// cudaSuccess when the kernel handles the shape; otherwise cudaErrorInvalidValue and, when why is not null, a
// sentence naming the offending parameter and what is expected. Needs no device.
cudaError_t gemm_w4a16_can_implement(int M, int N, int K, int group, formats::ScaleType scale_type, std::string* why);

// fp32 workspace bytes gemm_w4a16 needs on the current device for this shape with any supported group size
// (0 when no split-K is used; also 0 for shapes gemm_w4a16_can_implement rejects).
size_t gemm_w4a16_workspace_bytes(int M, int N, int K);

// Enqueues the GEMM on `stream`. Pointers are device pointers: x, w_packed, scales and workspace 16-byte
// aligned, y 4-byte aligned; the workspace must not be used by another launch running concurrently.
// Returns cudaErrorInvalidValue (message in gemm_w4a16_last_error()) for rejected shapes, misaligned pointers
// or a workspace smaller than gemm_w4a16_workspace_bytes; otherwise the launch's error, if any.
cudaError_t gemm_w4a16(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales, __nv_bfloat16* y,
                       int M, int N, int K, int group, formats::ScaleType scale_type, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream);

// The same GEMM with a fused epilogue (decode: no separate op, no extra pass over memory). Each is applied to the
// fp32 sums in the GEMM's final store, or in its split-K reduce kernel when K is split, after the same BF16 rounding
// the plain GEMM's output gets — so the results are bit for bit those of gemm_w4a16 followed by the separate op.
// Arguments, checks, workspace (gemm_w4a16_workspace_bytes(M, N, K)) and errors as gemm_w4a16, except the output:
//
// residual[m, n] += float(bf16(y[m, n])): fp32 [M, N] row-major, 16-byte aligned, read and written (= gemm_w4a16,
// then add_residual_bf16(residual, y)).
cudaError_t gemm_w4a16_residual(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                                float* residual, int M, int N, int K, int group, formats::ScaleType scale_type,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream);
// gemm_w4a16_residual, then y = rmsnorm_bf16(residual, norm_weight, eps) of the M rows it leaves (BF16 [M, N],
// 8-byte aligned, apart from residual; norm_weight fp32 [N], 16-byte aligned; N <= 8192): the same bits as the two
// calls. When K is split, one kernel does the split-K reduce, the residual add and the norm (no second pass over the
// rows, one kernel boundary fewer); otherwise the GEMM adds and rmsnorm_bf16's kernel follows. GPU-tested in the
// thirty-eighth session (bit for bit, splits 1 and 3).
constexpr int kW4A16ResidualNormMaxN = 8192;
cudaError_t gemm_w4a16_residual_rmsnorm(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                                        float* residual, int M, int N, int K, int group, formats::ScaleType scale_type,
                                        const float* norm_weight, float eps, __nv_bfloat16* y, void* workspace,
                                        size_t workspace_bytes, cudaStream_t stream);
// The same, and the RMSNorm partial sums of the updated residual rows into norm_partials ([M,
// gemm_w4a16_norm_partials_per_row(N)] fp32, non-null, 4-byte aligned): for each row, the warp partials of
// rmsnorm_bf16's float4 kernel (its threads' sums of squares, each warp's butterfly) computed from the rows this call
// leaves. A gemm_w4a16_rmsnorm* launch given them adds them in that kernel's order instead of reading its rows in
// full: the same bits, without the row sums on its critical path. When K is split the reduce kernel writes them as it
// adds; otherwise a small kernel after the GEMM reads the rows back (the GEMM's store stays as it is).
cudaError_t gemm_w4a16_residual_norm_partials(const __nv_bfloat16* x, const uint32_t* w_packed,
                                              const uint16_t* scales, float* residual, float* norm_partials, int M,
                                              int N, int K, int group, formats::ScaleType scale_type, void* workspace,
                                              size_t workspace_bytes, cudaStream_t stream);
// fp32 norm partials per row of width K (gemm_w4a16_residual_norm_partials, the rmsnorm launchers' norm_partials):
// rmsnorm_bf16's warps per row, at most 32; 0 when K is not a positive multiple of 4.
int gemm_w4a16_norm_partials_per_row(int K);
// h[m, j] = bf16(silu(g) * u), g and u the BF16-rounded gate and up outputs j, for a gate|up weight of N = 2 * inter
// rows (gate rows first) packed in the SwiGLU-interleaved row order (formats::Int4MmaRows::swiglu_interleaved).
// h: BF16 [M, N / 2] row-major, 8-byte aligned (= gemm_w4a16 on the canonical packing, then swiglu_bf16).
cudaError_t gemm_w4a16_swiglu(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                              __nv_bfloat16* h, int M, int N, int K, int group, formats::ScaleType scale_type,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);


// The qkv projection with the attention prologue as its epilogue: gemm_w4a16 of the fused [q | k | v] weight
// (N = (n_heads + 2 n_kv_heads) * head_dim rows, canonical packing) into qkv, then qkv_rope_kv_append
// (futransformer/cuda/fused_ops.h) with the other arguments — bit for bit those two calls, qkv included (it holds
// the RoPE'd q and k and the GEMM's v afterwards), every written cache byte and q_out. When the GEMM's tiling splits
// K (gemm_w4a16_splits_k), the whole prologue runs in the split-K reduce kernel (a warp per (row, head) sums the
// head's partials in the plain reduce's order, rounds them as its store does, then runs qkv_rope_kv_append's per-head
// code): one kernel after the GEMM instead of two. Without a split the GEMM's own store writes qkv and
// qkv_rope_kv_append's kernel follows, exactly the unfused pair: forcing a split would not remove a launch (the
// reduce kernel takes the place of the prologue kernel) and would change the GEMM's summation order, so the result
// would no longer be the unfused one. Arguments and checks of both calls (qkv 4-byte aligned; workspace of
// gemm_w4a16_workspace_bytes(M, N, K)); rejected calls return cudaErrorInvalidValue with gemm_w4a16_last_error().
// Like qkv_rope_kv_append it cannot serve int4-hadamard passes that start sequences (their key anchors come first).
//
// head_counters (optional): with it, an unsplit GEMM of M <= 8 rows on an INT4 or int4-hadamard cache at head_dim
// 128 runs the prologue in its own tail where gemm_w4a16_qkv_prologue_in_tail says so: the CTA that completes a
// head's columns (a per-head counter) runs that head's prologue for every row — no kernel after the GEMM, same bits.
// head_counters: 4-byte aligned device memory of at least n_heads + 2 n_kv_heads uint32, all zero; every launch
// leaves them zero. Launches that share one array must not run at the same time (one stream). Ignored elsewhere.
cudaError_t gemm_w4a16_qkv_rope_append(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                                       int M, int K, int group, formats::ScaleType scale_type, void* workspace,
                                       size_t workspace_bytes, formats::KvFormat format, __nv_bfloat16* qkv,
                                       int n_heads, int n_kv_heads, int head_dim, const int32_t* positions,
                                       const float* inv_freq, const int32_t* row_page, const int32_t* row_slot,
                                       const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool,
                                       int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream,
                                       uint32_t* head_counters = nullptr);
// Whether gemm_w4a16_qkv_rope_append with head_counters runs the prologue in the GEMM's tail for this shape on the
// current device (no K split, M <= 8, INT4 / int4-hadamard cache, head_dim 128, a tiling with such an instance).
// false for rejected shapes or without a device.
bool gemm_w4a16_qkv_prologue_in_tail(int M, int K, int group, formats::ScaleType scale_type, formats::KvFormat format,
                                     int n_heads, int n_kv_heads, int head_dim);
// cudaSuccess when gemm_w4a16_qkv_rope_append takes the shape (gemm_w4a16_can_implement with N = (n_heads +
// 2 n_kv_heads) * head_dim, and qkv_rope_kv_append_can_implement with rows = M); otherwise cudaErrorInvalidValue and,
// when why is not null, a sentence naming the parameter. Needs no device.
cudaError_t gemm_w4a16_qkv_rope_append_can_implement(int M, int K, int group, formats::ScaleType scale_type,
                                                     formats::KvFormat format, int n_heads, int n_kv_heads,
                                                     int head_dim, int hadamard_block, std::string* why);
// The same GEMMs with the RMSNorm before them as their prologue (decode, M <= 8): the activations are
// bf16(norm_weight · (s · x)) of fp32 rows x [M, K] (the residual stream), s = 1 / sqrt(mean(x²) + eps) per row,
// computed inside the GEMM as it stages its activations — no rmsnorm_bf16 launch, no BF16 copy of the rows. Each
// CTA sums its rows' squares in rmsnorm_bf16's own order (its float4 kernel's threads, warp butterflies and warp
// order, emulated by the CTA's warps), so the result is bit for bit rmsnorm_bf16(x, norm_weight, ·, M, K, eps)
// followed by the named GEMM on the same tiling. x and norm_weight: fp32, non-null, 16-byte aligned (with K % 32 == 0
// the conditions under which rmsnorm_bf16 takes that order); eps finite and >= 0. Only M <= 8 (the v4 swapped path;
// not under FT_W4A16_VARIANT=v2); every CTA reads its M rows in full for the sums (M x K x 4 bytes from L2) — unless
// norm_partials is given: then it holds x's partials as gemm_w4a16_residual_norm_partials wrote them ([M,
// gemm_w4a16_norm_partials_per_row(K)]), each CTA adds those and reads only its K slice of x; same bits.
// Other arguments, workspace (gemm_w4a16_workspace_bytes(M, N, K)) and errors as the GEMM named.
//
// cudaSuccess when the norm-prologue launchers take the GEMM shape; otherwise cudaErrorInvalidValue and, when why is
// not null, a sentence naming the parameter. Needs no device.
cudaError_t gemm_w4a16_rmsnorm_can_implement(int M, int N, int K, int group, formats::ScaleType scale_type,
                                             std::string* why);
// = rmsnorm_bf16, then gemm_w4a16 into y.
cudaError_t gemm_w4a16_rmsnorm(const float* x, const float* norm_weight, float eps, const uint32_t* w_packed,
                               const uint16_t* scales, __nv_bfloat16* y, int M, int N, int K, int group,
                               formats::ScaleType scale_type, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream, const float* norm_partials = nullptr);
// = rmsnorm_bf16, then gemm_w4a16_swiglu into h (gate|up packed swiglu_interleaved).
cudaError_t gemm_w4a16_rmsnorm_swiglu(const float* x, const float* norm_weight, float eps, const uint32_t* w_packed,
                                      const uint16_t* scales, __nv_bfloat16* h, int M, int N, int K, int group,
                                      formats::ScaleType scale_type, void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream, const float* norm_partials = nullptr);
// = rmsnorm_bf16, then gemm_w4a16_qkv_rope_append (split K: the prologue in the reduce; else the GEMM's store, then
// qkv_rope_kv_append's kernel), with its arguments and checks.
cudaError_t gemm_w4a16_rmsnorm_qkv_rope_append(
    const float* x, const float* norm_weight, float eps, const uint32_t* w_packed, const uint16_t* scales, int M,
    int K, int group, formats::ScaleType scale_type, void* workspace, size_t workspace_bytes, formats::KvFormat format,
    __nv_bfloat16* qkv, int n_heads, int n_kv_heads, int head_dim, const int32_t* positions, const float* inv_freq,
    const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors, const int32_t* row_anchor,
    uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream,
    const float* norm_partials = nullptr);

// Whether gemm_w4a16 (and every epilogue variant) splits K for this shape on the current device, i.e. whether
// gemm_w4a16_qkv_rope_append runs its prologue in the split-K reduce. false for rejected shapes or without a device.
bool gemm_w4a16_splits_k(int M, int N, int K, int group);

// Why the last gemm_w4a16* call on this thread returned cudaErrorInvalidValue ("" after a success).
const char* gemm_w4a16_last_error();

}  // namespace futransformer::cuda
