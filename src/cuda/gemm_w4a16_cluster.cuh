// Split-K of the W4A16 GEMM finished inside a thread-block cluster instead of by a reduce kernel
// (gemm_w4a16_reduce.cuh). The launcher (gemm_w4a16.cu) groups the `splits` CTAs of one column block — grid.y = K
// slice — into a cluster of dims (1, splits, 1), so a CTA's rank in the cluster is its slice. Each CTA stores its
// slice's fp32 sums into its own shared memory (EpilogueOut::tile, [M][tile_cols]); after a cluster barrier, rank r
// finishes every splits-th float4 of the tile: it adds the slices' values in slice order from the CTAs' shared
// memory (distributed shared memory, no global round trip) — sum_slices' order, so the bits of the reduce kernel —
// and applies the launch's epilogue (BF16 y, residual add or SwiGLU) to its outputs. A second barrier keeps every
// CTA resident until the others are done reading its tile. One kernel and no fp32 workspace traffic instead of a
// GEMM, its partial sums through L2 and a dependent reduce kernel.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/gemm_w4a16_epilogue.cuh"
#include "cuda/gemm_w4a16_layout.h"
#include "cuda/ptx/cluster.cuh"

namespace futransformer::cuda::w4a16 {

// Slices loaded per distributed-shared-memory round trip by cluster_sum (16 registers of loads in flight).
constexpr int kClusterLoadsInFlight = 4;

// Float4 `unit` of the tile summed over the cluster's `splits` CTAs in rank (= slice) order: the reduce kernel's
// additions (sum_in_slice_order), the loads from the slices' shared memory.
__device__ __forceinline__ float4 cluster_sum(uint32_t tile_addr, int unit, int splits) {
  const uint32_t addr = tile_addr + static_cast<uint32_t>(unit) * 16u;
  return sum_in_slice_order<kClusterLoadsInFlight>(splits, [&](int s) {
    return ptx::ld_shared_cluster_f4(ptx::map_shared_rank(addr, static_cast<uint32_t>(s)));
  });
}

// Every thread of every CTA of the cluster calls this once its CTA's sums are in o.tile (stored before by the
// CTA's own threads; the barrier orders them). threads: the CTA's thread count, tid: this thread's index.
__device__ __forceinline__ void cluster_finish(const EpilogueOut& o, int threads, int tid) {
  ptx::cluster_sync();
  const int splits = o.splits;
  const int C = o.tile_cols;  // a multiple of 32: no float4 straddles a row, a SwiGLU run or a gate/up pair
  const int units = o.M * C / 4;
  const uint32_t tile_addr = static_cast<uint32_t>(__cvta_generic_to_shared(o.tile));
  const int rank = static_cast<int>(ptx::cluster_ctarank());
  for (int u = rank * threads + tid; u < units; u += splits * threads) {
    const int m = cluster_unit_row(u, C), c = cluster_unit_col(u, C);
    const int64_t n = o.col0 + c;
    if (o.epilogue == Epilogue::swiglu_bf16) {
      // Gate columns are the first kSwiGluRun of every 2 kSwiGluRun packed columns, their up partners the next
      // kSwiGluRun: a gate float4 writes four consecutive outputs, an up float4 is read by its gate's thread.
      if (cluster_unit_is_up(c)) continue;
      const float4 g = cluster_sum(tile_addr, u, splits);
      const float4 up = cluster_sum(tile_addr, cluster_up_unit(u), splits);
      __nv_bfloat162* out =
          reinterpret_cast<__nv_bfloat162*>(o.y + static_cast<int64_t>(m) * (o.N / 2) + swiglu_out_col(n));
      out[0] = __floats2bfloat162_rn(swiglu_value(g.x, up.x), swiglu_value(g.y, up.y));
      out[1] = __floats2bfloat162_rn(swiglu_value(g.z, up.z), swiglu_value(g.w, up.w));
    } else if (o.epilogue == Epilogue::residual_f32) {
      float4* p = reinterpret_cast<float4*>(o.residual + static_cast<int64_t>(m) * o.N + n);
      float4 r = *p;  // issued before the sums: its L2 round trip overlaps theirs
      const float4 s = cluster_sum(tile_addr, u, splits);
      r.x = residual_add(r.x, s.x);
      r.y = residual_add(r.y, s.y);
      r.z = residual_add(r.z, s.z);
      r.w = residual_add(r.w, s.w);
      *p = r;
    } else {
      const float4 s = cluster_sum(tile_addr, u, splits);
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(o.y + static_cast<int64_t>(m) * o.N + n);
      out[0] = __floats2bfloat162_rn(s.x, s.y);
      out[1] = __floats2bfloat162_rn(s.z, s.w);
    }
  }
  ptx::cluster_sync();
}

}  // namespace futransformer::cuda::w4a16
