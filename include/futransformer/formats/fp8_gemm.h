// CPU twin of the FP8 GEMM (futransformer/cuda/gemm_fp8.h): the reference semantics the GPU kernel is tested
// against, compiled in every build.
//   D[m][n] = bf16( (sum_k e4m3(A[m][k]) * e4m3(B[n][k])) * a_scale[m] * b_scale[n] )
// A [M, K] and B [N, K] are E4M3 codes (futransformer/formats/fp8.h), row-major; a_scale [M], b_scale [N] fp32.
// The sum is exact: every E4M3 value is a multiple of 2^-9 below 2^9, so every product is a multiple of 2^-18
// below 2^18 and fp64 holds any sum of up to 2^17 of them without rounding (in any order). The product of the two
// fp32 scales is exact in fp64 and multiplies the sum with one rounding; the result is rounded to fp32 and then,
// to nearest even, to BF16. NaN codes give NaN.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace futransformer::formats {

inline constexpr int64_t kFp8GemmExactMaxK = int64_t{1} << 17;

struct Fp8GemmReference {
  std::vector<uint16_t> bf16;  // [M, N] BF16 bits of D
  std::vector<double> value;   // [M, N] D before the BF16 rounding
  std::vector<double> abs_dot; // [M, N] sum_k |a * b| * |a_scale * b_scale|: the scale of accumulation errors
};

// Throws futransformer::Error when a size does not match M, N, K or K exceeds kFp8GemmExactMaxK.
Fp8GemmReference gemm_fp8_reference(std::span<const uint8_t> a, std::span<const uint8_t> b,
                                    std::span<const float> a_scale, std::span<const float> b_scale, int64_t M,
                                    int64_t N, int64_t K);

}  // namespace futransformer::formats
