// The normalised block Hadamard of formats/hadamard.h on a head spread over kLanes lanes of 16 channels each (lane s of
// the head holds channels 16 s .. 16 s + 15 in x[0..15]): strides 1..8 inside a lane's registers, strides 16 ..
// 8 kLanes by shfl.xor between lanes (the lane with bit m of s clear holds the pair's first element a, its partner b:
// a + b there, a − b here), stage by stage in the CPU's ascending order, then the one multiply by `scale`. The CPU's
// operations on every pair, so its bits. Shared by rotate_heads_bf16's vector kernel and unrotate_rows_fp8. Every lane
// of the warp must call it (the shuffles use the full mask); lanes with no head hold zeros.
#pragma once

namespace futransformer::cuda::hadamard {

constexpr int kLaneChannels = 16;

template <int kLanes>
__device__ __forceinline__ void blocks_over_lanes(float (&x)[kLaneChannels], int s, int block, float scale) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes per head: 1, 2, 4 .. 32");
  if (block <= 1) return;
#pragma unroll
  for (int h = 1; h < kLaneChannels; h *= 2) {  // compile-time strides: register indices stay static
    if (h < block) {
#pragma unroll
      for (int j = 0; j < kLaneChannels; ++j) {
        if ((j & h) == 0) {
          const float a = x[j], b = x[j + h];
          x[j] = __fadd_rn(a, b);
          x[j + h] = __fsub_rn(a, b);
        }
      }
    }
  }
#pragma unroll
  for (int m = 1; m < kLanes; m *= 2) {
    if (kLaneChannels * m < block) {
#pragma unroll
      for (int j = 0; j < kLaneChannels; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, x[j], m);
        x[j] = (s & m) ? __fsub_rn(other, x[j]) : __fadd_rn(x[j], other);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kLaneChannels; ++j) x[j] = __fmul_rn(x[j], scale);
}

}  // namespace futransformer::cuda::hadamard
