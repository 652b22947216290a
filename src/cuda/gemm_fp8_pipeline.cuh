// The FP8 GEMM kernels' shared roles (gemm_fp8.cuh, gemm_fp8_swiglu.cuh, gemm_fp8_residual_ws.cuh): the pipeline
// barriers, the TMA producer, the scale loader and the per-token consumer main loop. Each kernel keeps its own tile
// geometry and epilogue and calls these with its shared-memory offsets. Index maps: gemm_fp8_layout.h.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/gemm_fp8_layout.h"
#include "cuda/ptx/griddep.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace futransformer::cuda::fp8 {

// After the CTA's set-up (barrier init, tensor-map prefetch), before any thread reads global memory: under
// programmatic dependent launch (the launchers' attribute with FT_FP8_PDL=1) the kernel may start while the previous
// kernel on the stream still runs, so every thread waits for that grid's completion and the visibility of its writes.
// Then the CTA lets the next kernel on the stream be scheduled (it waits in turn before touching this one's output).
// Without the attribute both instructions do nothing.
__device__ __forceinline__ void pdl_wait_then_release() {
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
}

// threadIdx.x / 128 broadcast from lane 0: the same value, but the compiler then knows it is warp-uniform and keeps
// what derives from it (a consumer's A rows, hence its wgmma descriptors) in uniform registers instead of computing
// them per thread and moving them over (R2UR) before every wgmma.
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// Barrier addresses in shared memory: full[s] = full + 8 s, empty[s] = empty + 8 s, then the scale slot's pair.
struct PipelineBarriers {
  uint32_t full, empty, scale_full, scale_empty;
};

// The barriers of a ring of `stages` at `bar_base`: full[], empty[], then the scale slot's full and empty.
__device__ __forceinline__ PipelineBarriers pipeline_barriers(uint32_t bar_base, int stages) {
  const uint32_t empty = bar_base + 8u * stages, scale_full = bar_base + 16u * stages;
  return PipelineBarriers{bar_base, empty, scale_full, scale_full + 8u};
}

// The dynamic shared-memory window's first 1024-byte boundary: the 128-byte swizzle is a function of address bits
// 7..9, so every swizzled buffer must sit on one (the window itself is only guaranteed 16-byte aligned).
__device__ __forceinline__ uint32_t swizzle_aligned_base(const void* smem_window) {
  const uint32_t raw = ptx::smem_addr(smem_window);
  return (raw + (kSwizzleAtom - 1)) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
}

// The tiles a persistent CTA walks and the K blocks of each.
struct TileWalk {
  int m_blocks, n_blocks, group_m, k_blocks;
};

// Thread 0, before the fence: the stage barriers (the producer's arrive.expect_tx completes full[s], TMA bytes
// complete it; one arrival per consumer warp frees empty[s]) and the scale slot's (every lane of the scale loader
// warp after its stores; every consumer thread after its reads).
__device__ __forceinline__ void init_pipeline_barriers(const PipelineBarriers& b, int stages, uint32_t empty_arrivals,
                                                       uint32_t scale_empty_arrivals) {
  for (int s = 0; s < stages; ++s) {
    ptx::mbarrier_init(b.full + 8u * s, 1);
    ptx::mbarrier_init(b.empty + 8u * s, empty_arrivals);
  }
  ptx::mbarrier_init(b.scale_full, 32);
  ptx::mbarrier_init(b.scale_empty, scale_empty_arrivals);
}

// One thread: every (tile, K block) of this CTA's walk as a TMA load of the A box (a_rows x 128 bytes at row
// m_block · a_rows) and the B box (b_rows x 128 bytes at row n_block · b_rows) into the next free stage.
template <int kStages>
__device__ __forceinline__ void produce_stages(const CUtensorMap* tma_a, const CUtensorMap* tma_b,
                                               const PipelineBarriers& b, const TileWalk& w, uint32_t a_stage0,
                                               uint32_t a_stage_bytes, int a_rows, uint32_t b_stage0,
                                               uint32_t b_stage_bytes, int b_rows, uint32_t tx_bytes) {
  PipeState pipe;
  for (int tile = blockIdx.x; tile < w.m_blocks * w.n_blocks; tile += gridDim.x) {
    const TileCoord tc = tile_coord(tile, w.m_blocks, w.n_blocks, w.group_m);
    for (int kb = 0; kb < w.k_blocks; ++kb) {
      ptx::mbarrier_wait_parity(b.empty + 8u * pipe.stage, pipe.phase ^ 1u);
      const uint32_t full = b.full + 8u * pipe.stage;
      ptx::mbarrier_arrive_expect_tx(full, tx_bytes);
      ptx::tma_load_2d(a_stage0 + pipe.stage * a_stage_bytes, tma_a, kb * kBlockK, tc.m_block * a_rows, full);
      ptx::tma_load_2d(b_stage0 + pipe.stage * b_stage_bytes, tma_b, kb * kBlockK, tc.n_block * b_rows, full);
      advance(pipe, kStages);
    }
  }
}

