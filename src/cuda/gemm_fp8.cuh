// FP8 E4M3 GEMM for prefill on Hopper (sm_90a):
//   D[M, N] (BF16) = (A[M, K] . B[N, K]^T) * a_scale[m] * b_scale[n],   A, B E4M3 codes, both K-major.
//
// Structure (index maps in gemm_fp8_layout.h, drawn in docs/kernels.md):
// - Persistent: one CTA per SM walks tiles b, b + grid, ... in the grouped order of tile_coord.
// - Warp specialisation, 3 warpgroups: warpgroup 0 is the producer (one thread issues TMA loads of 128 x 128 A
//   and block_n x 128 B boxes, 128-byte swizzled, into a ring of `stages` shared-memory stages; full/empty
//   mbarriers hand stages back and forth) and gives most of its registers away with setmaxnreg; warpgroups 1
//   and 2 are consumers, each computing 64 rows of the tile with wgmma.m64nNk32 straight from shared memory.
// - FP32 promotion: Hopper's FP8 wgmma adds products into its accumulator with reduced precision (about 14
//   significant bits), so each 128-deep K block is accumulated by four wgmmas starting from zero and then
//   added to a separate fp32 sum in ordinary FADDs: the rounding error stays that of a 128-term sum however
//   long K is. While one consumer warpgroup adds, the other's wgmmas keep the tensor cores busy.
// - Epilogue: a second producer warp has staged the tile's scales in shared memory during the main loop. The
//   sums are scaled by a_scale[m] * b_scale[n] in fp32, rounded to BF16, staged in shared memory in the
//   swizzled layout of the D tensor map and written by TMA stores, which clip rows >= M and columns >= N.
//   The store runs asynchronously while the next tile's main loop starts; the staging buffer is reused only
//   after the store has finished reading it.
// Tails: TMA fills rows of A beyond M and rows of B beyond N with zeros (the products are then zero), so M and
// N need no multiple; K must be a multiple of 16 (the launcher checks); a partial last K block is zero-filled by TMA.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/decoder_ops.cuh"
#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_fp8_pipeline.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace futransformer::cuda::fp8 {

struct KernelParams {
  const float* a_scale;  // [M], or kBlockScaledA: [M, a_scale_kblocks] (one scale per row per 128-deep K block)
  const float* b_scale;  // [N]
  int M, N, K;
  int m_blocks, n_blocks, group_m;
  float* residual;  // kResidual: fp32 [M, N], 8-byte aligned; D is not written
  int a_scale_kblocks;  // kBlockScaledA: ceil(K / kBlockK), the row stride of a_scale
};

// kRope (gemm_fp8_rope): HF rotate-half RoPE on the q and k heads in the BF16 epilogue. The tile is 128 columns and
// head_dim is 128, so a tile column block below `cols` is one head, and column c < 64 and its partner c + 64 sit in
// one thread's accumulators (8-column groups j and j + 8).
constexpr int kRopeHeadDim = 128;
struct RopeParams {
  const float2* cs;  // the pass's (cos, sin) table (rope_cos_sin_table): [M][kRopeHeadDim / 2], 16-byte aligned
  int cols;          // columns [0, cols) are q and k heads (a multiple of kRopeHeadDim); later ones are stored as is
};

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
  return *reinterpret_cast<const uint32_t*>(&v);
}

