// ggml block formats (32 elements per block along ne0) decoded to fp32; used by the GGUF loader.
#pragma once

#include <cstddef>
#include <cstdint>

namespace futransformer::gguf_detail {

constexpr int kBlockElems = 32;
constexpr size_t kQ8_0BlockBytes = 2 + 32;      // f16 d, 32 x int8 q
constexpr size_t kQ4_0BlockBytes = 2 + 16;      // f16 d, 32 nibbles
constexpr size_t kQ4_1BlockBytes = 2 + 2 + 16;  // f16 d, f16 m, 32 nibbles

// Each decodes n_blocks consecutive blocks from `src` into 32 * n_blocks floats at `dst`.
void dequantize_q8_0(const uint8_t* src, float* dst, size_t n_blocks);
void dequantize_q4_0(const uint8_t* src, float* dst, size_t n_blocks);
void dequantize_q4_1(const uint8_t* src, float* dst, size_t n_blocks);

}  // namespace futransformer::gguf_detail