// The scale-loader warp: each tile's a_scale rows (a_rows floats; 1 for every row when unit_a: block-scaled A
// applies its scales in the main loop) and b_scale columns (b_cols floats), zeros past M / N, into the single slot
// as soon as the consumers have read the previous tile's — the global loads overlap a whole main loop.
__device__ __forceinline__ void load_tile_scales(const PipelineBarriers& b, const TileWalk& w, uint32_t slot,
                                                 const float* a_scale, const float* b_scale, int M, int N, int a_rows,
                                                 int b_cols, bool unit_a, int lane) {
  uint32_t phase = 0;
  for (int tile = blockIdx.x; tile < w.m_blocks * w.n_blocks; tile += gridDim.x) {
    const TileCoord tc = tile_coord(tile, w.m_blocks, w.n_blocks, w.group_m);
    ptx::mbarrier_wait_parity(b.scale_empty, phase ^ 1u);
    for (int i = lane; i < a_rows; i += 32) {
      const int m = tc.m_block * a_rows + i;
      const float sa = unit_a ? 1.0f : (m < M ? __ldg(a_scale + m) : 0.0f);
      ptx::st_shared_f32(slot + 4u * i, m < M ? sa : 0.0f);
    }
    for (int i = lane; i < b_cols; i += 32) {
      const int n = tc.n_block * b_cols + i;
      ptx::st_shared_f32(slot + 4u * (a_rows + i), n < N ? __ldg(b_scale + n) : 0.0f);
    }
    ptx::mbarrier_arrive(b.scale_full);  // release: this lane's stores happen before the consumers' reads
    phase ^= 1u;
  }
}

// Waits for the current stage, then issues one K block's wgmmas into `a` (kKSteps of m64nNk32 from the stage's A rows
// at a_rows_offset and B rows at b_rows_offset, bytes into the stage; the first starts from zero) as one committed
// group.
template <class Mma>
__device__ __forceinline__ void issue_k_block(float (&a)[Mma::kRegs], const PipeState& pipe, const PipelineBarriers& b,
                                              uint32_t a_stage0, uint32_t a_stage_bytes, uint32_t a_rows_offset,
                                              uint32_t b_stage0, uint32_t b_stage_bytes, uint32_t b_rows_offset) {
  ptx::mbarrier_wait_parity(b.full + 8u * pipe.stage, pipe.phase);
  // Stage 0's descriptors are loop-invariant; a stage and a k step only add to the start-address field.
  const uint64_t a_desc =
      advance_smem_desc(make_smem_desc(a_stage0 + a_rows_offset), pipe.stage * a_stage_bytes);
  const uint64_t b_desc =
      advance_smem_desc(make_smem_desc(b_stage0 + b_rows_offset), pipe.stage * b_stage_bytes);
#pragma unroll
  for (int i = 0; i < Mma::kRegs; ++i) ptx::fence_operand(a[i]);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    Mma::mma(a, advance_smem_desc(a_desc, static_cast<uint32_t>(ks * kWgmmaK)),
             advance_smem_desc(b_desc, static_cast<uint32_t>(ks * kWgmmaK)), ks > 0);
  }
  ptx::wgmma_commit_group();
#pragma unroll
  for (int i = 0; i < Mma::kRegs; ++i) ptx::fence_operand(a[i]);
}

