// The gate|up FP8 GEMM with SwiGLU and per-token-per-128-channel FP8 quantisation in its epilogue (sm_90a):
//   g, u   = bf16((A · B_gate^T)[m][c] · a_scale[m] · b_scale[gate c]),  the same for up   (gemm_fp8's D values)
//   y      = silu(g) · u                                                    (decoder_ops' silu_mul)
//   codes, scales = formats::fp8_quantize_per_token_block(y)                (fp8_block_quant.cuh)
// Geometry and the packed weight order: gemm_fp8_swiglu_layout.h. The pipeline is gemm_fp8.cuh's (a producer
// warpgroup issuing TMA into a ring with full/empty mbarriers, a scale-loader warp, two consumer warpgroups running
// wgmma with an fp32 promotion every 128-deep K block, a persistent grouped tile order); only the tile shape and
// the epilogue differ. Each g / u is computed with gemm_fp8's epilogue expression and y with swiglu_fp8_block's, so
// the codes and scales equal gemm_fp8 (canonical weight) followed by swiglu_fp8_block, bit for bit.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/fp8_block_quant.cuh"
#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_fp8_swiglu_layout.h"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace futransformer::cuda::fp8sw {

struct KernelParams {
  const float* a_scale;  // [M] per token
  const float* b_scale;  // [2 inter] in packed row order
  uint8_t* codes;        // [M, inter] E4M3
  float* y_scales;       // [M, inter / 128]
  int M, inter, K;
  int m_blocks, n_blocks, group_m;
};

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_swiglu_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                           const KernelParams p) {
  // gemm_fp8's pipeline pieces (this tile's own constants and layout are fp8sw's, found first).
  using fp8::acc_col, fp8::acc_row, fp8::a_desc_addr, fp8::advance, fp8::b_desc_addr, fp8::kBlockK, fp8::kKSteps,
      fp8::kConsumerRegs, fp8::kProducerRegs, fp8::kScaleLoaderWarp, fp8::kSwizzleAtom, fp8::kSwizzleBytes,
      fp8::make_smem_desc, fp8::PipeState, fp8::tile_coord, fp8::TileCoord;
  constexpr SmemLayout L = smem_layout();
  static_assert(L.a_stage_bytes % kSwizzleAtom == 0 && L.b_stage_bytes % kSwizzleAtom == 0,
                "every swizzled stage must start on a 1024-byte boundary");
  static_assert((kHalfN * kSwizzleBytes) % kSwizzleAtom == 0, "a warpgroup's half of B starts on a swizzle atom");
  static_assert(L.alloc_bytes <= 227 * 1024, "shared memory exceeds the 227 KB a CTA may opt in to");
  using Mma = ptx::WgmmaE4m3<kHalfN>;
  constexpr int kAccRegs = Mma::kRegs;  // 64: 16 chunks of 8 columns x {row lo, row hi} x {col c, c + 1}
  constexpr int kGateChunks = kChannelsPerHalf / 8;  // chunks j < 8 are gate columns, j + 8 the matching up columns

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t base = (raw + (kSwizzleAtom - 1)) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  const uint32_t full_bar = base + L.bar_offset;
  const uint32_t empty_bar = full_bar + 8u * kStages;
  const uint32_t scale_full = full_bar + 16u * kStages, scale_empty = scale_full + 8u;
  const uint32_t scales = base + L.scale_offset;
  const uint32_t exchange = base + L.exchange_offset;

  const int wg = threadIdx.x / 128;
  const int num_tiles = p.m_blocks * p.n_blocks;
  const int k_blocks = (p.K + kBlockK - 1) / kBlockK;

  if (threadIdx.x == 0) {
    ptx::prefetch_tensormap(&tma_a);
    ptx::prefetch_tensormap(&tma_b);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(full_bar + 8u * s, 1);
      ptx::mbarrier_init(empty_bar + 8u * s, kEmptyArrivals);
    }
    ptx::mbarrier_init(scale_full, 32);
    ptx::mbarrier_init(scale_empty, kScaleEmptyArrivals);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      PipeState pipe;
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
        for (int kb = 0; kb < k_blocks; ++kb) {
          ptx::mbarrier_wait_parity(empty_bar + 8u * pipe.stage, pipe.phase ^ 1u);
          const uint32_t full = full_bar + 8u * pipe.stage;
          ptx::mbarrier_arrive_expect_tx(full, stage_tx_bytes());
          ptx::tma_load_2d(base + L.a_offset + pipe.stage * L.a_stage_bytes, &tma_a, kb * kBlockK,
                           tc.m_block * kBlockM, full);
          ptx::tma_load_2d(base + L.b_offset + pipe.stage * L.b_stage_bytes, &tma_b, kb * kBlockK,
                           tc.n_block * kBlockN, full);
          advance(pipe, kStages);
        }
      }
    } else if (threadIdx.x / 32 == kScaleLoaderWarp) {
      const int lane = threadIdx.x % 32;
      uint32_t phase = 0;
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
        ptx::mbarrier_wait_parity(scale_empty, phase ^ 1u);
        for (int i = lane; i < kBlockM; i += 32) {
          const int m = tc.m_block * kBlockM + i;
          ptx::st_shared_f32(scales + 4u * i, m < p.M ? __ldg(p.a_scale + m) : 0.0f);
        }
        for (int i = lane; i < kBlockN; i += 32)  // 2 inter is a multiple of kBlockN: no column tail
          ptx::st_shared_f32(scales + 4u * (kBlockM + i), __ldg(p.b_scale + tc.n_block * kBlockN + i));
        ptx::mbarrier_arrive(scale_full);  // release: this lane's stores happen before the consumers' reads
        phase ^= 1u;
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int half = wg - 1;  // packed rows 128 half .. 128 half + 127 of the tile: channels 64 half .. 64 half + 63
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;

  float acc[kAccRegs];
  float sum[kAccRegs];
  PipeState pipe;
  uint32_t scale_phase = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) sum[i] = 0.0f;

    for (int kb = 0; kb < k_blocks; ++kb) {
      ptx::mbarrier_wait_parity(full_bar + 8u * pipe.stage, pipe.phase);
      const uint32_t a_addr = base + L.a_offset + pipe.stage * L.a_stage_bytes;
      const uint32_t b_addr = base + L.b_offset + pipe.stage * L.b_stage_bytes + half * kHalfN * kSwizzleBytes;
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i) ptx::fence_operand(acc[i]);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        Mma::mma(acc, make_smem_desc(a_desc_addr(a_addr, 0, ks)), make_smem_desc(b_desc_addr(b_addr, ks)), ks > 0);
      }
      ptx::wgmma_commit_group();
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i) ptx::fence_operand(acc[i]);
      ptx::wgmma_wait_group<0>();
      if (lane == 0) ptx::mbarrier_arrive(empty_bar + 8u * pipe.stage);
      advance(pipe, kStages);
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i) sum[i] += acc[i];
    }

    // ---------------- epilogue: g, u → y → one FP8 block of 128 channels per token row ----------------
    const int r_lo = acc_row(warp, lane, 0), r_hi = acc_row(warp, lane, 2);
    ptx::mbarrier_wait_parity(scale_full, scale_phase);
    const float sa_lo = ptx::ld_shared_f32(scales + 4u * r_lo);  // 0 past M
    const float sa_hi = ptx::ld_shared_f32(scales + 4u * r_hi);
    // y overwrites the gate registers: sum[4 j + e] for chunk j < 8 (e: 0/1 row lo, 2/3 row hi; columns c, c + 1).
    float amax_lo = 0.0f, amax_hi = 0.0f;
    bool finite_lo = true, finite_hi = true;
