// Element types of tensors as they are stored in checkpoints, and scalar conversions to/from fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace futransformer {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  I8,
  I32,
  U8,   // raw bytes (packed formats such as INT4 nibbles, FP8 codes)
};

// Bytes per element of a plain (non-block) dtype.
size_t dtype_size(DType t);
const char* dtype_name(DType t);

// IEEE binary16 <-> fp32 (round to nearest even, handles subnormals, inf, nan).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// bfloat16 <-> fp32. f32_to_bf16 rounds to nearest even; NaN stays NaN.
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f);

}  // namespace futransformer
