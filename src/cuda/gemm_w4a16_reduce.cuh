// Split-K epilogue of the W4A16 GEMM: the fp32 partial sums of the slices added in slice order (so the result is
// deterministic), then the launch's epilogue (w4a16::Epilogue): BF16 y, an fp32 residual add, or SwiGLU of an
// interleaved gate|up weight — the fused epilogues need no pass of their own when K is split either. Apart from the
// kernels' header because only the launcher (gemm_w4a16.cu) launches these, while the GEMM kernels are
// instantiated in several translation units. Each kernel is launched as a programmatic dependent of the GEMM.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/decoder_ops.cuh"
#include "cuda/gemm_w4a16_epilogue.cuh"
#include "cuda/gemm_w4a16_layout.h"
#include "cuda/ptx/griddep.cuh"
#include "cuda/rmsnorm_row.cuh"

namespace futransformer::cuda::w4a16 {

// Slices loaded per round trip to L2 by sum_slices: the split-K tilings choose up to 11 slices at batch 32, so one
// batch holds them all. Each lane keeps kSlicesInFlight float4 in registers (64 registers at 16).
constexpr int kSlicesInFlight = 16;

// Slices 0, 1, ... of float4 i added in that order (sum_in_slice_order); count4 = M * N / 4 is the slice stride.
__device__ __forceinline__ float4 sum_slices(const float4* __restrict__ partial, int64_t i, int64_t count4,
                                             int splits) {
  return sum_in_slice_order<kSlicesInFlight>(splits, [&](int s) { return partial[s * count4 + i]; });
}

// The reduce kernels' place in the programmatic-launch chain. release_first = 1 (the default): the dependent
// launches at once, so a norm kernel after this one, and the GEMM after the norm, launch while the split GEMM still
// runs and that GEMM fills its weight ring there, as it does behind an unsplit GEMM (at batch 8 the 8B qkv GEMM
// behind the split down GEMM's reduce and the norm extended the layer by ~9.6 µs against ~6 at batch 1);
// 0 (FT_W4A16_REDUCE_RELEASE=exit, read in gemm_w4a16.cu): it launches when this grid exits. Safe either way: a
// dependent's griddepcontrol.wait returns only once this grid has completed and its writes are visible, and every
// kernel of the chain waits before it completes.
__device__ __forceinline__ void release_then_wait(int release_first) {
  if (release_first) ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
}

// y = bf16(sum over slices of partial[s]); count4 = M * N / 4.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_kernel(const float4* __restrict__ partial,
                                                                 __nv_bfloat16* __restrict__ y, int64_t count4,
                                                                 int splits, int release_first) {
  // Launched as a programmatic dependent of the GEMM: wait until its partial sums are complete and visible.
  release_then_wait(release_first);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count4; i += stride) {
    const float4 s = sum_slices(partial, i, count4, splits);
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(y) + 2 * i;
    out[0] = __floats2bfloat162_rn(s.x, s.y);
    out[1] = __floats2bfloat162_rn(s.z, s.w);
  }
}

// residual_add (gemm_w4a16_epilogue.cuh) on the four elements of a float4: r + float(bf16(s)) each.
__device__ __forceinline__ float4 residual_add4(float4 r, const float4& s) {
  r.x = residual_add(r.x, s.x);
  r.y = residual_add(r.y, s.y);
  r.z = residual_add(r.z, s.z);
  r.w = residual_add(r.w, s.w);
  return r;
}

// residual[m, n] += float(bf16(sum over slices)) (Epilogue::residual_f32); residual is [M, N] fp32 like the
// partial sums, so float4 i of both is the same four elements.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_residual_kernel(const float4* __restrict__ partial,
                                                                          float4* __restrict__ residual,
                                                                          int64_t count4, int splits,
                                                                          int release_first) {
  release_then_wait(release_first);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count4; i += stride) {
    // The residual is loaded before the slices, so its L2 round trip overlaps theirs (after the slice loop the
    // compiler would issue it only once the sums are done).
    const float4 r = residual[i];
    residual[i] = residual_add4(r, sum_slices(partial, i, count4, splits));
  }
}

// The residual epilogue that also writes the RMSNorm partials of the rows it leaves (gemm_w4a16_residual_norm_partials,
// layout "Norm partials" in gemm_w4a16_layout.h): thread (row, v) is virtual thread v of rmsnorm_kernel<true>'s
// vthreads = T per row. It updates float4 units v, v + T, ... of its row as gemm_w4a16_reduce_residual_kernel does
// (same additions, same bits) and sums the squares of the results in that order (sum_squares_add from 0.0f); each
// warp, virtual warp v / 32 of the row (T % 32 == 0), reduces by warp_sum_xor and lane 0 stores the partial — the
// value rmsnorm_kernel<true> would compute for it from the updated row. splits == 0: the GEMM added into the residual
// itself (one K slice), so the rows are only read. units = N / 4; launched with rows * T threads (whole warps).
// It releases its dependent before waiting, as rmsnorm_kernel does in the chain it replaces (decoder_ops.cuh,
// pdl_release_then_wait): the norm-prologue GEMM after it launches during the GEMM before it and fills its weight ring
// there. Safe: that GEMM's griddepcontrol.wait returns only after this grid has completed.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_residual_norm_kernel(const float4* __restrict__ partial,
                                                                               float4* __restrict__ residual,
                                                                               float* __restrict__ norm_partials,
                                                                               int rows, int units, int vthreads,
                                                                               int splits) {
  ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= rows * vthreads) return;  // whole warps: rows * vthreads is a multiple of 32
  const int row = g / vthreads, v = g % vthreads;
  const int64_t count4 = static_cast<int64_t>(rows) * units;
  float ss = 0.0f;
  for (int u = v; u < units; u += vthreads) {
    const int64_t i = static_cast<int64_t>(row) * units + u;
    float4 r = residual[i];
    if (splits > 0) {
      r = residual_add4(r, sum_slices(partial, i, count4, splits));
      residual[i] = r;
    }
    ss = ops::sum_squares_add(ss, r);
  }
  ss = ops::warp_sum_xor(ss);
  if (threadIdx.x % kWarpSize == 0) norm_partials[norm_partial_index(row, v / kWarpSize, vthreads / kWarpSize)] = ss;
}

