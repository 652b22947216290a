// formats/int4.h's quantiser rule on the device, bit for bit: group range with 0 always on the grid, scale rounded
// to the scale type (RNE, as f32_to_f16 / f32_to_bf16), unit scale for a zero or underflowed scale, zero-point and
// nibble by round-half-to-even of an IEEE division. Every operation is an explicit _rn intrinsic so that nvcc's FMA
// contraction cannot fuse the dequantise-multiply into the subtraction after it (the CPU rounds both).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace futransformer::cuda::int4_device {

constexpr float kLevels = 15.0f;  // 16 levels, 15 steps
constexpr int kSymmetricZero = 8;

struct Params {
  float scale;
  int zero;
  uint16_t bits;
};

// std::min(lo, x) / std::max(hi, x) exactly: the running value is kept unless x compares strictly beyond it, so a
// -0.0 input never replaces the +0.0 start (min/max of the CPU, same result in any merge order).
__device__ __forceinline__ float range_lo(float lo, float x) { return x < lo ? x : lo; }
__device__ __forceinline__ float range_hi(float hi, float x) { return hi < x ? x : hi; }

__device__ __forceinline__ uint16_t to_scale_bits(float s, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(s)) : __half_as_ushort(__float2half_rn(s));
}
__device__ __forceinline__ float from_scale_bits(uint16_t b, bool bf16) {
  return bf16 ? __uint_as_float(static_cast<uint32_t>(b) << 16) : __half2float(__ushort_as_half(b));
}

// Group parameters from the group's range [lo, hi] (lo <= 0 <= hi). Returns false when the scale overflows the
// scale type (int4_group_params throws then).
__device__ __forceinline__ bool params_from_range(float lo, float hi, bool symmetric, bool bf16, Params& p) {
  float s;
  if (symmetric) {
    const float amax = -lo < hi ? hi : -lo;  // std::max(-lo, hi)
    s = __fdiv_rn(__fmul_rn(amax, 2.0f), kLevels);
  } else {
    s = __fdiv_rn(__fsub_rn(hi, lo), kLevels);
  }
  p.bits = to_scale_bits(s, bf16);
  p.scale = from_scale_bits(p.bits, bf16);
  if (!isfinite(p.scale)) return false;
  if (!(p.scale > 0.0f)) {
    p.bits = to_scale_bits(1.0f, bf16);
    p.scale = 1.0f;
  }
  if (symmetric) {
    p.zero = kSymmetricZero;
  } else {
    const float z = rintf(__fdiv_rn(-lo, p.scale));
    p.zero = static_cast<int>(z < 0.0f ? 0.0f : (kLevels < z ? kLevels : z));  // std::clamp(z, 0, 15)
  }
  return true;
}

__device__ __forceinline__ Params params_from_bits(uint16_t bits, int zero, bool bf16) {
  return Params{from_scale_bits(bits, bf16), zero, bits};
}

__device__ __forceinline__ uint8_t quantize_value(float x, const Params& p) {
  const float q = __fadd_rn(rintf(__fdiv_rn(x, p.scale)), static_cast<float>(p.zero));
  return static_cast<uint8_t>(q < 0.0f ? 0.0f : (kLevels < q ? kLevels : q));
}

__device__ __forceinline__ float dequantize_value(uint8_t u, const Params& p) {
  return __fmul_rn(static_cast<float>(static_cast<int>(u) - p.zero), p.scale);
}

}  // namespace futransformer::cuda::int4_device
