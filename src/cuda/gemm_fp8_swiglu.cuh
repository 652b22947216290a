// The gate|up FP8 GEMM with SwiGLU and per-token-per-128-channel FP8 quantisation in its epilogue (sm_90a):
//   g, u   = bf16((A · B_gate^T)[m][c] · a_scale[m] · b_scale[gate c]),  the same for up   (gemm_fp8's D values)
//   y      = silu(g) · u                                                    (decoder_ops' silu_mul)
//   codes, scales = formats::fp8_quantize_per_token_block(y)                (fp8_block_quant.cuh)
// Geometry and the packed weight order: gemm_fp8_swiglu_layout.h. The pipeline is gemm_fp8.cuh's (a producer
// warpgroup issuing TMA into a ring with full/empty mbarriers, a scale-loader warp, two consumer warpgroups running
// wgmma with an fp32 promotion every 128-deep K block, a persistent grouped tile order); the tile shape differs, and
// the epilogue is split: the consumers only round g and u to BF16 into a shared staging tile (staging_full /
// staging_empty mbarriers hand it over), and a fourth warpgroup does SwiGLU and the quantisation while the consumers
// run the next tile's main loop — the SwiGLU arithmetic (accurate expf, IEEE divisions) overlaps the tensor cores
// instead of following them. Each g / u is computed with gemm_fp8's epilogue expression and y with
// swiglu_fp8_block's, so the codes and scales equal gemm_fp8 (canonical weight) followed by swiglu_fp8_block, bit for
// bit.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/fp8_block_quant.cuh"
#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_fp8_pipeline.cuh"
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

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
  return *reinterpret_cast<const uint32_t*>(&v);
}

