// The producers of FP8 prefill: the ops that write the activation operand of gemm_fp8 (gemm_fp8.h) — E4M3 codes
// [rows, width] (row stride = width) and one fp32 scale per row (token) — straight from the tensors the decoder
// layer has at hand, so no BF16 activation is written and re-read before an FP8 GEMM.
//   rmsnorm_fp8        fp32 residual stream → q|k|v and gate|up GEMM inputs
//   quantize_rows_fp8  BF16 attention output → o_proj input
//   unrotate_rows_fp8  BF16 int4-hadamard attention output → un-rotated, o_proj input
//   swiglu_fp8         BF16 gate|up GEMM output → down_proj input
// Each op computes its fp32 value y exactly as its BF16 sibling in decoder_ops.h (same expression, same summation
// order, same launch shape) and then quantises each row per token by formats/fp8.h's rule, the one
// formats::fp8_quantize_per_token implements:
//   amax = max |y| over the row;  scale = amax / 448 (IEEE division; 1 when that is 0);
//   code = E4M3(y / scale) (IEEE division, round to nearest even, saturating: cvt.rn.satfinite).
// The quantisation step is bit-exact with formats::fp8_quantize_per_token applied to the same y. A row whose y holds
// a NaN or an infinity (where the CPU quantiser throws) gets scale NaN and every code 0x7F (NaN), so the GEMM row
// that reads it is NaN instead of silently finite.
// CPU twins (the reference engine's act-fp8 path does exactly these): ref::rmsnorm, then
// formats::fp8_quantize_per_token; the BF16 values widened, then fp8_quantize_per_token; ref::swiglu, then
// fp8_quantize_per_token.
//
// Every launcher only enqueues one kernel (no allocation, no host synchronisation, no device query), so all of them
// can be captured in a CUDA graph; under FT_PDL=1 they launch as programmatic dependents like decoder_ops.h's.
// 16-byte vector loads are used when the pointers and widths allow; any alignment works. Outputs must not overlap the
// inputs. Bad sizes, null or overlapping pointers return cudaErrorInvalidValue with the reason in
// fp8_producers_last_error(), before any CUDA call (so the checks need no device); otherwise the launch's error.
// `y_debug` (optional, may be null): also receives the fp32 y [rows, width] that was quantised — for tests that
// check the quantisation step bit for bit; the engine passes null.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

constexpr int kFp8ProducersMaxRows = 1 << 24;   // one CTA per row on grid.x; the FP8 GEMM's own limit on M
constexpr int kFp8ProducersMaxWidth = 1 << 24;  // hidden, inter, cols

// y[r, i] = w[i] · (s · x[r, i]), s = 1 / sqrt(mean_j x[r, j]² + eps), in fp32 with rmsnorm_bf16's order of
// operations and summation (so bf16(y) is bit for bit rmsnorm_bf16's output), then per-token FP8 of y.
// x fp32 [rows, hidden], weight fp32 [hidden]; codes [rows, hidden], scales [rows].
cudaError_t rmsnorm_fp8(const float* x, const float* weight, uint8_t* codes, float* scales, int rows, int hidden,
                        float eps, cudaStream_t stream, float* y_debug = nullptr);

// Per-token FP8 of BF16 rows: row r is x[r · row_stride + c] for c < cols (row_stride >= cols, in elements: the
// attention output may sit inside a wider buffer). y = the BF16 values widened (exact). codes [rows, cols] (stride
// cols), scales [rows].
cudaError_t quantize_rows_fp8(const __nv_bfloat16* x, int row_stride, uint8_t* codes, float* scales, int rows, int cols,
                              cudaStream_t stream);

// The int4-hadamard attention output's un-rotation and the o_proj input in one pass: y = the BF16 values that
// rotate_heads_bf16(x, row_stride, ·, rows, n_heads, head_dim, hadamard_block) would store (each head read into fp32,
// the block Hadamard in fp32 in formats/hadamard.h's order, rounded once to BF16), widened; then per-token FP8 of y.
// So the same codes and scales as rotate_heads_bf16 followed by quantize_rows_fp8, without writing the un-rotated
// BF16 rows. x is not modified. Shapes (else cudaErrorInvalidValue, reason in fp8_producers_last_error()):
// head_dim = 16 · L with L a power of two up to 32, hadamard_block a power of two from 2 to head_dim,
// n_heads · head_dim ≤ 16384 (one thread per 16 channels), row_stride a multiple of 8 and ≥ n_heads · head_dim,
// x 16-byte and codes 8-byte aligned. codes [rows, n_heads · head_dim], scales [rows].
cudaError_t unrotate_rows_fp8(const __nv_bfloat16* x, int row_stride, uint8_t* codes, float* scales, int rows,
                              int n_heads, int head_dim, int hadamard_block, cudaStream_t stream);
// unrotate_rows_fp8's shape checks alone (rows, n_heads, head_dim, hadamard_block, row_stride; no pointers, no
// device): cudaSuccess, or cudaErrorInvalidValue with the reason in *why (may be null).
cudaError_t unrotate_rows_fp8_can_implement(int rows, int n_heads, int head_dim, int hadamard_block, int row_stride,
                                            std::string* why);

// gate_up row r holds [gate (inter values) | up (inter values)] BF16; y[r, i] = silu(g) · u in fp32 with
// swiglu_bf16's arithmetic (so bf16(y) is bit for bit swiglu_bf16's output), then per-token FP8 of y.
// codes [rows, inter], scales [rows].
cudaError_t swiglu_fp8(const __nv_bfloat16* gate_up, uint8_t* codes, float* scales, int rows, int inter,
                       cudaStream_t stream, float* y_debug = nullptr);

// As swiglu_fp8, but quantised per token per 128 channels (formats::fp8_quantize_per_token_block's rule on y, the
// operand of gemm_fp8_block_a): inter a multiple of 128, codes [rows, inter], scales [rows, inter / 128]; gate_up
// 8-byte aligned, codes and scales 4-byte aligned. y and hence every code and scale are those the gate|up GEMM's
// fused SwiGLU epilogue (gemm_fp8_swiglu.h) writes from the same BF16 gate and up values.
cudaError_t swiglu_fp8_block(const __nv_bfloat16* gate_up, uint8_t* codes, float* scales, int rows, int inter,
                             cudaStream_t stream);

// Why the last fp8-producer launch on this thread returned cudaErrorInvalidValue ("" after an accepted call).
const char* fp8_producers_last_error();

}  // namespace futransformer::cuda
