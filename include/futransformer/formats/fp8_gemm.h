// CPU twins of the FP8 GEMMs (futransformer/cuda/gemm_fp8.h): the reference semantics the GPU kernels are tested
// against, compiled in every build.
//   gemm_fp8_reference:         D[m][n] = bf16( (sum_k e4m3(A[m][k]) * e4m3(B[n][k])) * a_scale[m] * b_scale[n] )
//   gemm_fp8_block_a_reference: D[m][n] = bf16( sum_kb (sum_{k in block kb} e4m3(A[m][k]) * e4m3(B[n][k]))
//                                                      * a_scale[m][kb] * b_scale[n] )
// A [M, K] and B [N, K] are E4M3 codes (futransformer/formats/fp8.h), row-major; b_scale [N] fp32; a_scale [M] fp32,
// or for the block twin [M, ceil(K / 128)] row-major: one scale per row per 128 consecutive K (kFp8BlockCols, the
// 1x128 activation blocks of fp8_quantize_per_token_block; a last partial block when 128 does not divide K).
// Every sum over k is exact: every E4M3 value is a multiple of 2^-9 below 2^9, so every product is a multiple of
// 2^-18 below 2^18 and fp64 holds any sum of up to 2^17 of them without rounding (in any order). The product of two
// fp32 scales is exact in fp64, and so is each block sum times it as an unevaluated pair of doubles (an FMA gives
// the low half). `value` is the sum of those exact terms rounded once, to nearest, to fp64 — so with one block, or
// with every block of a row sharing one scale, the block twin's value equals gemm_fp8_reference's bit for bit
// (sum times scale, one rounding). The value is then rounded to fp32 and, to nearest even, to BF16. NaN codes (or
// non-finite scales) give the fp64 sum of the rounded terms, so NaN stays NaN.
// The GPU adds its block partials in fp32 in a fixed order; the twin's one rounding is the exact result it
// approximates, with `abs_dot` as the scale of its error.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace futransformer::formats {

inline constexpr int64_t kFp8GemmExactMaxK = int64_t{1} << 17;

struct Fp8GemmReference {
  std::vector<uint16_t> bf16;  // [M, N] BF16 bits of D
  std::vector<double> value;   // [M, N] D before the BF16 rounding
  std::vector<double> abs_dot; // [M, N] sum_k |a * b * a_scale(k) * b_scale|: the scale of accumulation errors
};

// Throws futransformer::Error when a size does not match M, N, K or K exceeds kFp8GemmExactMaxK.
Fp8GemmReference gemm_fp8_reference(std::span<const uint8_t> a, std::span<const uint8_t> b,
                                    std::span<const float> a_scale, std::span<const float> b_scale, int64_t M,
                                    int64_t N, int64_t K);

// Throws futransformer::Error when a size does not match M, N, K (a_scale: M * ceil(K / 128)) or K exceeds
// kFp8GemmExactMaxK.
Fp8GemmReference gemm_fp8_block_a_reference(std::span<const uint8_t> a, std::span<const uint8_t> b,
                                            std::span<const float> a_scale, std::span<const float> b_scale, int64_t M,
                                            int64_t N, int64_t K);

}  // namespace futransformer::formats