__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_swiglu_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                           const KernelParams p) {
  // gemm_fp8's pipeline pieces (this tile's own constants and layout are fp8sw's, found first).
  using fp8::acc_col, fp8::acc_row, fp8::advance, fp8::kBlockK, fp8::kScaleLoaderWarp, fp8::kSwizzleAtom,
      fp8::kSwizzleBytes, fp8::PipeState, fp8::tile_coord, fp8::TileCoord;
  constexpr SmemLayout L = smem_layout();
  static_assert(L.a_stage_bytes % kSwizzleAtom == 0 && L.b_stage_bytes % kSwizzleAtom == 0,
                "every swizzled stage must start on a 1024-byte boundary");
  static_assert((kHalfN * kSwizzleBytes) % kSwizzleAtom == 0, "a warpgroup's half of B starts on a swizzle atom");
  static_assert(L.alloc_bytes <= 227 * 1024, "shared memory exceeds the 227 KB a CTA may opt in to");
  static_assert(kEpilogueChannelsPerLane == 32 && kEpiloguePasses == 2, "the epilogue's lane map below");
  using Mma = ptx::WgmmaE4m3<kHalfN>;
  constexpr int kAccRegs = Mma::kRegs;  // 64: 16 chunks of 8 columns x {row lo, row hi} x {col c, c + 1}
  constexpr int kGateChunks = kChannelsPerHalf / 8;  // chunks j < 8 are gate columns, j + 8 the matching up columns

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = fp8::swizzle_aligned_base(smem_raw);
  const fp8::PipelineBarriers bars = fp8::pipeline_barriers(base + L.bar_offset, kStages);
  const uint32_t staging_full = bars.scale_empty + 8u, staging_empty = staging_full + 8u;
  const uint32_t scales = base + L.scale_offset;
  const uint32_t g_stage = base + L.g_offset, u_stage = base + L.u_offset;

  const int wg = fp8::warpgroup_index();  // warp-uniform for the compiler
  const int num_tiles = p.m_blocks * p.n_blocks;
  const int k_blocks = (p.K + kBlockK - 1) / kBlockK;

  const fp8::TileWalk walk{p.m_blocks, p.n_blocks, p.group_m, k_blocks};
  if (threadIdx.x == 0) {
    ptx::prefetch_tensormap(&tma_a);
    ptx::prefetch_tensormap(&tma_b);
    fp8::init_pipeline_barriers(bars, kStages, kEmptyArrivals, kScaleEmptyArrivals);
    ptx::mbarrier_init(staging_full, kStagingFullArrivals);
    ptx::mbarrier_init(staging_empty, kStagingEmptyArrivals);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  fp8::pdl_wait_then_release();  // under programmatic launch: the previous kernel's writes are visible from here

  if (wg == 0) {
    // ---------------- producer (gemm_fp8's roles: TMA into the ring, the scale slot) ----------------
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      fp8::produce_stages<kStages>(&tma_a, &tma_b, bars, walk, base + L.a_offset, L.a_stage_bytes, kBlockM,
                                   base + L.b_offset, L.b_stage_bytes, kBlockN, stage_tx_bytes());
    } else if (threadIdx.x / 32 == kScaleLoaderWarp) {
      // 2 inter is a multiple of kBlockN: the column guard never bites.
      fp8::load_tile_scales(bars, walk, scales, p.a_scale, p.b_scale, p.M, 2 * p.inter, kBlockM, kBlockN, false,
                            threadIdx.x % 32);
    }
    return;
  }

  if (wg == kEpilogueWarpgroup) {
    // ---------------- epilogue: staged g, u → y → one FP8 block of 128 channels per token row ----------------
    // A quad of lanes per row, 32 channels per lane: rows 32 pass + 8 warp + lane / 4.
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int quarter = lane & 3;
    const int c0 = quarter * kEpilogueChannelsPerLane;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
      ptx::mbarrier_wait_parity(staging_full, phase);
      // Both passes' g and u into registers (16 + 16 words per pass), then the staging tile is free again.
      uint32_t gw[kEpiloguePasses][16], uw[kEpiloguePasses][16];
#pragma unroll
      for (int ps = 0; ps < kEpiloguePasses; ++ps) {
        const int r = 32 * ps + 8 * warp + lane / 4;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const uint4 g4 = ptx::ld_shared_v4_b32(g_stage + staging_offset(r, c0 + 8 * v));
          const uint4 u4 = ptx::ld_shared_v4_b32(u_stage + staging_offset(r, c0 + 8 * v));
          gw[ps][4 * v] = g4.x, gw[ps][4 * v + 1] = g4.y, gw[ps][4 * v + 2] = g4.z, gw[ps][4 * v + 3] = g4.w;
          uw[ps][4 * v] = u4.x, uw[ps][4 * v + 1] = u4.y, uw[ps][4 * v + 2] = u4.z, uw[ps][4 * v + 3] = u4.w;
        }
      }
      ptx::mbarrier_arrive(staging_empty);  // release: this thread's loads happen before the next tile's stores
      phase ^= 1u;
#pragma unroll
      for (int ps = 0; ps < kEpiloguePasses; ++ps) {
        const int row = tc.m_block * kBlockM + 32 * ps + 8 * warp + lane / 4;
        float y[kEpilogueChannelsPerLane];
        float amax = 0.0f;
        bool finite = true;
#pragma unroll
        for (int k = 0; k < 16; ++k) {
          const __nv_bfloat162 g2 = *reinterpret_cast<const __nv_bfloat162*>(&gw[ps][k]);
          const __nv_bfloat162 u2 = *reinterpret_cast<const __nv_bfloat162*>(&uw[ps][k]);
          y[2 * k] = ops::silu_mul(__low2float(g2), __low2float(u2));
          y[2 * k + 1] = ops::silu_mul(__high2float(g2), __high2float(u2));
          finite = finite && isfinite(y[2 * k]) && isfinite(y[2 * k + 1]);
          amax = fmaxf(amax, fmaxf(fabsf(y[2 * k]), fabsf(y[2 * k + 1])));
        }
        // The quad's four lanes hold the row's 128 channels.
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
          finite = __shfl_xor_sync(0xffffffffu, finite ? 1 : 0, off) != 0 && finite;
        }
        const float s = fp8blk::block_scale(amax, finite);
        if (row < p.M) {
          uint32_t w[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            w[k] = static_cast<uint32_t>(fp8blk::codes_x2(y[4 * k], y[4 * k + 1], s)) |
                   (static_cast<uint32_t>(fp8blk::codes_x2(y[4 * k + 2], y[4 * k + 3], s)) << 16);
          }
          uint4* dst = reinterpret_cast<uint4*>(p.codes + static_cast<int64_t>(row) * p.inter +
                                                tc.n_block * kChannelsPerTile + c0);
          dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
          dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
          if (quarter == 0) p.y_scales[static_cast<int64_t>(row) * (p.inter / kChannelsPerTile) + tc.n_block] = s;
        }
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
  uint32_t scale_phase = 0, staging_phase = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    fp8::mainloop_per_token<Mma, kStages>(acc, sum, pipe, bars, k_blocks, base + L.a_offset, L.a_stage_bytes, 0u,
                                          base + L.b_offset, L.b_stage_bytes,
                                          static_cast<uint32_t>(half * kHalfN * kSwizzleBytes), lane);

    // ---------------- consumer epilogue: g, u rounded to BF16 into the staging tile ----------------
    const int r_lo = acc_row(warp, lane, 0), r_hi = acc_row(warp, lane, 2);
    ptx::mbarrier_wait_parity(bars.scale_full, scale_phase);
    const float sa_lo = ptx::ld_shared_f32(scales + 4u * r_lo);  // 0 past M
    const float sa_hi = ptx::ld_shared_f32(scales + 4u * r_hi);
    // gemm_fp8's store expression, bf16((sum · a_scale) · b_scale), two values per word (sum is dead afterwards).
    uint32_t words[kAccRegs / 2];
#pragma unroll
    for (int j = 0; j < 2 * kGateChunks; ++j) {
      const float2 sb = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + half * kHalfN + acc_col(lane, 4 * j)));
      const uint32_t lo = pack_bf16x2(sum[4 * j] * sa_lo * sb.x, sum[4 * j + 1] * sa_lo * sb.y);
      const uint32_t hi = pack_bf16x2(sum[4 * j + 2] * sa_hi * sb.x, sum[4 * j + 3] * sa_hi * sb.y);
      words[2 * j] = lo;
      words[2 * j + 1] = hi;
    }
    // Every scale of the slot has been read by this thread: its arrival frees the slot for the next tile.
    ptx::mbarrier_arrive(bars.scale_empty);
    scale_phase ^= 1u;
    // The epilogue warpgroup has loaded the previous tile's staging (the first wait returns at once).
    ptx::mbarrier_wait_parity(staging_empty, staging_phase ^ 1u);
#pragma unroll
    for (int j = 0; j < kGateChunks; ++j) {
      const int ch = half * kChannelsPerHalf + acc_col(lane, 4 * j);  // channel pair ch, ch + 1 of the tile
      ptx::st_shared_b32(g_stage + staging_offset(r_lo, ch), words[2 * j]);
      ptx::st_shared_b32(g_stage + staging_offset(r_hi, ch), words[2 * j + 1]);
      ptx::st_shared_b32(u_stage + staging_offset(r_lo, ch), words[2 * (j + kGateChunks)]);
      ptx::st_shared_b32(u_stage + staging_offset(r_hi, ch), words[2 * (j + kGateChunks) + 1]);
    }
    ptx::mbarrier_arrive(staging_full);  // release: this thread's stores happen before the epilogue's loads
    staging_phase ^= 1u;
  }
}

}  // namespace futransformer::cuda::fp8sw
