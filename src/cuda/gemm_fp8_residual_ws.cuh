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
#include "cuda/gemm_fp8_residual_ws_layout.h"

namespace futransformer::cuda::fp8rw {

__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_residual_ws_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                const fp8::KernelParams p) {
  using fp8::acc_col, fp8::acc_row, fp8::a_desc_addr, fp8::advance, fp8::b_desc_addr, fp8::kBlockK, fp8::kBlockM,
      fp8::kKSteps, fp8::kScaleLoaderWarp, fp8::kSwizzleAtom, fp8::kWgmmaM, fp8::make_smem_desc, fp8::pack_bf16x2,
      fp8::PipeState, fp8::tile_coord, fp8::TileCoord;
  constexpr SmemLayout L = smem_layout();
  static_assert(L.a_stage_bytes % kSwizzleAtom == 0 && L.b_stage_bytes % kSwizzleAtom == 0,
                "every swizzled stage must start on a 1024-byte boundary");
  static_assert(L.alloc_bytes <= 227 * 1024, "shared memory exceeds the 227 KB a CTA may opt in to");
  using Mma = ptx::WgmmaE4m3<kBlockN>;
  constexpr int kAccRegs = Mma::kRegs;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t base = (raw + (kSwizzleAtom - 1)) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  const uint32_t full_bar = base + L.bar_offset;
  const uint32_t empty_bar = full_bar + 8u * kStages;
  const uint32_t scale_full = full_bar + 16u * kStages, scale_empty = scale_full + 8u;
  const uint32_t staging_full = scale_empty + 8u, staging_empty = staging_full + 8u;
  const uint32_t scales = base + L.scale_offset;
  const uint32_t staging = base + L.staging_offset;

  const int wg = threadIdx.x / 128;
  const int num_tiles = p.m_blocks * p.n_blocks;
  const int k_blocks = (p.K + kBlockK - 1) / kBlockK;

  if (threadIdx.x == 0) {
    ptx::prefetch_tensormap(&tma_a);
    ptx::prefetch_tensormap(&tma_b);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(full_bar + 8u * s, 1);
      ptx::mbarrier_init(empty_bar + 8u * s, fp8::kEmptyArrivals);
    }
    ptx::mbarrier_init(scale_full, 32);
    ptx::mbarrier_init(scale_empty, fp8::kScaleEmptyArrivals);
    ptx::mbarrier_init(staging_full, kStagingFullArrivals);
    ptx::mbarrier_init(staging_empty, kStagingEmptyArrivals);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer (gemm_fp8_kernel's) ----------------
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      PipeState pipe;
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
        for (int kb = 0; kb < k_blocks; ++kb) {
          ptx::mbarrier_wait_parity(empty_bar + 8u * pipe.stage, pipe.phase ^ 1u);
          const uint32_t full = full_bar + 8u * pipe.stage;
          ptx::mbarrier_arrive_expect_tx(full, fp8::stage_tx_bytes(kBlockN));
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
        for (int i = lane; i < kBlockN; i += 32) {
          const int n = tc.n_block * kBlockN + i;
          ptx::st_shared_f32(scales + 4u * (kBlockM + i), n < p.N ? __ldg(p.b_scale + n) : 0.0f);
        }
        ptx::mbarrier_arrive(scale_full);  // release: this lane's stores happen before the consumers' reads
        phase ^= 1u;
      }
    }
    return;
  }

  if (wg == kEpilogueWarpgroup) {
    // ---------------- epilogue: residual += the staged BF16 tile ----------------
    // Warp w adds rows 32 w .. 32 w + 31; lane l columns 4 l .. 4 l + 3 (8 bytes of staging, 16 of residual; N is
    // a multiple of 8, so a column group starting below N ends below N).
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
      const int col = tc.n_block * kBlockN + 4 * lane;
      ptx::mbarrier_wait_parity(staging_full, phase);
#pragma unroll 1
      for (int r0 = 32 * warp; r0 < 32 * warp + 32; r0 += kRowsPerBatch) {
        float4 v[kRowsPerBatch];
        uint2 d[kRowsPerBatch];
#pragma unroll
        for (int i = 0; i < kRowsPerBatch; ++i) {
          const int row = tc.m_block * kBlockM + r0 + i;
          const uint32_t at = staging + 2u * static_cast<uint32_t>((r0 + i) * kStagingPitch + 4 * lane);
          d[i] = ptx::ld_shared_v2_b32(at);
          v[i] = row < p.M && col < p.N
                     ? *reinterpret_cast<const float4*>(p.residual + static_cast<int64_t>(row) * p.N + col)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < kRowsPerBatch; ++i) {
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
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1;
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  float acc[kAccRegs];
  float sum[kAccRegs];
  PipeState pipe;
  uint32_t scale_phase = 0, staging_phase = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) sum[i] = 0.0f;
    for (int kb = 0; kb < k_blocks; ++kb) {
      ptx::mbarrier_wait_parity(full_bar + 8u * pipe.stage, pipe.phase);
      const uint32_t a_addr = base + L.a_offset + pipe.stage * L.a_stage_bytes;
      const uint32_t b_addr = base + L.b_offset + pipe.stage * L.b_stage_bytes;
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i) ptx::fence_operand(acc[i]);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        Mma::mma(acc, make_smem_desc(a_desc_addr(a_addr, cw, ks)), make_smem_desc(b_desc_addr(b_addr, ks)), ks > 0);
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
    // The BF16 outputs (gemm_fp8's store expression) into the staging tile.
    const int r_lo = acc_row(warp, lane, 0), r_hi = acc_row(warp, lane, 2);
    ptx::mbarrier_wait_parity(scale_full, scale_phase);
    const float sa_lo = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_lo));
    const float sa_hi = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_hi));
    uint32_t words[kAccRegs / 2];
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const float2 sb = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + acc_col(lane, 4 * j)));
      words[2 * j] = pack_bf16x2(sum[4 * j] * sa_lo * sb.x, sum[4 * j + 1] * sa_lo * sb.y);
      words[2 * j + 1] = pack_bf16x2(sum[4 * j + 2] * sa_hi * sb.x, sum[4 * j + 3] * sa_hi * sb.y);
    }
    ptx::mbarrier_arrive(scale_empty);  // this thread has read its scales
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
