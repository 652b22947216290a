// Final stores of the W4A16 GEMM kernels (v2 and v4) with the fused epilogues (w4a16::Epilogue, drawn in
// gemm_w4a16_layout.h): plain BF16 store, fp32 residual add, SwiGLU of an interleaved gate|up weight, or, when K is
// split, the fp32 partial sums that the reduce kernel finishes (gemm_w4a16_reduce.cuh, which applies the same
// epilogues). The arithmetic is the separate ops' own: BF16 rounding of the accumulator as the plain GEMM stores
// it, then add_residual_kernel's __fadd_rn or swiglu_kernel's ops::silu_mul, so the fused results are bit for bit
// those of the unfused chain.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/decoder_ops.cuh"
#include "cuda/gemm_w4a16_layout.h"

namespace futransformer::cuda::w4a16 {

// float(bf16(v)): the value the plain GEMM stores and the separate op reads back (exact widening).
__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
// add_residual_kernel's x + float(delta), one fp32 rounding.
__device__ __forceinline__ float residual_add(float r, float acc) { return __fadd_rn(r, bf16_round(acc)); }
// swiglu_kernel's bf16(silu(g) * u) on the BF16-rounded gate and up values.
__device__ __forceinline__ float swiglu_value(float gate_acc, float up_acc) {
  return ops::silu_mul(bf16_round(gate_acc), bf16_round(up_acc));
}

// The split-K result's one order of additions: the slices' float4 of one output quad added in slice order from slice
// 0 (load(s) returns slice s's), the loads of kInFlight slices issued before their additions so each batch costs one
// round trip. The reduce kernels (from the fp32 workspace) and the cluster finish (from the slices' shared memory)
// both sum through it, so they give the same bits.
template <int kInFlight, class Load>
__device__ __forceinline__ float4 sum_in_slice_order(int splits, Load load) {
  float4 s = load(0);
  for (int base = 1; base < splits; base += kInFlight) {
    float4 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (base + k < splits) v[k] = load(base + k);
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
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

// The output pointers of one launch (one of y / residual is used, by `epilogue`).
struct EpilogueOut {
  Epilogue epilogue;
  __nv_bfloat16* y;  // store_bf16: [M, N]; swiglu_bf16: h [M, N / 2]
  float* residual;   // residual_f32: [M, N] fp32, read and written
  float* partial;    // [splits, M, N] fp32 when splits > 1 (the epilogue is then the reduce kernel's)
  int M, N, splits;
  // Split-K finished inside a thread-block cluster (gemm_w4a16_cluster.cuh): with tile set, a K slice's sums go to
  // this CTA's shared tile [M][tile_cols] (output column col0 + c at c) instead of partial.
  float* tile = nullptr;
  int64_t col0 = 0;
  int tile_cols = 0;
};

// Stores of one 16-row m tile in the mma C layout (v2, and v4's 16-row path): acc(tile, e) is C element e of
// n8 tile `tile` of this lane's 32-column block nb, rows mt * 16 + c_frag_row(lane, e). `epilogue` is a kernel
// argument, so every branch below is warp-uniform.
template <class AccFn>
__device__ __forceinline__ void store_c16_tile(const EpilogueOut& o, int64_t nb, int lane, int mt, int slice,
                                               AccFn acc) {
  const int N = o.N;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = mt * 16 + c_frag_row(lane, 2 * r);
    if (row >= o.M) continue;
    const int64_t col0 = nb * kBlockN + c_frag_col(lane, 0);  // + tile * 8
    if (o.splits > 1 && o.tile != nullptr) {
#pragma unroll
      for (int tile = 0; tile < kTilesPerBlock; ++tile)
        *reinterpret_cast<float2*>(o.tile + static_cast<int64_t>(row) * o.tile_cols + (col0 - o.col0) + tile * 8) =
            make_float2(acc(tile, 2 * r), acc(tile, 2 * r + 1));
    } else if (o.splits > 1) {
#pragma unroll
      for (int tile = 0; tile < kTilesPerBlock; ++tile)
        *reinterpret_cast<float2*>(o.partial + (static_cast<int64_t>(slice) * o.M + row) * N + col0 + tile * 8) =
            make_float2(acc(tile, 2 * r), acc(tile, 2 * r + 1));
    } else if (o.epilogue == Epilogue::store_bf16) {
#pragma unroll
      for (int tile = 0; tile < kTilesPerBlock; ++tile)
        *reinterpret_cast<__nv_bfloat162*>(o.y + static_cast<int64_t>(row) * N + col0 + tile * 8) =
            __floats2bfloat162_rn(acc(tile, 2 * r), acc(tile, 2 * r + 1));
    } else if (o.epilogue == Epilogue::residual_f32) {
#pragma unroll
      for (int tile = 0; tile < kTilesPerBlock; ++tile) {
        float2* p = reinterpret_cast<float2*>(o.residual + static_cast<int64_t>(row) * N + col0 + tile * 8);
        float2 v = *p;
        v.x = residual_add(v.x, acc(tile, 2 * r));
        v.y = residual_add(v.y, acc(tile, 2 * r + 1));
        *p = v;
      }
    } else {
      // Tiles 2p (gate columns 16p + 2t, + 1 of the block) and 2p + 1 (the up columns 8 further): output columns
      // 8p + 2t, + 1 of the block's 16.
#pragma unroll
      for (int p = 0; p < kTilesPerBlock / 2; ++p) {
        const int gt = swiglu_gate_tile(p), ut = swiglu_up_tile(p);
        const int64_t hcol = swiglu_out_col(col0 + gt * 8);
        *reinterpret_cast<__nv_bfloat162*>(o.y + static_cast<int64_t>(row) * (N / 2) + hcol) =
            __floats2bfloat162_rn(swiglu_value(acc(gt, 2 * r), acc(ut, 2 * r)),
                                  swiglu_value(acc(gt, 2 * r + 1), acc(ut, 2 * r + 1)));
      }
    }
  }
}

// Stores of v4's swapped paths: acc(j, e) with j = 2 mt + np is y[m][n], m = 8 mt + swap_c_m(lane, e),
// n = 32 nb + swap_c_n(lane, np, e); single-element accesses (the output, at most 32 rows x 2 bytes per column, is
// small next to the K / 2 weight bytes each column streams).
template <int kSwapTiles, class AccFn>
__device__ __forceinline__ void store_swapped(const EpilogueOut& o, int64_t nb, int lane, int slice, AccFn acc) {
  const int N = o.N;
#pragma unroll
  for (int mt = 0; mt < kSwapTiles; ++mt) {
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      const int j = mt * 2 + np;
      if (o.epilogue == Epilogue::swiglu_bf16 && o.splits == 1) {
        // Element e < 2 holds gate column 16np + g, element e + 2 the up column 8 further, same token row.
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = 8 * mt + swap_c_m(lane, e);
          if (m >= o.M) continue;
          const int64_t n = nb * kBlockN + swap_c_n(lane, np, e);
          o.y[static_cast<int64_t>(m) * (N / 2) + swiglu_out_col(n)] =
              __float2bfloat16_rn(swiglu_value(acc(j, e), acc(j, swiglu_up_elem(e))));
        }
        continue;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 8 * mt + swap_c_m(lane, e);
        if (m >= o.M) continue;
        const int64_t n = nb * kBlockN + swap_c_n(lane, np, e);
        if (o.splits > 1 && o.tile != nullptr) {
          o.tile[static_cast<int64_t>(m) * o.tile_cols + (n - o.col0)] = acc(j, e);
        } else if (o.splits > 1) {
          o.partial[(static_cast<int64_t>(slice) * o.M + m) * N + n] = acc(j, e);
        } else if (o.epilogue == Epilogue::store_bf16) {
          o.y[static_cast<int64_t>(m) * N + n] = __float2bfloat16_rn(acc(j, e));
        } else {
          float* p = o.residual + static_cast<int64_t>(m) * N + n;
          *p = residual_add(*p, acc(j, e));
        }
      }
    }
  }
}

}  // namespace futransformer::cuda::w4a16
