// FP8 E4M3 (OCP "e4m3fn", the type Hopper's tensor cores take): the single definition of its bytes that the
// quantiser, the reference engine and the GPU kernels share. docs/formats.md documents it bit by bit.
//
// Code bits: s eeee mmm. Exponent bias 7. No infinities; 0x7F and 0xFF are NaN; largest finite ±448 (0x7E/0xFE).
//   e == 0:  value = (-1)^s * m * 2^-9                (subnormals; steps of 2^-9, 0x00 = +0, 0x80 = -0)
//   e >= 1:  value = (-1)^s * (8 + m) * 2^(e - 10)    (normals, 2^-6 .. 448)
// Encoding is PTX `cvt.rn.satfinite.e4m3x2.f32`: round to nearest, ties to even; any |x| that rounds above 448
// (and ±inf) saturates to ±448; NaN encodes as 0x7F; the sign is kept for values that round to zero (-0 = 0x80).
//
// Quantisation with fp32 scales (one per row, or one per row per 128-column block):
//   scale = amax / 448          (fp32 division; amax = max |x| over the row/block; scale 1 when amax / 448 is 0)
//   code  = fp8_e4m3_encode(x / scale)          (IEEE fp32 division, never a reciprocal multiply)
//   value = fp8_e4m3_decode(code) * scale       (fp32 multiply)
// The GPU must divide with IEEE division (no --use_fast_math / __fdividef) to produce the same codes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace futransformer::formats {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr uint8_t kFp8E4M3NaN = 0x7F;
// Columns per scale in the blocked activation format (DeepSeek-V3 / DeepGEMM's 1x128 activation blocks).
inline constexpr int64_t kFp8BlockCols = 128;

uint8_t fp8_e4m3_encode(float x);
float fp8_e4m3_decode(uint8_t code);

// A [rows, cols] matrix of E4M3 codes with fp32 scales of shape [rows, cols / block].
// block == cols: one scale per row (per output channel of a weight, per token of an activation).
struct Fp8Matrix {
  int64_t rows = 0, cols = 0;
  int64_t block = 0;             // columns sharing one scale
  std::vector<uint8_t> codes;    // [rows, cols], row-major
  std::vector<float> scales;     // [rows, cols / block]

  int64_t blocks_per_row() const { return cols / block; }
  float scale(int64_t r, int64_t c) const { return scales[static_cast<size_t>(r * blocks_per_row() + c / block)]; }
};

// The scale for a group of values with the given absolute maximum (the rule above). Throws when amax is not finite.
float fp8_scale_for_amax(float amax, const std::string& what);

// Weights [N, K]: one scale per output channel (row).
Fp8Matrix fp8_quantize_weight(std::span<const float> w, int64_t rows, int64_t cols, const std::string& tensor_name);
// Activations [T, K]: one scale per token (row), from the token's absmax. Same bytes as fp8_quantize_weight.
Fp8Matrix fp8_quantize_per_token(std::span<const float> x, int64_t tokens, int64_t cols, const std::string& what);
// Activations [T, K]: one scale per token per 128 consecutive channels. K must be a multiple of 128.
Fp8Matrix fp8_quantize_per_token_block(std::span<const float> x, int64_t tokens, int64_t cols,
                                       const std::string& what);

// fp32 [rows, cols]: decode(code) * scale.
std::vector<float> fp8_dequantize(const Fp8Matrix& q);

}  // namespace futransformer::formats