#pragma unroll
    for (int j = 0; j < kGateChunks; ++j) {
      const int c = acc_col(lane, 4 * j);  // gate column in this half; its up column is c + 64
      const float2 sg = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + half * kHalfN + c));
      const float2 su = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + half * kHalfN + kChannelsPerHalf + c));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float sa = (e & 2) ? sa_hi : sa_lo;
        const float g = bf16_round(sum[4 * j + e] * sa * ((e & 1) ? sg.y : sg.x));
        const float u = bf16_round(sum[4 * (j + kGateChunks) + e] * sa * ((e & 1) ? su.y : su.x));
        const float y = ops::silu_mul(g, u);
        sum[4 * j + e] = y;
        if (e & 2) {
          finite_hi = finite_hi && isfinite(y);
          amax_hi = fmaxf(amax_hi, fabsf(y));
        } else {
          finite_lo = finite_lo && isfinite(y);
          amax_lo = fmaxf(amax_lo, fabsf(y));
        }
      }
    }
    // Every scale of the slot has been read by this thread: its arrival frees the slot for the next tile.
    ptx::mbarrier_arrive(scale_empty);
    scale_phase ^= 1u;
    // The four lanes of a quad hold the same two rows: their 16 channels each make the half's 64.
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      amax_lo = fmaxf(amax_lo, __shfl_xor_sync(0xffffffffu, amax_lo, off));
      amax_hi = fmaxf(amax_hi, __shfl_xor_sync(0xffffffffu, amax_hi, off));
      finite_lo = __shfl_xor_sync(0xffffffffu, finite_lo ? 1 : 0, off) != 0 && finite_lo;
      finite_hi = __shfl_xor_sync(0xffffffffu, finite_hi ? 1 : 0, off) != 0 && finite_hi;
    }
    // The other half's 64 channels of the same rows, through shared memory: -1 marks a half holding a non-finite y
    // (amax itself is >= 0, and fmaxf would drop a NaN).
    if ((lane & 3) == 0) {
      ptx::st_shared_f32(exchange + 4u * (half * kBlockM + r_lo), finite_lo ? amax_lo : -1.0f);
      ptx::st_shared_f32(exchange + 4u * (half * kBlockM + r_hi), finite_hi ? amax_hi : -1.0f);
    }
    ptx::bar_sync(kEpilogueBarrier, 128 * kConsumerWarpgroups);
    const float other_lo = ptx::ld_shared_f32(exchange + 4u * ((1 - half) * kBlockM + r_lo));
    const float other_hi = ptx::ld_shared_f32(exchange + 4u * ((1 - half) * kBlockM + r_hi));
    // Both halves have read the exchange before either writes the next tile's.
    ptx::bar_sync(kEpilogueBarrier, 128 * kConsumerWarpgroups);
    const float s_lo = fp8blk::block_scale(fmaxf(amax_lo, other_lo), finite_lo && other_lo >= 0.0f);
    const float s_hi = fp8blk::block_scale(fmaxf(amax_hi, other_hi), finite_hi && other_hi >= 0.0f);

    const int row_lo = tc.m_block * kBlockM + r_lo, row_hi = tc.m_block * kBlockM + r_hi;
    const int ch0 = tc.n_block * kChannelsPerTile + half * kChannelsPerHalf;  // this half's first channel
    // A quad writes 8 consecutive codes of a row per chunk (2 per lane): 16-bit stores, which L2 merges.
#pragma unroll
    for (int j = 0; j < kGateChunks; ++j) {
      const int ch = ch0 + acc_col(lane, 4 * j);
      if (row_lo < p.M) {
        *reinterpret_cast<uint16_t*>(p.codes + static_cast<int64_t>(row_lo) * p.inter + ch) =
            fp8blk::codes_x2(sum[4 * j], sum[4 * j + 1], s_lo);
      }
      if (row_hi < p.M) {
        *reinterpret_cast<uint16_t*>(p.codes + static_cast<int64_t>(row_hi) * p.inter + ch) =
            fp8blk::codes_x2(sum[4 * j + 2], sum[4 * j + 3], s_hi);
      }
    }
    if (half == 0 && (lane & 3) == 0) {
      const int blocks = p.inter / kChannelsPerTile;
      if (row_lo < p.M) p.y_scales[static_cast<int64_t>(row_lo) * blocks + tc.n_block] = s_lo;
      if (row_hi < p.M) p.y_scales[static_cast<int64_t>(row_hi) * blocks + tc.n_block] = s_hi;
    }
  }
}

}  // namespace futransformer::cuda::fp8sw