// kResidual: instead of storing D, each consumer thread adds its BF16-rounded outputs into the fp32 residual
// stream in place, residual[m][n] = residual[m][n] + float(bf16(D[m][n])) — the BF16 store followed by
// add_residual_bf16, bit for bit, without D's round trip through memory or a second kernel.
// kBlockScaledA: A carries one scale per row per 128-deep K block (the 1 x 128 activation blocks a producer that
// sees only one tile of a row can emit, formats::fp8_quantize_per_token_block). The promotion applies it:
// sum = fma(acc_kb, a_scale[m][kb], sum), with the scale loaded before the K block's wgmmas are waited on; the
// epilogue then scales by b_scale alone. CPU twin: formats::gemm_fp8_block_a_reference.
//
// kOverlap (per-token A at block_n 128, the launcher's default for the BF16 store): mainloop_per_token_overlapped —
// K block kb + 1's wgmmas run while kb is added. Same additions in the same order, so the same bits as the
// one-accumulator loop (mainloop_per_token), which the residual instances keep by default (the warp-specialised
// residual kernel's consumers have 168 registers, not 3 x 64 + more).
template <int kBlockN, int kStages, bool kResidual = false, bool kBlockScaledA = false, bool kOverlap = false,
          bool kRope = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                    const __grid_constant__ CUtensorMap tma_d, const KernelParams p, const RopeParams rope) {
  static_assert(!kRope || (kBlockN == kRopeHeadDim && !kResidual && !kBlockScaledA),
                "kRope: BF16 store of per-token A at 128-column tiles (one head per tile)");
  static_assert(kBlockN % kDBoxCols == 0 && kBlockN >= 64 && kBlockN <= 256, "block_n: a multiple of 64 up to 256");
  static_assert(kStages >= 2, "the pipeline needs at least two stages");
  constexpr SmemLayout L = smem_layout(kBlockN, kStages);
  static_assert(L.a_stage_bytes % kSwizzleAtom == 0 && L.b_stage_bytes % kSwizzleAtom == 0 &&
                    L.d_wg_bytes % kSwizzleAtom == 0,
                "every swizzled buffer must start on a 1024-byte boundary");
  static_assert(L.alloc_bytes <= 227 * 1024, "shared memory exceeds the 227 KB a CTA may opt in to");
  using Mma = ptx::WgmmaE4m3<kBlockN>;
  constexpr int kAccRegs = Mma::kRegs;
  static_assert(kAccRegs == kBlockN / 2, "an m64nN fp32 accumulator is N / 2 registers per thread");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = swizzle_aligned_base(smem_raw);
  const PipelineBarriers bars = pipeline_barriers(base + L.bar_offset, kStages);
  const uint32_t empty_bar = bars.empty;
  const uint32_t scale_full = bars.scale_full, scale_empty = bars.scale_empty;
  const uint32_t scales = base + L.scale_offset;

  const int wg = fp8::warpgroup_index();  // warp-uniform for the compiler
  const int num_tiles = p.m_blocks * p.n_blocks;
  const int k_blocks = (p.K + kBlockK - 1) / kBlockK;  // the last block may be partial (zero-filled by TMA)

  const TileWalk walk{p.m_blocks, p.n_blocks, p.group_m, k_blocks};
  if (threadIdx.x == 0) {
    ptx::prefetch_tensormap(&tma_a);
    ptx::prefetch_tensormap(&tma_b);
    if constexpr (!kResidual) ptx::prefetch_tensormap(&tma_d);
    init_pipeline_barriers(bars, kStages, kEmptyArrivals, kScaleEmptyArrivals);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  fp8::pdl_wait_then_release();  // under programmatic launch: the previous kernel's writes are visible from here

  if (wg == 0) {
    // ---------------- producer ----------------
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      produce_stages<kStages>(&tma_a, &tma_b, bars, walk, base + L.a_offset, L.a_stage_bytes, kBlockM,
                              base + L.b_offset, L.b_stage_bytes, kBlockN, stage_tx_bytes(kBlockN));
    } else if (threadIdx.x / 32 == kScaleLoaderWarp) {
      // Block-scaled A: its scales enter in the main loop, the epilogue's row factor is 1.
      load_tile_scales(bars, walk, scales, p.a_scale, p.b_scale, p.M, p.N, kBlockM, kBlockN, kBlockScaledA,
                       threadIdx.x % 32);
    }
    return;
  }

  // ---------------- consumers ----------------
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1;                  // consumer warpgroup: rows 64 cw .. 64 cw + 63 of the tile
  const int tid = threadIdx.x % 128;      // thread in the warpgroup
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t d_stage = base + L.d_offset + static_cast<uint32_t>(cw) * L.d_wg_bytes;

  // Block-scaled A at block_n 128, and kOverlap, promote one K block while the next one's wgmmas run (registers:
  // 3 x 64).
  static_assert(!kOverlap || (kBlockN == 128 && !kBlockScaledA), "kOverlap: per-token A at block_n 128");
  constexpr bool kOverlapPromotion = kBlockScaledA && kBlockN == 128;
  float acc[kAccRegs];  // written only by wgmma (the first of each K block starts from zero)
  float acc2[kOverlapPromotion || kOverlap ? kAccRegs : 1];  // the odd K blocks' accumulator
  float sum[kAccRegs];  // fp32 promotion target
  PipeState pipe;
  uint32_t scale_phase = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord tc = tile_coord(tile, p.m_blocks, p.n_blocks, p.group_m);
    if constexpr (kBlockScaledA) {
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i) sum[i] = 0.0f;
    }
    // kBlockScaledA: this thread's two rows of A (rows past M read no scale and keep 0: their sums are never stored).
    const int a_row_lo = tc.m_block * kBlockM + cw * kWgmmaM + acc_row(warp, lane, 0);
    const int a_row_hi = a_row_lo + 8;
    const float* a_scale_lo = p.a_scale + static_cast<int64_t>(a_row_lo) * p.a_scale_kblocks;
    const float* a_scale_hi = p.a_scale + static_cast<int64_t>(a_row_hi) * p.a_scale_kblocks;
    auto block_scale = [&](const float* row_scales, int row, int kb) {
      return row < p.M && kb < k_blocks ? __ldg(row_scales + kb) : 0.0f;
    };
    // Issue the four wgmmas of the next K block into `a` (after its stage has landed).
    auto issue = [&](float (&a)[kAccRegs]) {
      issue_k_block<Mma>(a, pipe, bars, base + L.a_offset, L.a_stage_bytes,
                         static_cast<uint32_t>(cw * kWgmmaM * kSwizzleBytes), base + L.b_offset, L.b_stage_bytes, 0u);
    };

    if constexpr (kOverlapPromotion) {
      // Block-scaled A at block_n 128: two accumulators, so K block kb + 1's wgmmas run while K block kb is promoted
      // (sum = fma(acc, a_scale[m][kb], sum) is 64 FFMAs with a freshly loaded scale per thread and K block; issued
      // between the blocks they delayed the next wgmmas: measured 23 % slower than the per-token instance). The
      // sums are added in the same K order, so the result is unchanged.
      // The K block scales come from global memory (L2): loaded kScaleAhead blocks before the issue that uses them
      // (one block ahead left the promotion waiting on the load), rotated through registers.
      constexpr int kScaleAhead = 3;
      float ahead_lo[kScaleAhead], ahead_hi[kScaleAhead];  // scales of K blocks kb .. kb + kScaleAhead − 1
#pragma unroll
      for (int i = 0; i < kScaleAhead; ++i) {
        ahead_lo[i] = block_scale(a_scale_lo, a_row_lo, i);
        ahead_hi[i] = block_scale(a_scale_hi, a_row_hi, i);
      }
      struct Scales {
        float lo, hi;
      };
      const auto take_scales = [&](int kb) {  // K block kb's scales; queue the load of kb + ahead
        const Scales s{ahead_lo[0], ahead_hi[0]};
#pragma unroll
        for (int i = 0; i + 1 < kScaleAhead; ++i) {
          ahead_lo[i] = ahead_lo[i + 1];
          ahead_hi[i] = ahead_hi[i + 1];
        }
        ahead_lo[kScaleAhead - 1] = block_scale(a_scale_lo, a_row_lo, kb + kScaleAhead);
        ahead_hi[kScaleAhead - 1] = block_scale(a_scale_hi, a_row_hi, kb + kScaleAhead);
        return s;
      };
      const auto retire = [&](float (&a)[kAccRegs], uint32_t stage, Scales sc) {
        // This warp's share of the stage has been read: one arrival per consumer warp frees it.
        if (lane == 0) ptx::mbarrier_arrive(empty_bar + 8u * stage);
#pragma unroll
        for (int i = 0; i < kAccRegs; ++i) sum[i] = __fmaf_rn(a[i], (i & 2) ? sc.hi : sc.lo, sum[i]);
      };
      mainloop_two_accumulators<kStages>(acc, acc2, pipe, k_blocks, take_scales, issue, retire);
    } else if constexpr (kBlockScaledA) {
      // Block-scaled A at block_n 192 (no registers for a second accumulator): the K block scales are loaded two
      // blocks ahead of their use.
      float sa_kb_lo = block_scale(a_scale_lo, a_row_lo, 0), sa_kb_hi = block_scale(a_scale_hi, a_row_hi, 0);
      float sa_next_lo = block_scale(a_scale_lo, a_row_lo, 1), sa_next_hi = block_scale(a_scale_hi, a_row_hi, 1);
      for (int kb = 0; kb < k_blocks; ++kb) {
        const float sa_far_lo = block_scale(a_scale_lo, a_row_lo, kb + 2);
        const float sa_far_hi = block_scale(a_scale_hi, a_row_hi, kb + 2);
        const uint32_t stage = pipe.stage;
        issue(acc);
        ptx::wgmma_wait_group<0>();
        // This warp's share of the stage has been read: one arrival per consumer warp frees it.
        if (lane == 0) ptx::mbarrier_arrive(empty_bar + 8u * stage);
        advance(pipe, kStages);
#pragma unroll
        for (int i = 0; i < kAccRegs; ++i) sum[i] = __fmaf_rn(acc[i], (i & 2) ? sa_kb_hi : sa_kb_lo, sum[i]);
        sa_kb_lo = sa_next_lo;
        sa_kb_hi = sa_next_hi;
        sa_next_lo = sa_far_lo;
        sa_next_hi = sa_far_hi;
      }
    } else if constexpr (kOverlap) {
      mainloop_per_token_overlapped<Mma, kStages>(acc, acc2, sum, pipe, bars, k_blocks, base + L.a_offset,
                                                  L.a_stage_bytes, static_cast<uint32_t>(cw * kWgmmaM * kSwizzleBytes),
                                                  base + L.b_offset, L.b_stage_bytes, 0u, lane);
    } else {
      mainloop_per_token<Mma, kStages>(acc, sum, pipe, bars, k_blocks, base + L.a_offset, L.a_stage_bytes,
                                       static_cast<uint32_t>(cw * kWgmmaM * kSwizzleBytes), base + L.b_offset,
                                       L.b_stage_bytes, 0u, lane);
    }

    // ---------------- epilogue ----------------
    const int m0 = tc.m_block * kBlockM + cw * kWgmmaM;  // first row of this warpgroup
    const int n0 = tc.n_block * kBlockN;
    const int r_lo = acc_row(warp, lane, 0), r_hi = acc_row(warp, lane, 2);
    if constexpr (kResidual) {
      ptx::mbarrier_wait_parity(scale_full, scale_phase);
      const float sa_lo = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_lo));
      const float sa_hi = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_hi));
      // Rows r_lo and r_hi, columns c and c + 1 of each 8-column group j: a quad of lanes covers 32 contiguous
      // bytes of a row, so each warp access is eight full 32-byte sectors. N is a multiple of 8, so c < N implies
      // c + 1 < N. Loads of a group of columns are issued before their adds so they overlap.
      const int row_lo = m0 + r_lo, row_hi = m0 + r_hi;
      constexpr int kChunk = 4;  // 8-column groups per batch of loads (bounds the live registers: 240 per thread)
