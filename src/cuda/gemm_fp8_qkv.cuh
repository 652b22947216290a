// The FP8 QKV projection with the attention prologue in its epilogue (sm_90a), for INT4 / int4-hadamard caches at
// head_dim 128 (include/futransformer/cuda/gemm_fp8_qkv.h has the contract):
//   D = bf16((A · B^T) · a_scale[m] · b_scale[n])   — gemm_fp8's BF16 outputs, never written to memory;
//   q heads: RoPE, BF16, Hadamard (the caller's block), BF16 into q_out;
//   k heads: RoPE, BF16, then either the cache (Hadamard, anchor, INT4) or, when their anchors are not known yet,
//            the RoPE'd BF16 keys into the qkv buffer's k slice (kv_key_anchor_compute and kv_append_keys follow);
//   v heads: Hadamard, INT4 into the cache.
// At head_dim 128 a 128-column tile is one head item (q, k or v) of 128 rows. Producer, scale loader, consumers' main
// loop and the BF16 staging tile are the warp-specialised residual GEMM's (gemm_fp8_residual_ws.cuh, its layout and
// register budgets); the fourth warpgroup runs, on the staged tile, exactly the quad code of the unfused kernels
// (fused_ops.cuh: rope_quad, finish_quad_item) — 32 quads, four rounds of 32 rows per tile — while the tensor cores
// run the next tile's main loop. So the cache bytes, q_out and the BF16 keys are bit for bit those of gemm_fp8 +
// rope_qk_bf16 + [kv_key_anchor_compute +] kv_append_rotate_q, with the RoPE cos/sin read from a per-pass table
// (rope_cos_sin_table: the same fp64 values the RoPE kernels compute).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/fused_ops.cuh"
#include "cuda/gemm_fp8.cuh"
#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_fp8_pipeline.cuh"
#include "cuda/gemm_fp8_residual_ws_layout.h"

