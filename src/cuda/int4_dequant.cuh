// Kernel of int4_dequant_bf16 (contract: include/futransformer/cuda/int4_dequant.h; tile and index maps:
// src/cuda/int4_dequant_layout.h). Bandwidth bound: per 32 × 256 tile it reads 4 KB of packed nibbles and 256 B of
// scales and writes 16 KB of BF16, with one 16-byte load per lane and 16-byte stores of whole 512-byte row segments.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/int4_dequant_layout.h"

namespace futransformer::cuda::int4_dequant {

// One output value: (u − 8) · s is exact in fp32 (a 4-bit integer times an FP16 / BF16 significand has at most 14
// significant bits), so the BF16 conversion is the only rounding, as in the CPU twin. __fmul_rn keeps nvcc from
// contracting the product into anything else.
__device__ __forceinline__ float dequant_value(uint32_t u, float s) {
  return __fmul_rn(static_cast<float>(static_cast<int>(u) - 8), s);
}

__device__ __forceinline__ uint32_t pack_bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
  return *reinterpret_cast<const uint32_t*>(&p);
}

// FP16 or BF16 scale bits to fp32, exactly.
template <bool kBf16Scales>
__device__ __forceinline__ float scale_f32(uint16_t bits) {
  if constexpr (kBf16Scales)
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  else
    return __half2float(__ushort_as_half(bits));
}

// grid (ceil(K / 256), N / 32), kThreads threads. w_packed / out as 16-byte vectors.
template <bool kBf16Scales>
__global__ void __launch_bounds__(kThreads) int4_dequant_bf16_kernel(const uint4* __restrict__ w_packed,
                                                                     const uint16_t* __restrict__ scales,
                                                                     uint4* __restrict__ out, int N, int K, int group,
                                                                     bool to_canonical) {
  __shared__ __align__(16) uint32_t stage[kStageWords];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / w4a16::kWarpSize, lane = tid % w4a16::kWarpSize;
  const int64_t nb = blockIdx.y;
  const int k_blocks = K / w4a16::kBlockK;
  const int kb = static_cast<int>(blockIdx.x) * kTileBlocks + warp;
  if (kb < k_blocks) {
    // The packed words are read exactly once: the streaming (evict-first) load keeps them from displacing the BF16
    // output in L2, which the GEMM that follows reads.
    const uint4 v = __ldcs(w_packed + (nb * k_blocks + kb) * w4a16::kWarpSize + lane);
    const uint32_t words[w4a16::kWordsPerLane] = {v.x, v.y, v.z, v.w};
    // A 32-column block lies in one group (group >= 32); the lane's rows are 8 · tile + lane / 4.
    const int64_t groups = K / group, g = int64_t{kb} * w4a16::kBlockK / group;
    float s[w4a16::kTilesPerBlock];
#pragma unroll
    for (int tile = 0; tile < w4a16::kTilesPerBlock; ++tile)
      s[tile] = scale_f32<kBf16Scales>(scales[scale_index(nb, g, groups, tile * 8 + (lane >> 2))]);
#pragma unroll
    for (int w = 0; w < w4a16::kWordsPerLane; ++w) {
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float sc = s[slot_tile(w, p)];
        const uint32_t lo = (words[w] >> w4a16::nibble_shift(p, 0)) & 0xfu;
        const uint32_t hi = (words[w] >> w4a16::nibble_shift(p, 1)) & 0xfu;
        stage[stage_word(warp, lane, w, p)] = pack_bf16x2_rn(dequant_value(lo, sc), dequant_value(hi, sc));
      }
    }
  }
  __syncthreads();
  const int64_t col0 = int64_t{blockIdx.x} * kTileCols;
  const int64_t cols = K - col0 < kTileCols ? K - col0 : kTileCols;  // a multiple of 32: idle warps' columns skipped
#pragma unroll
  for (int i = 0; i < kTileChunks / kThreads; ++i) {
    const int c = i * kThreads + tid;
    const int r = chunk_row(c), col = chunk_col(c);
    if (col >= cols) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(stage + r * kPitchWords + col / 2);
    const int64_t orow = output_row(nb * kTileRows + r, N, to_canonical);
    out[(orow * K + col0 + col) / kChunkElems] = v;
  }
}

}  // namespace futransformer::cuda::int4_dequant
