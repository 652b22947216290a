#include "io/gguf_dequant.h"

#include <cstring>

#include "futransformer/dtype.h"

namespace futransformer::gguf_detail {

namespace {

// Blocks are packed with no padding, so the f16 fields may be unaligned: read them bytewise.
float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

}  // namespace

void dequantize_q8_0(const uint8_t* src, float* dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += kQ8_0BlockBytes, dst += kBlockElems) {
    const float d = load_f16(src);
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kBlockElems; ++j) dst[j] = static_cast<float>(q[j]) * d;
  }
}

void dequantize_q4_0(const uint8_t* src, float* dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += kQ4_0BlockBytes, dst += kBlockElems) {
    const float d = load_f16(src);
    const uint8_t* q = src + 2;
    // Byte j holds element j in its low nibble and element j + 16 in its high nibble.
    for (int j = 0; j < kBlockElems / 2; ++j) {
      dst[j] = static_cast<float>((q[j] & 0x0F) - 8) * d;
      dst[j + kBlockElems / 2] = static_cast<float>((q[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const uint8_t* src, float* dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += kQ4_1BlockBytes, dst += kBlockElems) {
    const float d = load_f16(src);
    const float m = load_f16(src + 2);
    const uint8_t* q = src + 4;
    for (int j = 0; j < kBlockElems / 2; ++j) {
      dst[j] = static_cast<float>(q[j] & 0x0F) * d + m;
      dst[j + kBlockElems / 2] = static_cast<float>(q[j] >> 4) * d + m;
    }
  }
}

}  // namespace futransformer::gguf_detail
