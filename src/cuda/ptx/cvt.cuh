// Conversion wrappers (sm_89+ for the FP8 ones).
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// cvt.rn.satfinite.e4m3x2.f32: two fp32 values to E4M3 codes, round to nearest even, |x| beyond 448 (and inf)
// saturated to ±448, NaN to 0x7F, the sign of a value that rounds to zero kept: formats::fp8_e4m3_encode's rule.
// PTX puts its first source in the upper byte; this wrapper takes the bytes in memory order (lo = byte 0).
__device__ __forceinline__ uint16_t cvt_rn_satfinite_e4m3x2_f32(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

}  // namespace futransformer::cuda::ptx