// A consumer warpgroup's main loop over one tile with per-token A scales: each K block's wgmmas (issue_k_block) start
// from zero and are then added to the fp32 sum (the promotion), and one arrival per warp frees the stage.
template <class Mma, int kStages>
__device__ __forceinline__ void mainloop_per_token(float (&acc)[Mma::kRegs], float (&sum)[Mma::kRegs], PipeState& pipe,
                                                   const PipelineBarriers& b, int k_blocks, uint32_t a_stage0,
                                                   uint32_t a_stage_bytes, uint32_t a_rows_offset, uint32_t b_stage0,
                                                   uint32_t b_stage_bytes, uint32_t b_rows_offset, int lane) {
#pragma unroll
  for (int i = 0; i < Mma::kRegs; ++i) sum[i] = 0.0f;
  for (int kb = 0; kb < k_blocks; ++kb) {
    issue_k_block<Mma>(acc, pipe, b, a_stage0, a_stage_bytes, a_rows_offset, b_stage0, b_stage_bytes, b_rows_offset);
    ptx::wgmma_wait_group<0>();
    // This warp's share of the stage has been read: one arrival per consumer warp frees it.
    if (lane == 0) ptx::mbarrier_arrive(b.empty + 8u * pipe.stage);
    advance(pipe, kStages);
#pragma unroll
    for (int i = 0; i < Mma::kRegs; ++i) sum[i] += acc[i];
  }
}

// The two-accumulator main loop over one tile: K block kb + 1's wgmmas are issued (issue(acc or acc2)) before kb's
// are waited for (wgmma.wait_group 1), then kb is retired (retire(its accumulator, its stage, its token): free the
// stage, add into the sum). begin(kb), called before K block kb is issued, returns what its retirement needs (the
// block-scaled instance's scales; nothing for per-token A). Blocks are retired in K order.
template <int kStages, class Acc, class Begin, class Issue, class Retire>
__device__ __forceinline__ void mainloop_two_accumulators(Acc& acc, Acc& acc2, PipeState& pipe, int k_blocks,
                                                          const Begin& begin, const Issue& issue,
                                                          const Retire& retire) {
  uint32_t pend_stage = 0;          // the stage of the group being retired
  decltype(begin(0)) pend{};        // and its token
  for (int kb = 0;;) {
    {
      const auto token = begin(kb);
      const uint32_t stage = pipe.stage;
      issue(acc);
      advance(pipe, kStages);
      if (kb > 0) {
        ptx::wgmma_wait_group<1>();
        retire(acc2, pend_stage, pend);
      }
      pend_stage = stage, pend = token;
      if (++kb == k_blocks) {
        ptx::wgmma_wait_group<0>();
        retire(acc, pend_stage, pend);
        break;
      }
    }
    {
      const auto token = begin(kb);
      const uint32_t stage = pipe.stage;
      issue(acc2);
      advance(pipe, kStages);
      ptx::wgmma_wait_group<1>();
      retire(acc, pend_stage, pend);
      pend_stage = stage, pend = token;
      if (++kb == k_blocks) {
        ptx::wgmma_wait_group<0>();
        retire(acc2, pend_stage, pend);
        break;
      }
    }
  }
}

// mainloop_per_token with two accumulators (mainloop_two_accumulators): the same additions in the same order as
// mainloop_per_token, so the same bits; registers: 3 x Mma::kRegs.
template <class Mma, int kStages>
__device__ __forceinline__ void mainloop_per_token_overlapped(float (&acc)[Mma::kRegs], float (&acc2)[Mma::kRegs],
                                                              float (&sum)[Mma::kRegs], PipeState& pipe,
                                                              const PipelineBarriers& b, int k_blocks,
                                                              uint32_t a_stage0, uint32_t a_stage_bytes,
                                                              uint32_t a_rows_offset, uint32_t b_stage0,
                                                              uint32_t b_stage_bytes, uint32_t b_rows_offset,
                                                              int lane) {
#pragma unroll
  for (int i = 0; i < Mma::kRegs; ++i) sum[i] = 0.0f;
  struct NoToken {};
  mainloop_two_accumulators<kStages>(
      acc, acc2, pipe, k_blocks, [](int) { return NoToken{}; },
      [&](float (&a)[Mma::kRegs]) {
        issue_k_block<Mma>(a, pipe, b, a_stage0, a_stage_bytes, a_rows_offset, b_stage0, b_stage_bytes, b_rows_offset);
      },
      [&](float (&a)[Mma::kRegs], uint32_t stage, NoToken) {
        // This warp's share of the stage has been read: one arrival per consumer warp frees it.
        if (lane == 0) ptx::mbarrier_arrive(b.empty + 8u * stage);
#pragma unroll
        for (int i = 0; i < Mma::kRegs; ++i) sum[i] = __fadd_rn(sum[i], a[i]);
      });
}

}  // namespace futransformer::cuda::fp8
