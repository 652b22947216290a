// Integer bit-manipulation wrappers (any sm).
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// lop3.b32: any 3-input boolean function, `lut` being its truth table over a = 0xf0, b = 0xcc, c = 0xaa
// (e.g. (a & b) | c is lut 0xea); one instruction where the compiler might emit two.
template <int lut>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c), "n"(lut));
  return r;
}

// prmt.b32: byte i of the result is byte (selector nibble i) of the 8-byte value {b, a} (a = bytes 0..3).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

}  // namespace futransformer::cuda::ptx
