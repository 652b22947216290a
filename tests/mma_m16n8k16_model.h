// CPU model of mma.m16n8k16 (.bf16) register fragments, written from the PTX ISA ("Matrix Fragments for
// mma.m16n8k16"), independently of the kernels' layout headers: the emulation tests check the kernels' index maps
// against it.
#pragma once

#include <cstdint>

#include "futransformer/dtype.h"

namespace futransformer::test::mma {

struct RC {
  int r, c;
};
// (row, col) of A register `reg` (0..3), half `half` (0 = low bf16) of `lane`.
inline RC ptx_a(int lane, int reg, int half) { return {lane / 4 + 8 * (reg % 2), 2 * (lane % 4) + half + 8 * (reg / 2)}; }
// (k, n) of B register `reg` (0..1), half `half` of `lane`.
inline RC ptx_b(int lane, int reg, int half) { return {2 * (lane % 4) + half + 8 * reg, lane / 4}; }
// (row, col) of accumulator `i` (0..3) of `lane`.
inline RC ptx_c(int lane, int i) { return {lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2}; }

inline float lo_f(uint32_t v) { return bf16_to_f32(static_cast<uint16_t>(v & 0xffff)); }
inline float hi_f(uint32_t v) { return bf16_to_f32(static_cast<uint16_t>(v >> 16)); }
inline uint32_t pack_bf16x2(float lo, float hi) {
  return f32_to_bf16(lo) | (static_cast<uint32_t>(f32_to_bf16(hi)) << 16);
}

}  // namespace futransformer::test::mma
