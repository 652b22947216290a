// Per-token-per-128-channel FP8 quantisation on the device: formats::fp8_quantize_per_token_block's rule for one
// block of 128 values held by a warp (4 per lane) or by a GEMM epilogue's threads. Shared by the unfused producer
// (swiglu_fp8_block_kernel, fp8_producers.cuh) and the gate|up GEMM's SwiGLU epilogue (gemm_fp8_swiglu.cuh), so both
// compute the same scale and codes from the same y by construction.
#pragma once

#include <cstdint>

#include "cuda/decoder_ops.cuh"
#include "cuda/ptx/cvt.cuh"

namespace futransformer::cuda::fp8blk {

constexpr int kBlockCols = 128;    // formats::kFp8BlockCols
constexpr float kFp8Max = 448.0f;  // formats::kFp8E4M3Max

// formats::fp8_scale_for_amax: IEEE division (not a reciprocal multiply), the unit scale when amax / 448 is 0. A
// block holding a NaN or an infinity (where the CPU quantiser throws) gets scale NaN, so all its codes are NaN.
__device__ __forceinline__ float block_scale(float amax, bool all_finite) {
  float s = __fdiv_rn(amax, kFp8Max);
  if (!(s > 0.0f)) s = 1.0f;
  return all_finite ? s : ops::nan_f32();
}

// Two E4M3 codes (y0 in the low byte) of y / s: IEEE division, round to nearest even, saturating to ±448.
__device__ __forceinline__ uint32_t codes_x2(float y0, float y1, float s) {
  return ptx::cvt_rn_satfinite_e4m3x2_f32(__fdiv_rn(y0, s), __fdiv_rn(y1, s));
}

}  // namespace futransformer::cuda::fp8blk
