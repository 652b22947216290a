// The small per-token ops of the CUDA decoder layer: embedding gather, RMSNorm, residual add, SwiGLU, RoPE on the
// fused QKV rows and the greedy argmax. The residual stream is fp32 [rows, hidden]; GEMM operands are BF16. Each
// op's CPU twin is the reference op named in its comment (src/ref/ops.h, src/engine/sampling.cpp).
//
// Every launcher only enqueues one kernel (no allocation, no host synchronisation, no device query), so all of
// them can be captured in a CUDA graph. Rows of every tensor are contiguous (row stride = the row's width).
// 16-byte vector loads are used when the pointers and widths allow; any alignment of the element type works.
// Bad sizes or null pointers return cudaErrorInvalidValue with the reason in decoder_ops_last_error(), before any
// CUDA call (so the checks need no device); otherwise the launch's error, if any.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

constexpr int kDecoderOpsMaxRows = 65535;     // rows go on a grid dimension
constexpr int kDecoderOpsMaxWidth = 1 << 24;  // hidden, inter, vocab (and vocab * hidden rows of a table fit easily)
constexpr int kRopeMaxHeadDim = 512;          // head_dim / 2 cos/sin pairs are staged in shared memory

// x[r, :] = float(table[tokens[r], :]) for r < rows (table BF16 [vocab, hidden], x fp32 [rows, hidden]).
// Token ids are checked by the caller (host) to be < vocab; the kernel still writes a NaN row for an id outside
// [0, vocab) instead of reading out of bounds. Twin: RefModel::embed of the BF16 table (exact).
cudaError_t embed_rows_bf16(const __nv_bfloat16* table, const int32_t* tokens, float* x, int rows, int hidden,
                            int vocab, cudaStream_t stream);

// y[r, i] = bf16(w[i] · (s · x[r, i])), s = 1 / sqrt(mean_j x[r, j]² + eps) (ref::rmsnorm's order); the mean is
// accumulated in fp32 in a fixed order (per thread, then a shuffle butterfly, then the warps in index order), so
// the result is deterministic. One CTA per row. Under programmatic launch (on by default, FT_PDL=0 off) part of
// `weight` is read before the kernel waits for the kernels enqueued before it: none of them may write it.
cudaError_t rmsnorm_bf16(const float* x, const float* weight, __nv_bfloat16* y, int rows, int hidden, float eps,
                         cudaStream_t stream);

// x[r, i] += float(delta[r, i]) (fp32 residual stream; one fp32 rounding, exact twin).
cudaError_t add_residual_bf16(float* x, const __nv_bfloat16* delta, int rows, int hidden, cudaStream_t stream);

// gate_up row r holds [gate (inter values) | up (inter values)]; out[r, i] = bf16(silu(g) · u) with fp32 math,
// silu(g) = g / (1 + expf(−g)) (ref::swiglu). out must not overlap gate_up.
cudaError_t swiglu_bf16(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int rows, int inter, cudaStream_t stream);

// qkv row r holds [q (n_heads·head_dim) | k (n_kv_heads·head_dim) | v (n_kv_heads·head_dim)] BF16. Applies HF
// rotate-half RoPE in place to every q and k head at position positions[r] (v untouched), with ref::apply_rope's
// arithmetic: a = double(pos)·double(inv_freq[i]), c = float(cos a), s = float(sin a) (fp64), then
// x'[i] = x[i]·c − x[i + d/2]·s and x'[i + d/2] = x[i + d/2]·c + x[i]·s in fp32 (each product and the sum
// rounded separately, no FMA), rounded once to BF16. inv_freq: fp32 [head_dim / 2] (ref::rope_inv_freq).
cudaError_t rope_qk_bf16(__nv_bfloat16* qkv, const int32_t* positions, const float* inv_freq, int rows, int n_heads,
                         int n_kv_heads, int head_dim, cudaStream_t stream);

// RoPE's (cos, sin) table of a pass: out[r][i] = (float(cos a), float(sin a)) with a = double(positions[r]) ·
// double(inv_freq[i]) (fp64, rope_qk_bf16's values), fp32 pairs [rows, head_dim / 2, 2]. Computed once per pass for
// the FP8 QKV GEMM's epilogue (gemm_fp8_qkv.h), whose layers all share the positions. head_dim even, 2..kRopeMaxHeadDim;
// out 8-byte aligned. Programmatic launch as the other ops (positions are read after the wait).
cudaError_t rope_cos_sin_table(const int32_t* positions, const float* inv_freq, int rows, int head_dim, float* out,
                               cudaStream_t stream);

// out[r] = index of the largest logit of row r (logits fp32 [rows, vocab]): the lowest index on ties (as
// futransformer::argmax), NaNs never win; a row of NaNs only gives 0. One CTA per row below 16384 entries, else a
// cluster of 8 CTAs per row (FT_ARGMAX_CLUSTER=0: one CTA at every size); the same answer either way.
cudaError_t argmax_rows_f32(const float* logits, int32_t* out, int rows, int vocab, cudaStream_t stream);

// The INT4 LM head's tail in one kernel: widened[r, c] = float(logits[r * row_stride + c]) for c < vocab (exact) and
// out[r] = argmax_rows_f32's answer on that row. row_stride >= vocab (the GEMM's padded N).
cudaError_t widen_argmax_rows_bf16(const __nv_bfloat16* logits, int row_stride, float* widened, int32_t* out, int rows,
                                   int vocab, cudaStream_t stream);

// Why the last decoder-op launch on this thread returned cudaErrorInvalidValue ("" after an accepted call).
const char* decoder_ops_last_error();

}  // namespace futransformer::cuda
