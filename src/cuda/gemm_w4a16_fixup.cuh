// Split-K sums of the W4A16 GEMM, shared by the reduce kernels (gemm_w4a16_reduce.cuh) and the in-kernel fixup of
// the warpgroup path (gemm_w4a16_wg.cuh): the fp32 partial sums of the slices added in slice order, then the launch's
// epilogue (BF16 y, an fp32 residual add, or SwiGLU of an interleaved gate|up weight) on four consecutive outputs.
// One function per epilogue, called by both, so the two ways of finishing a split GEMM give the same bits.
//
// The fixup ("serial split-K"): every CTA of a split launch stores its slice's partial sums as before, makes them
// visible device-wide (__threadfence) and takes a ticket from its column block's counter; the CTA that draws the
// last ticket (splits - 1) adds every slice of its column block and applies the epilogue, and sets the counter back
// to zero. No reduce kernel is launched. The counters (one unsigned per column block, grid.x of them) must be zero
// before the first launch that uses them; each launch leaves them zero. Launches that share counters must not run
// concurrently (the engine's decode chain is one stream, each launch waiting for the one before).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/gemm_w4a16_epilogue.cuh"
#include "cuda/gemm_w4a16_layout.h"

namespace futransformer::cuda::w4a16 {

// Slices loaded per round trip to L2 by sum_slices: the split-K tilings choose up to 11 slices at batch 32, so one
// batch holds them all. Each lane keeps kSlicesInFlight float4 in registers (64 registers at 16).
constexpr int kSlicesInFlight = 16;
// Column blocks a fixup launch may have (grid.x = N / (32 warps_n)): the counters buffer holds this many.
constexpr int kFixupMaxColumnBlocks = 4096;

// Slices 0, 1, ... of float4 i added in that order; count4 = M * N / 4 is the slice stride. The loads of a batch of
// kSlicesInFlight slices are all issued before the first of their additions: one dependent L2 round trip per batch
// instead of one per couple of slices, and the same order of additions, so the same bits. Loads go through L2 only
// (.cg): in the fixup, other CTAs wrote these partial sums during this kernel.
__device__ __forceinline__ float4 sum_slices(const float4* __restrict__ partial, int64_t i, int64_t count4,
                                             int splits) {
  float4 s = __ldcg(partial + i);
  for (int base = 1; base < splits; base += kSlicesInFlight) {
    float4 v[kSlicesInFlight];
#pragma unroll
    for (int k = 0; k < kSlicesInFlight; ++k) {
      if (base + k < splits) v[k] = __ldcg(partial + (base + k) * count4 + i);
    }
#pragma unroll
    for (int k = 0; k < kSlicesInFlight; ++k) {
      if (base + k < splits) {
        s.x += v[k].x;
        s.y += v[k].y;
        s.z += v[k].z;
        s.w += v[k].w;
      }
    }
  }
  return s;
}

// y[4 i .. 4 i + 3] = bf16(sum over slices); count4 = M * N / 4.
__device__ __forceinline__ void finish_store4(const float4* __restrict__ partial, __nv_bfloat16* __restrict__ y,
                                              int64_t i, int64_t count4, int splits) {
  const float4 s = sum_slices(partial, i, count4, splits);
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(y) + 2 * i;
  out[0] = __floats2bfloat162_rn(s.x, s.y);
  out[1] = __floats2bfloat162_rn(s.z, s.w);
}

// residual[4 i .. 4 i + 3] += float(bf16(sum over slices)) (Epilogue::residual_f32).
__device__ __forceinline__ void finish_residual4(const float4* __restrict__ partial, float4* __restrict__ residual,
                                                 int64_t i, int64_t count4, int splits) {
  const float4 s = sum_slices(partial, i, count4, splits);
  float4 r = residual[i];
  r.x = residual_add(r.x, s.x);
  r.y = residual_add(r.y, s.y);
  r.z = residual_add(r.z, s.z);
  r.w = residual_add(r.w, s.w);
  residual[i] = r;
}

// h[m, j .. j + 3] = bf16(silu(g) * u) (Epilogue::swiglu_bf16) for output item i = m * inter4 + j / 4 of an
// interleaved gate|up weight (N = 2 inter packed columns): gate j .. j + 3 are four consecutive packed columns (j % 4
// == 0 and runs of kSwiGluRun = 8 never split a float4), up j .. j + 3 the four kSwiGluRun columns further.
__device__ __forceinline__ void finish_swiglu4(const float4* __restrict__ partial, __nv_bfloat16* __restrict__ h,
                                               int64_t i, int64_t count4, int inter4, int splits) {
  static_assert(kSwiGluRun % 4 == 0, "a float4 of partial sums must lie inside one gate or up run");
  const int64_t m = i / inter4, j = (i % inter4) * 4;
  const int64_t g4 = (m * 8 * inter4 + swiglu_gate_col(j)) / 4;  // row m of the N = 8 inter4 packed columns
  const float4 g = sum_slices(partial, g4, count4, splits);
  const float4 u = sum_slices(partial, g4 + kSwiGluRun / 4, count4, splits);
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(h) + 2 * i;
  out[0] = __floats2bfloat162_rn(swiglu_value(g.x, u.x), swiglu_value(g.y, u.y));
  out[1] = __floats2bfloat162_rn(swiglu_value(g.z, u.z), swiglu_value(g.w, u.w));
}

// The fixup's last CTA: every output of packed columns [c0, c0 + width) (width a multiple of 32) and rows 0..M-1,
// finished as above by nthreads threads (thread `t`). Store and residual items are float4 of partial sums, SwiGLU
// items float4 of outputs (the column block's outputs are j in [c0 / 2, (c0 + width) / 2)).
__device__ __forceinline__ void fixup_column_block(const EpilogueOut& o, int64_t c0, int width, int t, int nthreads) {
  const int64_t count4 = static_cast<int64_t>(o.M) * o.N / 4;
  const auto* partial = reinterpret_cast<const float4*>(o.partial);
  if (o.epilogue == Epilogue::swiglu_bf16) {
    const int inter4 = o.N / 8, per_row = width / 8;  // output float4 of the block per row
    for (int k = t; k < o.M * per_row; k += nthreads) {
      const int m = k / per_row, c = k % per_row;
      finish_swiglu4(partial, o.y, static_cast<int64_t>(m) * inter4 + c0 / 8 + c, count4, inter4, o.splits);
    }
    return;
  }
  const int per_row = width / 4;
  for (int k = t; k < o.M * per_row; k += nthreads) {
    const int m = k / per_row, c = k % per_row;
    const int64_t i = (static_cast<int64_t>(m) * o.N + c0) / 4 + c;
    if (o.epilogue == Epilogue::residual_f32) {
      finish_residual4(partial, reinterpret_cast<float4*>(o.residual), i, count4, o.splits);
    } else {
      finish_store4(partial, o.y, i, count4, o.splits);
    }
  }
}

// After this CTA's partial sums are stored by its first nthreads threads (the only ones still running; thread index
// t): the ticket, and for the last CTA of the column block the block's sums. `last` is a shared-memory flag no thread
// of the CTA reads or writes otherwise from the first barrier on.
__device__ __forceinline__ void split_fixup(const EpilogueOut& o, unsigned* counters, int64_t c0, int width, int t,
                                            int nthreads, int* last) {
  __threadfence();  // this thread's partial sums are visible device-wide before the ticket is taken
  asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
  if (t == 0) {
    const unsigned ticket = atomicAdd(counters + blockIdx.x, 1u);
    const bool is_last = ticket == static_cast<unsigned>(o.splits - 1);
    if (is_last) counters[blockIdx.x] = 0u;  // every other CTA of the block has taken its ticket
    *last = is_last ? 1 : 0;
  }
  asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
  if (*last == 0) return;
  __threadfence();  // the other CTAs' partial sums (fenced before their tickets) are read after ours was drawn
  fixup_column_block(o, c0, width, t, nthreads);
}

}  // namespace futransformer::cuda::w4a16
