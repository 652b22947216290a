// gemm_fp8_residual with a warp-specialised epilogue (sm_90a), for 128-column tiles:
//   residual[m][n] += float(bf16((A · B^T)[m][n] · a_scale[m] · b_scale[n]))
// gemm_fp8_kernel<128, ·, kResidual> reads and writes the tile's fp32 residual (64 KB each way) in its consumers right
// after the main loop, and nothing overlaps that traffic (o projection at 8B / 2048 tokens: 64 µs GEMM + 19 µs of
// epilogue). Here the consumers only round their outputs to BF16 into a shared staging tile (gemm_fp8's store
// expression) and start the next tile; a fourth warpgroup adds the staged tile into the residual stream while the
// tensor cores run that next main loop. Producer, scale loader, consumers' main loop and tile order are
// gemm_fp8_kernel's (gemm_fp8_layout.h); the add is add_residual_bf16's, so the result is bit for bit the BF16 store
// followed by add_residual_bf16, as gemm_fp8_residual's.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/gemm_fp8.cuh"
#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_fp8_pipeline.cuh"
#include "cuda/gemm_fp8_residual_ws_layout.h"

namespace futransformer::cuda::fp8rw {

// kOverlap: the consumers run mainloop_per_token_overlapped (same bits) with kConsumerRegsOverlap registers, taken
// from the epilogue warpgroup (kEpilogueRegsOverlap, kRowsPerBatchOverlap rows in flight per warp).
template <bool kOverlap = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_residual_ws_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                const fp8::KernelParams p) {
  using fp8::acc_col, fp8::acc_row, fp8::advance, fp8::kBlockK, fp8::kBlockM, fp8::kScaleLoaderWarp,
      fp8::kSwizzleAtom, fp8::kWgmmaM, fp8::pack_bf16x2, fp8::PipeState, fp8::tile_coord, fp8::TileCoord;
  constexpr SmemLayout L = smem_layout();
  static_assert(L.a_stage_bytes % kSwizzleAtom == 0 && L.b_stage_bytes % kSwizzleAtom == 0,
                "every swizzled stage must start on a 1024-byte boundary");
  static_assert(L.alloc_bytes <= 227 * 1024, "shared memory exceeds the 227 KB a CTA may opt in to");
  using Mma = ptx::WgmmaE4m3<kBlockN>;
  constexpr int kAccRegs = Mma::kRegs;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = fp8::swizzle_aligned_base(smem_raw);
  const fp8::PipelineBarriers bars = fp8::pipeline_barriers(base + L.bar_offset, kStages);
  const uint32_t staging_full = bars.scale_empty + 8u, staging_empty = staging_full + 8u;
  const uint32_t scales = base + L.scale_offset;
  const uint32_t staging = base + L.staging_offset;

  const int wg = fp8::warpgroup_index();  // warp-uniform for the compiler
  const int num_tiles = p.m_blocks * p.n_blocks;
  const int k_blocks = (p.K + kBlockK - 1) / kBlockK;

  const fp8::TileWalk walk{p.m_blocks, p.n_blocks, p.group_m, k_blocks};
  if (threadIdx.x == 0) {
    ptx::prefetch_tensormap(&tma_a);
    ptx::prefetch_tensormap(&tma_b);
    fp8::init_pipeline_barriers(bars, kStages, fp8::kEmptyArrivals, fp8::kScaleEmptyArrivals);
    ptx::mbarrier_init(staging_full, kStagingFullArrivals);
    ptx::mbarrier_init(staging_empty, kStagingEmptyArrivals);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  fp8::pdl_wait_then_release();  // under programmatic launch: the previous kernel's writes are visible from here

  if (wg == 0) {
    // ---------------- producer (gemm_fp8's roles) ----------------
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      fp8::produce_stages<kStages>(&tma_a, &tma_b, bars, walk, base + L.a_offset, L.a_stage_bytes, kBlockM,
                                   base + L.b_offset, L.b_stage_bytes, kBlockN, fp8::stage_tx_bytes(kBlockN));
    } else if (threadIdx.x / 32 == kScaleLoaderWarp) {
      fp8::load_tile_scales(bars, walk, scales, p.a_scale, p.b_scale, p.M, p.N, kBlockM, kBlockN, false,
                            threadIdx.x % 32);
    }
    return;
  }

  if (wg == kEpilogueWarpgroup) {
    // ---------------- epilogue: residual += the staged BF16 tile ----------------
    // Warp w adds rows 32 w .. 32 w + 31; lane l columns 4 l .. 4 l + 3 (8 bytes of staging, 16 of residual; N is
    // a multiple of 8, so a column group starting below N ends below N).
    if constexpr (kOverlap) ptx::setmaxnreg_dec<kEpilogueRegsOverlap>();
    constexpr int kBatch = kOverlap ? kRowsPerBatchOverlap : kRowsPerBatch;
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
      const int col = tc.n_block * kBlockN + 4 * lane;
      ptx::mbarrier_wait_parity(staging_full, phase);
#pragma unroll 1
      for (int r0 = 32 * warp; r0 < 32 * warp + 32; r0 += kBatch) {
        float4 v[kBatch];
        uint2 d[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int row = tc.m_block * kBlockM + r0 + i;
          const uint32_t at = staging + 2u * static_cast<uint32_t>((r0 + i) * kStagingPitch + 4 * lane);
          d[i] = ptx::ld_shared_v2_b32(at);
          v[i] = row < p.M && col < p.N
                     ? *reinterpret_cast<const float4*>(p.residual + static_cast<int64_t>(row) * p.N + col)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int row = tc.m_block * kBlockM + r0 + i;
          if (row >= p.M || col >= p.N) continue;
          const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&d[i].x);
          const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&d[i].y);
          float4 o = v[i];
          o.x = __fadd_rn(o.x, __low2float(lo));
          o.y = __fadd_rn(o.y, __high2float(lo));
          o.z = __fadd_rn(o.z, __low2float(hi));
          o.w = __fadd_rn(o.w, __high2float(hi));
          *reinterpret_cast<float4*>(p.residual + static_cast<int64_t>(row) * p.N + col) = o;
        }
      }
      ptx::mbarrier_arrive(staging_empty);  // release: this thread's staging loads happen before the next stores
      phase ^= 1u;
    }
    return;
  }

  // ---------------- consumers (gemm_fp8_kernel's main loop) ----------------
  ptx::setmaxnreg_inc<kOverlap ? kConsumerRegsOverlap : kConsumerRegs>();
  const int cw = wg - 1;
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  float acc[kAccRegs];
  float acc2[kOverlap ? kAccRegs : 1];
  float sum[kAccRegs];
  PipeState pipe;
  uint32_t scale_phase = 0, staging_phase = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    if constexpr (kOverlap) {
      fp8::mainloop_per_token_overlapped<Mma, kStages>(acc, acc2, sum, pipe, bars, k_blocks, base + L.a_offset,
                                                       L.a_stage_bytes,
                                                       static_cast<uint32_t>(cw * kWgmmaM * fp8::kSwizzleBytes),
                                                       base + L.b_offset, L.b_stage_bytes, 0u, lane);
    } else {
      fp8::mainloop_per_token<Mma, kStages>(acc, sum, pipe, bars, k_blocks, base + L.a_offset, L.a_stage_bytes,
                                            static_cast<uint32_t>(cw * kWgmmaM * fp8::kSwizzleBytes),
                                            base + L.b_offset, L.b_stage_bytes, 0u, lane);
    }
    // The BF16 outputs (gemm_fp8's store expression) into the staging tile.
    const int r_lo = acc_row(warp, lane, 0), r_hi = acc_row(warp, lane, 2);
    ptx::mbarrier_wait_parity(bars.scale_full, scale_phase);
    const float sa_lo = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_lo));
    const float sa_hi = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_hi));
    uint32_t words[kAccRegs / 2];
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const float2 sb = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + acc_col(lane, 4 * j)));
      words[2 * j] = pack_bf16x2(sum[4 * j] * sa_lo * sb.x, sum[4 * j + 1] * sa_lo * sb.y);
      words[2 * j + 1] = pack_bf16x2(sum[4 * j + 2] * sa_hi * sb.x, sum[4 * j + 3] * sa_hi * sb.y);
    }
    ptx::mbarrier_arrive(bars.scale_empty);  // this thread has read its scales
    scale_phase ^= 1u;
    ptx::mbarrier_wait_parity(staging_empty, staging_phase ^ 1u);  // the previous tile's staging has been added
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const int c = acc_col(lane, 4 * j);
      ptx::st_shared_b32(staging + 2u * static_cast<uint32_t>((cw * kWgmmaM + r_lo) * kStagingPitch + c), words[2 * j]);
      ptx::st_shared_b32(staging + 2u * static_cast<uint32_t>((cw * kWgmmaM + r_hi) * kStagingPitch + c),
                         words[2 * j + 1]);
    }
    ptx::mbarrier_arrive(staging_full);  // release: this thread's stores happen before the epilogue's loads
    staging_phase ^= 1u;
  }
}

}  // namespace futransformer::cuda::fp8rw