namespace futransformer::cuda::fp8qkv {

using fp8rw::kBlockN;
using fp8rw::kStages;
using fp8rw::kThreads;

struct EpilogueParams {
  fused::QkvArgs a;       // a.qkv: the keys' destination when keys_to_qkv (else unused); positions unused
  const float2* rope_cs;  // [M][head_dim / 2]
  int keys_to_qkv;        // 1: k heads leave as RoPE'd BF16 in a.qkv instead of entering the cache
};

template <formats::KvFormat F>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_qkv_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                        const fp8::KernelParams p, const EpilogueParams e) {
  static_assert(F == formats::KvFormat::INT4 || F == formats::KvFormat::INT4_HADAMARD, "INT4 caches");
  static_assert(kBlockN == fused::kQuadHeadDim, "one tile column block is one head item");
  using fp8::acc_col, fp8::acc_row, fp8::kBlockK, fp8::kBlockM, fp8::kScaleLoaderWarp, fp8::kSwizzleAtom,
      fp8::kWgmmaM, fp8::pack_bf16x2, fp8::PipeState, fp8::tile_coord, fp8::TileCoord;
  using fp8rw::kStagingPitch;
  constexpr fp8rw::SmemLayout L = fp8rw::smem_layout();
  static_assert(L.a_stage_bytes % kSwizzleAtom == 0 && L.b_stage_bytes % kSwizzleAtom == 0,
                "every swizzled stage must start on a 1024-byte boundary");
  static_assert(L.alloc_bytes <= 227 * 1024, "shared memory exceeds the 227 KB a CTA may opt in to");
  static_assert((2 * kStagingPitch) % 16 == 0, "16-byte loads of a staged row");
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
    ptx::mbarrier_init(staging_full, fp8rw::kStagingFullArrivals);
    ptx::mbarrier_init(staging_empty, fp8rw::kStagingEmptyArrivals);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  fp8::pdl_wait_then_release();  // under programmatic launch: the previous kernel's writes are visible from here

  if (wg == 0) {
    // ---------------- producer (gemm_fp8's roles) ----------------
    ptx::setmaxnreg_dec<fp8rw::kProducerRegs>();
    if (threadIdx.x == 0) {
      fp8::produce_stages<kStages>(&tma_a, &tma_b, bars, walk, base + L.a_offset, L.a_stage_bytes, kBlockM,
                                   base + L.b_offset, L.b_stage_bytes, kBlockN, fp8::stage_tx_bytes(kBlockN));
    } else if (threadIdx.x / 32 == kScaleLoaderWarp) {
      fp8::load_tile_scales(bars, walk, scales, p.a_scale, p.b_scale, p.M, p.N, kBlockM, kBlockN, false,
                            threadIdx.x % 32);
    }
    return;
  }

  if (wg == fp8rw::kEpilogueWarpgroup) {
    // ---------------- epilogue: the attention prologue on the staged BF16 tile ----------------
    // Quad qd (lanes 4 qd .. 4 qd + 3 of the warpgroup) takes local rows qd, qd + 32, qd + 64, qd + 96; lane t of a
    // quad holds channels 32 t .. 32 t + 31 (the unfused quad kernel's layout).
    const fused::QkvArgs& a = e.a;
    const int qd = (threadIdx.x % 128) / 4;
    const int t = static_cast<int>(threadIdx.x) & 3;
    const unsigned quad_mask = 0xFu << (threadIdx.x & 28u);
    constexpr int kQuads = 128 / 4;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
      const int item = tc.n_block;  // tile-uniform
      const bool is_q = item < a.n_heads;
      const bool is_v = item >= a.n_heads + a.n_kv_heads;
      ptx::mbarrier_wait_parity(staging_full, phase);
#pragma unroll 1
      for (int lr = qd; lr < kBlockM; lr += kQuads) {
        const int r = tc.m_block * kBlockM + lr;
        if (r >= p.M) break;  // quad-uniform; later rounds are further past M
        fused::QkvRowMeta meta{-1, -1, -1};
        if (!is_q) meta = fused::qkv_row_meta<F>(a, r);
        float x[fused::kQuadPerLane];
        const uint32_t at = staging + 2u * static_cast<uint32_t>(lr * kStagingPitch + fused::kQuadPerLane * t);
#pragma unroll
        for (int v = 0; v < fused::kQuadPerLane / 8; ++v) {
          const uint4 w = ptx::ld_shared_v4_b32(at + 16u * v);
          const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            x[8 * v + 2 * k] = __uint_as_float(ws[k] << 16);
            x[8 * v + 2 * k + 1] = __uint_as_float(ws[k] & 0xffff0000u);
          }
        }
        if (!is_v) {
          uint32_t out[fused::kQuadPerLane / 2];
          fused::rope_quad(x, e.rope_cs + static_cast<int64_t>(r) * (fused::kQuadHeadDim / 2), t, quad_mask, out);
          if (!is_q && e.keys_to_qkv) {
            fused::store_quad_head(a.qkv + static_cast<int64_t>(r) * a.row_width +
                                       static_cast<int64_t>(item) * fused::kQuadHeadDim,
                                   t, out);
            continue;
          }
        }
        fused::finish_quad_item<F>(a, x, r, item, meta, t, quad_mask);
      }
      ptx::mbarrier_arrive(staging_empty);  // release: this thread's staging loads happen before the next stores
      phase ^= 1u;
    }
    return;
  }

  // ---------------- consumers (the residual kernel's: main loop, BF16 into the staging tile) ----------------
  ptx::setmaxnreg_inc<fp8rw::kConsumerRegs>();
  const int cw = wg - 1;
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  float acc[kAccRegs];
  float sum[kAccRegs];
  PipeState pipe;
  uint32_t scale_phase = 0, staging_phase = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    fp8::mainloop_per_token<Mma, kStages>(acc, sum, pipe, bars, k_blocks, base + L.a_offset, L.a_stage_bytes,
                                          static_cast<uint32_t>(cw * kWgmmaM * fp8::kSwizzleBytes), base + L.b_offset,
                                          L.b_stage_bytes, 0u, lane);
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
    ptx::mbarrier_wait_parity(staging_empty, staging_phase ^ 1u);  // the previous tile's staging has been used
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

}  // namespace futransformer::cuda::fp8qkv