#pragma unroll
      for (int j0 = 0; j0 < kBlockN / 8; j0 += kChunk) {
        float2 lo[kChunk], hi[kChunk];
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {
          const int col = n0 + acc_col(lane, 4 * (j0 + jj));
          float2* plo = reinterpret_cast<float2*>(p.residual + static_cast<int64_t>(row_lo) * p.N + col);
          float2* phi = reinterpret_cast<float2*>(p.residual + static_cast<int64_t>(row_hi) * p.N + col);
          lo[jj] = (row_lo < p.M && col < p.N) ? *plo : make_float2(0.0f, 0.0f);
          hi[jj] = (row_hi < p.M && col < p.N) ? *phi : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int jj = 0; jj < kChunk; ++jj) {
          const int j = j0 + jj;
          const int col = n0 + acc_col(lane, 4 * j);
          if (col >= p.N) continue;
          const float2 sb = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + acc_col(lane, 4 * j)));  // 0 past N
          if (row_lo < p.M) {
            float2 v = lo[jj];
            v.x = __fadd_rn(v.x, __bfloat162float(__float2bfloat16_rn(sum[4 * j] * sa_lo * sb.x)));
            v.y = __fadd_rn(v.y, __bfloat162float(__float2bfloat16_rn(sum[4 * j + 1] * sa_lo * sb.y)));
            *reinterpret_cast<float2*>(p.residual + static_cast<int64_t>(row_lo) * p.N + col) = v;
          }
          if (row_hi < p.M) {
            float2 v = hi[jj];
            v.x = __fadd_rn(v.x, __bfloat162float(__float2bfloat16_rn(sum[4 * j + 2] * sa_hi * sb.x)));
            v.y = __fadd_rn(v.y, __bfloat162float(__float2bfloat16_rn(sum[4 * j + 3] * sa_hi * sb.y)));
            *reinterpret_cast<float2*>(p.residual + static_cast<int64_t>(row_hi) * p.N + col) = v;
          }
        }
      }
      // This thread has read its scales: every consumer thread's arrival frees the slot.
      ptx::mbarrier_arrive(scale_empty);
      scale_phase ^= 1u;
      continue;
    }
    // The previous tile's TMA store must have finished reading the staging buffer before it is overwritten.
    if (tid == 0) ptx::bulk_wait_group_read<0>();
    ptx::mbarrier_wait_parity(scale_full, scale_phase);
    const float sa_lo = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_lo));  // 0 past M
    const float sa_hi = ptx::ld_shared_f32(scales + 4u * (cw * kWgmmaM + r_hi));
    ptx::bar_sync(1 + cw, 128);
    bool plain_store = true;
    if constexpr (kRope) {
      if (n0 < rope.cols) {
        plain_store = false;
        // One q or k head: each value rounded to BF16 as the plain store rounds it, then rope_qk_bf16's arithmetic
        // (ops::rope_lo / rope_hi with the table's fp64-derived (cos, sin)) and a second BF16 rounding. Rows past M
        // read row M - 1's angles; TMA never stores them.
        const float2* cs_lo = rope.cs + static_cast<int64_t>(min(m0 + r_lo, p.M - 1)) * (kRopeHeadDim / 2);
        const float2* cs_hi = rope.cs + static_cast<int64_t>(min(m0 + r_hi, p.M - 1)) * (kRopeHeadDim / 2);
        const auto bf = [](float v) { return __bfloat162float(__float2bfloat16_rn(v)); };
#pragma unroll
        for (int j = 0; j < kBlockN / 16; ++j) {
          const int c = acc_col(lane, 4 * j);  // c, c + 1 < 64; partners c + 64, c + 65 in group j + 8
          const int jp = j + kBlockN / 16;
          const float2 sb = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + c));
          const float2 sp = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + c + kRopeHeadDim / 2));
          const float4 lo = *reinterpret_cast<const float4*>(cs_lo + c);  // (cos, sin) of c, then of c + 1
          const float4 hi = *reinterpret_cast<const float4*>(cs_hi + c);
          const float2 l0 = make_float2(lo.x, lo.y), l1 = make_float2(lo.z, lo.w);
          const float2 h0 = make_float2(hi.x, hi.y), h1 = make_float2(hi.z, hi.w);
          const float a0 = bf(sum[4 * j] * sa_lo * sb.x), b0 = bf(sum[4 * jp] * sa_lo * sp.x);
          const float a1 = bf(sum[4 * j + 1] * sa_lo * sb.y), b1 = bf(sum[4 * jp + 1] * sa_lo * sp.y);
          const float a2 = bf(sum[4 * j + 2] * sa_hi * sb.x), b2 = bf(sum[4 * jp + 2] * sa_hi * sp.x);
          const float a3 = bf(sum[4 * j + 3] * sa_hi * sb.y), b3 = bf(sum[4 * jp + 3] * sa_hi * sp.y);
          ptx::st_shared_b32(d_stage + d_stage_offset(r_lo, c),
                             pack_bf16x2(ops::rope_lo(a0, b0, l0), ops::rope_lo(a1, b1, l1)));
          ptx::st_shared_b32(d_stage + d_stage_offset(r_lo, c + kRopeHeadDim / 2),
                             pack_bf16x2(ops::rope_hi(a0, b0, l0), ops::rope_hi(a1, b1, l1)));
          ptx::st_shared_b32(d_stage + d_stage_offset(r_hi, c),
                             pack_bf16x2(ops::rope_lo(a2, b2, h0), ops::rope_lo(a3, b3, h1)));
          ptx::st_shared_b32(d_stage + d_stage_offset(r_hi, c + kRopeHeadDim / 2),
                             pack_bf16x2(ops::rope_hi(a2, b2, h0), ops::rope_hi(a3, b3, h1)));
        }
      }
    }
    if (plain_store) {
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        const int c = acc_col(lane, 4 * j);
        const float2 sb = ptx::ld_shared_v2_f32(scales + 4u * (kBlockM + c));  // columns c, c + 1; 0 past N
        ptx::st_shared_b32(d_stage + d_stage_offset(r_lo, c),
                           pack_bf16x2(sum[4 * j] * sa_lo * sb.x, sum[4 * j + 1] * sa_lo * sb.y));
        ptx::st_shared_b32(d_stage + d_stage_offset(r_hi, c),
                           pack_bf16x2(sum[4 * j + 2] * sa_hi * sb.x, sum[4 * j + 3] * sa_hi * sb.y));
      }
    }
    // This thread has read its scales: every consumer thread's arrival frees the slot.
    ptx::mbarrier_arrive(scale_empty);
    scale_phase ^= 1u;
    ptx::fence_proxy_async_shared();
    ptx::bar_sync(1 + cw, 128);
    if (tid == 0 && m0 < p.M) {
#pragma unroll
      for (int b = 0; b < kBlockN / kDBoxCols; ++b) {
        if (n0 + b * kDBoxCols < p.N) ptx::tma_store_2d(&tma_d, n0 + b * kDBoxCols, m0, d_stage + b * kDBoxBytes);
      }
      ptx::bulk_commit_group();
    }
  }
  // Shared memory must outlive the last store's reads of it.
  if (tid == 0) ptx::bulk_wait_group<0>();
}

}  // namespace futransformer::cuda::fp8
