// The W4A16 GEMM's RMSNorm prologue (gemm_w4a16_rmsnorm*, the v4 swapped path with M <= 8): the end of the kernel's
// prologue when its activations are RMSNorm(x) of fp32 rows x (the residual stream) rather than BF16 rows. It
// replaces wait_then_stage_rows (gemm_w4a16.cuh) and stages, for the CTA's K slice, exactly the BF16 values
// rmsnorm_bf16 would have written for the plain GEMM to read: each row's scale s in rmsnorm_kernel<true>'s summation
// order (the maps are in gemm_w4a16_layout.h, "RMSNorm prologue"; the arithmetic is rmsnorm_row.cuh's), then
// bf16(w · (s · x)) in rmsnorm_store_row's operation order. The staged tile is therefore the plain kernel's, and
// so is everything after it: bit for bit rmsnorm_bf16 followed by gemm_w4a16 on the same tiling.
//
// Every CTA (every split-K slice as well) reads its rows in full for the sums: M x K x 4 bytes from L2, at most
// 8 x 16 KB per CTA for an 8B layer's hidden 4096 — the price of not launching the norm kernel (3 us at batch 1).
// Unless the launch brings the rows' norm partials (NormKernelArgs::norm_partials, written by the residual GEMM before
// it: gemm_w4a16_reduce_residual_norm_kernel): then no CTA sums rows; each adds the partials in the same order.
#pragma once

#include "cuda/gemm_w4a16.cuh"
#include "cuda/rmsnorm_row.cuh"

