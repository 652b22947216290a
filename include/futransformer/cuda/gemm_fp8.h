// FP8 E4M3 GEMM for prefill on Hopper (sm_90a):
//   D[M, N] = (A[M, K] . B[N, K]^T) * a_scale[m] * b_scale[n]
//   A: activations, E4M3 codes [M, K] row-major, one fp32 scale per token (row)     (formats::fp8_quantize_per_token)
//   B: weights, E4M3 codes [N, K] row-major, one fp32 scale per output channel (row) (formats::fp8_quantize_weight)
//   D: BF16 [M, N] row-major.
// Codes are futransformer/formats/fp8.h's E4M3 ("e4m3fn"). Products are accumulated in fp32 with a promotion
// every 128 elements of K (the tensor cores' own FP8 accumulation keeps only about 14 bits), scaled in fp32 and
// rounded once to BF16; the result is deterministic. CPU twin: formats::gemm_fp8_reference.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

// K must be a multiple of this: TMA needs 16-byte row strides. A K that kBlockK (128) does not divide ends in a
// partial block whose missing columns TMA fills with zeros, which add nothing to the sums.
constexpr int kFp8GemmKMultiple = 16;
constexpr int kFp8GemmNMultiple = 8;    // N must be a multiple of this (16-byte rows of D for its TMA stores)
constexpr int kFp8GemmMaxDim = 1 << 24;

// cudaSuccess when the kernel handles the shape; otherwise cudaErrorInvalidValue and, when why is not null, a
// sentence naming the offending parameter and what is expected. Needs no device.
cudaError_t gemm_fp8_can_implement(int M, int N, int K, std::string* why);

// Enqueues the GEMM on `stream`. Device pointers: A, B and D 16-byte aligned, a_scale and b_scale 4-byte aligned;
// D must not overlap the inputs. Returns cudaErrorInvalidValue (message in gemm_fp8_last_error()) for rejected
// shapes or pointers, or when the device cannot run the sm_90a kernel; otherwise the launch's error, if any.
cudaError_t gemm_fp8(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale, __nv_bfloat16* D,
                     int M, int N, int K, cudaStream_t stream);

// The q|k|v projection of a prefill pass with RoPE in its epilogue: D as gemm_fp8 stores it, except that the first
// rope_heads heads of 128 columns (q and k: n_heads + n_kv_heads) are rotated by HF rotate-half RoPE at each row's
// angles, with rope_qk_bf16's arithmetic on the BF16-rounded values and a second BF16 rounding — bit-identical to
// gemm_fp8 followed by rope_qk_bf16 at head_dim 128. rope_cos_sin: the pass's table from rope_cos_sin_table
// (decoder_ops.h), [M, 64] (cos, sin) fp32 pairs, 16-byte aligned. gemm_fp8's shapes and pointers, plus N a multiple
// of 128 and 1 <= rope_heads <= N / 128; otherwise cudaErrorInvalidValue with the reason in gemm_fp8_last_error().
// Runs at 128-column tiles.
cudaError_t gemm_fp8_rope(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale,
                          __nv_bfloat16* D, const float* rope_cos_sin, int rope_heads, int M, int N, int K,
                          cudaStream_t stream);

// The o / down projection epilogue: residual[m][n] += float(bf16(D[m][n])) in place (fp32 [M, N] row-major, 8-byte
// aligned, not overlapping the inputs) instead of storing D — bit-identical to gemm_fp8 into a BF16 buffer followed
// by add_residual_bf16, without D's pass through memory or the second kernel. Same shapes and errors as gemm_fp8.
cudaError_t gemm_fp8_residual(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale,
                              float* residual, int M, int N, int K, cudaStream_t stream);

// A with one scale per row per 128-deep K block: a_scale_blocks fp32 [M, ceil(K / 128)] row-major (4-byte aligned),
// block kb covering K columns 128 kb .. 128 kb + 127 — the 1 x 128 activation blocks of
// formats::fp8_quantize_per_token_block, which a producer that sees one tile of a row can emit (the gate|up GEMM's
// SwiGLU → FP8 epilogue, gemm_fp8_swiglu.h). D[m][n] = bf16((sum_kb dot_kb(m, n) · a_scale[m][kb]) · b_scale[n]),
// each K block's fp32 sum promoted with one fma. Same shapes, pointers and errors as gemm_fp8 / gemm_fp8_residual.
// CPU twin: formats::gemm_fp8_block_a_reference.
cudaError_t gemm_fp8_block_a(const uint8_t* A, const uint8_t* B, const float* a_scale_blocks, const float* b_scale,
                             __nv_bfloat16* D, int M, int N, int K, cudaStream_t stream);
cudaError_t gemm_fp8_block_a_residual(const uint8_t* A, const uint8_t* B, const float* a_scale_blocks,
                                      const float* b_scale, float* residual, int M, int N, int K, cudaStream_t stream);

// Why the last gemm_fp8 call on this thread returned cudaErrorInvalidValue ("" after a success).
const char* gemm_fp8_last_error();

}  // namespace futransformer::cuda
