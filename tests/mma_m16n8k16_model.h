// CPU model of mma.m16n8k16 (.bf16) register fragments, written from the PTX ISA ("Matrix Fragments for
// mma.m16n8k16"), independently of the kernels' layout headers: the emulation tests check the kernels' index maps
// against it.
#pragma once

#include <array>
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

// Every lane's registers of one mma: A (4 per lane), B (2), C / D (4 fp32).
using Acc = std::array<std::array<float, 4>, 32>;
using AFrag = std::array<std::array<uint32_t, 4>, 32>;
using BFrag = std::array<std::array<uint32_t, 2>, 32>;

// mma.m16n8k16 bf16 -> fp32: d += A·B through the PTX fragment tables (each dot product of 16 exact products summed in
// double, rounded once to float, then added to the accumulator).
inline void mma(Acc& d, const AFrag& a, const BFrag& b) {
  float A[16][16] = {}, B[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 4; ++r) {
        const RC rc = ptx_a(lane, r, h);
        A[rc.r][rc.c] = h ? hi_f(a[lane][r]) : lo_f(a[lane][r]);
      }
      for (int r = 0; r < 2; ++r) {
        const RC kn = ptx_b(lane, r, h);
        B[kn.r][kn.c] = h ? hi_f(b[lane][r]) : lo_f(b[lane][r]);
      }
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const RC rc = ptx_c(lane, i);
      double s = 0.0;
      for (int k = 0; k < 16; ++k) s += static_cast<double>(A[rc.r][k]) * B[k][rc.c];
      d[lane][i] += static_cast<float>(s);
    }
  }
}

}  // namespace futransformer::test::mma