namespace futransformer::cuda::w4a16 {

// The arguments of a norm-prologue instance: the plain kernel's (x unused) and the norm's. A type of its own rather
// than members added to KernelArgs: a larger KernelArgs changed the plain instances' code (register allocation and
// parameter loads), and those must stay exactly as they are.
struct NormKernelArgs : KernelArgs {
  const float* x_f32;        // [M, K] fp32 rows (the residual stream), 16-byte aligned
  const float* norm_weight;  // [K] fp32, 16-byte aligned
  float eps;
  // nullptr: pass 1 below sums the rows' squares. Otherwise the rows' partials as gemm_w4a16_residual_norm_partials
  // wrote them ([M][rmsnorm_threads(K, true) / 32], gemm_w4a16_layout.h "Norm partials"): pass 1 is skipped.
  const float* norm_partials;
};

// After the weights and scales were issued (cp.async groups in flight): griddepcontrol.wait (x is the previous
// kernel's output), the row scales into scratch (kNormScratchFloats fp32 of shared memory nothing else uses), the
// slice's normalised rows into a_s with row pitch `pitch`, then every cp.async group and the whole CTA waited for,
// as wait_then_stage_rows does. Launcher's guarantees: rows <= kNormMaxRows, K % 32 == 0, x_f32 and norm_weight
// 16-byte aligned (rmsnorm_vec's conditions: the float4 instance is the one whose order is reproduced).
template <int kThreadsCta>
__device__ __forceinline__ void wait_then_stage_norm_rows(const NormKernelArgs& args, int rows, int64_t k0, int slice_k,
                                                          int64_t pitch, __nv_bfloat16* a_s, float* scratch, int tid) {
  static_assert(kThreadsCta % kWarpSize == 0, "the CTA is whole warps: each plays whole virtual warps");
  constexpr int kRealWarps = kThreadsCta / kWarpSize;
  const int K = args.K, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int units = K / 4;
  const int vthreads = ops::rmsnorm_threads(K, true);
  const int vwarps = vthreads / kWarpSize;
  const int rounds = (units + vthreads - 1) / vthreads;
  const int pairs = rows * vwarps;
  const float4* x4 = reinterpret_cast<const float4*>(args.x_f32);

  const float4* w4 = reinterpret_cast<const float4*>(args.norm_weight);
  const int row_chunks = slice_k / 8;
  if (args.norm_partials != nullptr) {
    // The sums come from the kernel that wrote x: no pass 1, no scratch and no barrier before pass 2. Each warp
    // derives the row scales itself — lane r < rows adds row r's partials in virtual-warp order from 0.0f, as the
    // threads below do from scratch, and a shuffle gives every lane all of them. This thread's first chunk of x is
    // asked into L1 before that (its weight chunk before the wait), so its round trip to L2 overlaps the partials'.
    // (Asking for every chunk this thread stages measured slower at batch 8: docs/results.md, eighteenth session.)
    const int chunks = rows * row_chunks;
    const bool has_chunk = tid < chunks;
    const int64_t u0 = (k0 + (tid % row_chunks) * 8) / 4;
    if (has_chunk) ptx::prefetch_l1(w4 + u0);  // constant: asked for before the wait
    ptx::griddepcontrol_wait();
    if (has_chunk) ptx::prefetch_l1(x4 + static_cast<int64_t>(tid / row_chunks) * units + u0);
    float s_lane = 0.0f;
    if (lane < rows) {
      // Eight at a time (few registers: the 28-warp instances have 72 per thread): the first eight loads bring the
      // row's 128-byte line into L1, where the later ones find it.
      const float* p = args.norm_partials + norm_partial_index(lane, 0, vwarps);
      float total = 0.0f;
#pragma unroll 1
      for (int w0 = 0; w0 < vwarps; w0 += 8) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = w0 + i < vwarps ? p[w0 + i] : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (w0 + i < vwarps) total = __fadd_rn(total, v[i]);
        }
      }
      s_lane = ops::rms_scale(total, K, args.eps);
    }
    float s_row[kNormMaxRows];
#pragma unroll
    for (int r = 0; r < kNormMaxRows; ++r) s_row[r] = __shfl_sync(0xffffffffu, s_lane, r);
    auto scale_of = [&](int r) {  // s_row[r] without a local-memory array
      float s = s_row[0];
#pragma unroll
      for (int i = 1; i < kNormMaxRows; ++i) s = r == i ? s_row[i] : s;
      return s;
    };
    auto store_chunk = [&](int c, const float4& xa, const float4& xb, const float4& wa, const float4& wb) {
      const int r = c / row_chunks, cc = c % row_chunks;
      const float s = scale_of(r);
      const uint2 lo = ops::rmsnorm_scale_bf16x4(xa, wa, s), hi = ops::rmsnorm_scale_bf16x4(xb, wb, s);
      *reinterpret_cast<uint4*>(a_s + r * pitch + cc * 8) = make_uint4(lo.x, lo.y, hi.x, hi.y);
    };
#pragma unroll 2
    for (int c = tid; c < chunks; c += kThreadsCta) {
      const int r = c / row_chunks, cc = c % row_chunks;
      const int64_t u = (k0 + cc * 8) / 4;
      const float4* xr = x4 + static_cast<int64_t>(r) * units + u;
      store_chunk(c, xr[0], xr[1], __ldg(w4 + u), __ldg(w4 + u + 1));
    }
    ptx::cp_async_wait_group<0>();  // the weight and scale groups (see wait_then_stage_rows)
    __syncthreads();
    return;
  }
  ptx::griddepcontrol_wait();
  // Pass 1: kNormBatch (row, virtual warp) pairs per step, their loads independent of one another.
  for (int step = 0; norm_pair(warp, kRealWarps, step, 0) < pairs; ++step) {
    const float4* src[kNormBatch];
    int first[kNormBatch];  // this lane's first unit in the pair's row; `units` (none) for a pair past the end
#pragma unroll
    for (int b = 0; b < kNormBatch; ++b) {
      const int p = norm_pair(warp, kRealWarps, step, b);
      const int m = norm_pair_row(p, vwarps), vw = norm_pair_vwarp(p, vwarps);
      first[b] = p < pairs ? norm_unit(vw, lane, 0, vthreads) : units;
      src[b] = x4 + static_cast<int64_t>(p < pairs ? m : 0) * units;
    }
    float ss[kNormBatch];
#pragma unroll
    for (int b = 0; b < kNormBatch; ++b) ss[b] = 0.0f;
    for (int j = 0; j < rounds; ++j) {
#pragma unroll
      for (int b = 0; b < kNormBatch; ++b) {
        const int u = first[b] + j * vthreads;  // norm_unit(vw, lane, j, vthreads)
        if (u < units) ss[b] = ops::sum_squares_add(ss[b], src[b][u]);
      }
    }
#pragma unroll
    for (int b = 0; b < kNormBatch; ++b) {
      const int p = norm_pair(warp, kRealWarps, step, b);
      if (p < pairs) {  // warp-uniform: the butterfly's shuffles see the full warp
        const float v = ops::warp_sum_xor(ss[b]);
        if (lane == 0) scratch[p] = v;  // = norm_partial_index(row, vw, vwarps)
      }
    }
  }
  __syncthreads();
  if (tid < rows) {
    float total = 0.0f;
    for (int w = 0; w < vwarps; ++w) total = __fadd_rn(total, scratch[norm_partial_index(tid, w, vwarps)]);
    scratch[norm_scale_index(tid)] = ops::rms_scale(total, K, args.eps);
  }
  __syncthreads();

  // Pass 2: the slice's columns k0 .. k0 + slice_k of each row, 8 per thread and step (16 bytes of a_s): the chunks
  // of stage_slice_rows. The weight is constant: read-only path.
#pragma unroll 2
  for (int c = tid; c < rows * row_chunks; c += kThreadsCta) {
    const int r = c / row_chunks, cc = c % row_chunks;
    const int64_t u = (k0 + cc * 8) / 4;  // float4 unit of the chunk's first column
    const float4* xr = x4 + static_cast<int64_t>(r) * units + u;
    const float4 xa = xr[0], xb = xr[1];
    const float4 wa = __ldg(w4 + u), wb = __ldg(w4 + u + 1);
    const float s = scratch[norm_scale_index(r)];
    const uint2 lo = ops::rmsnorm_scale_bf16x4(xa, wa, s), hi = ops::rmsnorm_scale_bf16x4(xb, wb, s);
    *reinterpret_cast<uint4*>(a_s + r * pitch + cc * 8) = make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
  ptx::cp_async_wait_group<0>();  // the weight and scale groups (see wait_then_stage_rows)
  __syncthreads();
}

}  // namespace futransformer::cuda::w4a16
