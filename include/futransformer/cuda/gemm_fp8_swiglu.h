// The gate|up projection of FP8 prefill with SwiGLU and the down projection's FP8 quantisation in its epilogue
// (sm_90a):
//   g[m][c], u[m][c] = gemm_fp8's BF16 outputs of the gate row c and the up row c     (A · B^T · a_scale · b_scale)
//   y[m][c]          = silu(g) · u                                                     (swiglu_bf16's arithmetic)
//   codes [M, inter] E4M3, y_scales [M, inter / 128] = y quantised per token per 128 channels
//                      (formats::fp8_quantize_per_token_block's rule)                  → gemm_fp8_block_a's A operand
// The [M, 2 · inter] BF16 gate|up tensor is never written, and no SwiGLU / quantisation kernel runs: the result is
// bit for bit gemm_fp8 (canonical weight) followed by swiglu_fp8_block (fp8_producers.h).
// The weight is packed: B_packed row p = canonical row gemm_fp8_swiglu_packed_row_source(p, inter) of the
// [gate rows (inter); up rows (inter)] weight [2 · inter, K], and b_scale_packed follows the same order (a tile's
// 256 rows hold gate then up of 64 channels, twice, so every thread holds g and u of its own channels).
// Accepted: M >= 1, inter a multiple of 128, K a multiple of 16 (as gemm_fp8), A / B_packed / codes 16-byte
// aligned, scales 4-byte aligned, an sm_90 device; anything else returns cudaErrorInvalidValue with the reason in
// gemm_fp8_swiglu_last_error() and launches nothing. No workspace, no host synchronisation: graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace futransformer::cuda {

constexpr int kFp8SwigluChannelMultiple = 128;

// The canonical row of the [gate; up] weight that packed row `packed_row` holds (host; pure index arithmetic).
int64_t gemm_fp8_swiglu_packed_row_source(int64_t packed_row, int64_t inter);

cudaError_t gemm_fp8_swiglu_can_implement(int M, int inter, int K, std::string* why);

cudaError_t gemm_fp8_swiglu(const uint8_t* A, const uint8_t* B_packed, const float* a_scale,
                            const float* b_scale_packed, uint8_t* codes, float* y_scales, int M, int inter, int K,
                            cudaStream_t stream);

// Why the last gemm_fp8_swiglu call on this thread returned cudaErrorInvalidValue ("" after an accepted call).
const char* gemm_fp8_swiglu_last_error();

}  // namespace futransformer::cuda