// The residual epilogue followed by the RMSNorm of the rows it leaves (gemm_w4a16_residual_rmsnorm), for a split K:
// one CTA per row of T = rmsnorm_threads(N, true) threads (rmsnorm_kernel<true>'s launch shape), thread v owning the
// row's float4 units v, v + T, ... (at most kResidualNormMaxUnits). Each unit is updated as
// gemm_w4a16_reduce_residual_kernel updates it (the same additions in slice order, stored back) and kept in
// registers; the squares are summed in rmsnorm_kernel<true>'s order (rmsnorm_row.cuh: per thread from 0.0f in unit
// order, warp butterfly, warps in order), and y = bf16(w · (s · x)) from the registers. So: the bits of the reduce
// kernel followed by rmsnorm_bf16, in one kernel and without re-reading the rows. It releases its dependent first, as
// rmsnorm_kernel does in the chain it replaces (the GEMM after it fills its weight ring during the split GEMM); the
// norm weight's first float4 is read before the wait (a constant of the pass), as that kernel does. At 1024 threads
// a thread has 64 registers: kResidualNormSlicesInFlight slices in flight (the order of the additions does not
// depend on it) keep the units and the loads in registers.
constexpr int kResidualNormMaxUnits = 2;        // N <= 8192 (T = 1024 threads)
constexpr int kResidualNormSlicesInFlight = 8;  // 11 slices (the 8B tilings' most): two round trips
__global__ void __launch_bounds__(ops::kMaxBlockThreads)
    gemm_w4a16_reduce_residual_rmsnorm_kernel(const float4* __restrict__ partial, float4* __restrict__ residual,
                                              int64_t count4, int splits, const float4* __restrict__ weight,
                                              __nv_bfloat16* __restrict__ y, int hidden, float eps) {
  __shared__ float red[ops::kWarp];
  const int units = hidden / 4, T = static_cast<int>(blockDim.x), v = static_cast<int>(threadIdx.x);
  const float4 w_first = v < units ? __ldg(weight + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * units;
  float4 x[kResidualNormMaxUnits];
#pragma unroll
  for (int k = 0; k < kResidualNormMaxUnits; ++k)  // the residual first: its round trip overlaps the slices'
    if (v + k * T < units) x[k] = residual[base + v + k * T];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kResidualNormMaxUnits; ++k) {
    if (v + k * T < units) {
      const int64_t i = base + v + k * T;
      x[k] = residual_add4(
          x[k], sum_in_slice_order<kResidualNormSlicesInFlight>(splits, [&](int s) { return partial[s * count4 + i]; }));
      residual[i] = x[k];
      ss = ops::sum_squares_add(ss, x[k]);
    }
  }
  const float s = ops::rms_scale(ops::block_sum(ss, red), hidden, eps);
  uint2* yr = reinterpret_cast<uint2*>(y) + base;
#pragma unroll
  for (int k = 0; k < kResidualNormMaxUnits; ++k) {
    if (v + k * T < units) {
      const float4 w = k == 0 ? w_first : __ldg(weight + v + k * T);
      yr[v + k * T] = ops::rmsnorm_scale_bf16x4(x[k], w, s);
    }
  }
}

// h[m, j .. j + 3] = bf16(silu(g) * u) (Epilogue::swiglu_bf16) for the gate|up partial sums of an interleaved
// weight (N = 2 inter packed columns): gate j .. j + 3 are four consecutive packed columns (j % 4 == 0 and runs of
// kSwiGluRun = 8 never split a float4), up j .. j + 3 the four kSwiGluRun columns further. count4 = M * N / 4 (the
// slice stride), inter4 = inter / 4; h is 8-byte aligned.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_swiglu_kernel(const float4* __restrict__ partial,
                                                                        __nv_bfloat16* __restrict__ h,
                                                                        int64_t count4, int inter4, int splits,
                                                                        int release_first) {
  static_assert(kSwiGluRun % 4 == 0, "a float4 of partial sums must lie inside one gate or up run");
  release_then_wait(release_first);
  const int64_t outputs4 = count4 / 2;  // M * inter / 4
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < outputs4; i += stride) {
    const int64_t m = i / inter4, j = (i % inter4) * 4;
    const int64_t g4 = (m * 8 * inter4 + swiglu_gate_col(j)) / 4;  // row m of the N = 8 inter4 packed columns
    const float4 g = sum_slices(partial, g4, count4, splits);
    const float4 u = sum_slices(partial, g4 + kSwiGluRun / 4, count4, splits);
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(h) + 2 * i;
    out[0] = __floats2bfloat162_rn(swiglu_value(g.x, u.x), swiglu_value(g.y, u.y));
    out[1] = __floats2bfloat162_rn(swiglu_value(g.z, u.z), swiglu_value(g.w, u.w));
  }
}

}  // namespace futransformer::cuda::w4a16
