// Fused versions of short chains of the CUDA decoder layer's small ops. At decode shapes each of those ops moves a
// few KB and costs mostly its launch and drain (~3-4 µs inside a graph), so merging dependent ones into one kernel
// saves that time. Each fused launcher produces exactly the bits of the unfused sequence it replaces (same device
// code for the arithmetic, same summation orders); the GPU tests compare the two bit for bit.
//
// Like the ops they fuse, every launcher only enqueues one kernel (no allocation, no synchronisation, no device
// query): graph-capturable. Bad shapes or pointers return cudaErrorInvalidValue with the reason in
// fused_ops_last_error(), before any CUDA call (so the checks need no device); otherwise the launch's error.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

// add_residual_bf16(x, delta, rows, hidden) followed by rmsnorm_bf16(x, weight, y, rows, hidden, eps): x[r, :] +=
// float(delta[r, :]) in place, then y[r, :] = RMSNorm of the updated row, both bit-identical to the two calls (the
// sum of squares uses rmsnorm_bf16's thread mapping and order, chosen from the same pointer alignments). One CTA
// per row. rows 1..kDecoderOpsMaxRows, hidden 1..kDecoderOpsMaxWidth, eps finite and >= 0; x, delta and y must not
// overlap one another (weight may be anywhere).
cudaError_t add_residual_rmsnorm_bf16(float* x, const __nv_bfloat16* delta, const float* weight, __nv_bfloat16* y,
                                      int rows, int hidden, float eps, cudaStream_t stream);

// cudaSuccess when qkv_rope_kv_append (and kv_append_rotate_q) handle the shape; otherwise cudaErrorInvalidValue
// and, when why is not null, a sentence naming the parameter and what is expected. format: bf16, fp8, int4 or
// int4-hadamard; rows 1..65535; n_heads and n_kv_heads 1..65535; head_dim a multiple of 8 (bf16), 16 (fp8) or 32
// (int4 formats), at most kKvAppendMaxHeadDim (256); hadamard_block 0 or 1 (q copied) or a power of two that
// divides head_dim. Needs no device.
cudaError_t qkv_rope_kv_append_can_implement(formats::KvFormat format, int rows, int n_heads, int n_kv_heads,
                                             int head_dim, int hadamard_block, std::string* why);

// The attention prologue in one kernel. qkv rows hold [q (n_heads·head_dim) | k (n_kv_heads·head_dim) |
// v (n_kv_heads·head_dim)] BF16, row stride (n_heads + 2·n_kv_heads)·head_dim. Equivalent, bit for bit, to
//   rope_qk_bf16(qkv, positions, inv_freq, rows, n_heads, n_kv_heads, head_dim);
//   kv_append(format, qkv, stride, n_heads·head_dim, (n_heads + n_kv_heads)·head_dim, rows, n_kv_heads, head_dim,
//             row_page, row_slot, key_anchors, row_anchor, kv_pool);
//   rotate_heads_bf16(qkv, stride, q_out, rows, n_heads, head_dim, hadamard_block);
// including the state qkv is left in: the RoPE'd q and k are written back into qkv (v untouched), so a later
// reader of qkv sees what it saw after rope_qk_bf16. q_out is BF16 [rows, n_heads, head_dim] and must not
// overlap qkv. Padding rows (row_page[r] < 0) and the anchor rules are kv_append's; key_anchors and row_anchor
// are needed (non-null) for int4-hadamard only. Pointer alignment as for kv_append (kv_pool 16 bytes).
//
// int4-hadamard with sequences that start in this pass: their key anchors (kv_key_anchor_compute) must be computed
// from the RoPE'd keys BEFORE the keys are appended, which one kernel cannot do (the anchor is a mean over a
// chunk's rows). For such a pass run rope_qk_bf16, then kv_key_anchor_compute, then kv_append_rotate_q below;
// passes without new sequences (every decode step) use qkv_rope_kv_append.
//
// Programmatic launch (on by default, FT_PDL=0 off): positions, inv_freq, row_page, row_slot and row_anchor are read
// BEFORE the kernel's griddepcontrol.wait, i.e. possibly while kernels enqueued before it on the stream still run.
// No kernel that may still be running may write them (the engine uploads them with a copy before the pass's first
// kernel; a copy is a full dependency). qkv and kv_pool are read after the wait. The same holds for
// kv_append_rotate_q and for gemm_w4a16_qkv_rope_append's reduce. key_anchors: qkv_rope_kv_append (the quad kernel,
// int4-hadamard) reads them before the wait too — a pass that runs it computes no anchors (above), so no kernel of
// the pass may write them; kv_append_rotate_q, which follows kv_key_anchor_compute, and the GEMM's reduce read them
// after it.
cudaError_t qkv_rope_kv_append(formats::KvFormat format, __nv_bfloat16* qkv, int rows, int n_heads, int n_kv_heads,
                               int head_dim, const int32_t* positions, const float* inv_freq,
                               const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors,
                               const int32_t* row_anchor, uint8_t* kv_pool, int hadamard_block,
                               __nv_bfloat16* q_out, cudaStream_t stream);

// qkv_rope_kv_append without the RoPE (qkv already RoPE'd; it is not written): bit-identical to kv_append then
// rotate_heads_bf16 with the arguments above. Same contract otherwise.
cudaError_t kv_append_rotate_q(formats::KvFormat format, const __nv_bfloat16* qkv, int rows, int n_heads,
                               int n_kv_heads, int head_dim, const int32_t* row_page, const int32_t* row_slot,
                               const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool,
                               int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream);

// The keys-only half of kv_append_rotate_q: the k heads of the RoPE'd qkv rows into the cache (v and q untouched),
// bit-identical to the keys kv_append writes. For passes whose FP8 QKV GEMM (gemm_fp8_qkv.h) placed v and rotated q
// itself but left the keys as RoPE'd BF16 because their anchors were not known yet: run kv_key_anchor_compute, then
// this. INT4 and int4-hadamard caches at head_dim 128 only (the quad kernel), qkv 16-byte aligned; anything else
// is cudaErrorInvalidValue with the reason in fused_ops_last_error(). Programmatic launch as kv_append_rotate_q.
cudaError_t kv_append_keys(formats::KvFormat format, const __nv_bfloat16* qkv, int rows, int n_heads, int n_kv_heads,
                           int head_dim, const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors,
                           const int32_t* row_anchor, uint8_t* kv_pool, cudaStream_t stream);

// Why the last fused-op launch on this thread returned cudaErrorInvalidValue ("" after an accepted call).
const char* fused_ops_last_error();

}  // namespace futransformer::cuda
