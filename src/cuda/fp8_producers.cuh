// Kernels of the FP8 prefill producers (launchers and the contract: include/futransformer/cuda/fp8_producers.h).
//
// One CTA per row. A row's scale needs the whole row's amax before its first code can be written, so each kernel
// makes two passes over the row: pass 1 computes y, its amax and whether it is all finite; pass 2 computes y again
// (the same instructions on the same inputs give the same bits) and writes the codes. Recomputing instead of
// staging y keeps shared memory free for any width (a 28672-wide fp32 row would need 112 KB) and costs only L1/L2
// re-reads: the row was just read by pass 1. y itself is computed by decoder_ops.cuh's device functions, so it is
// bit for bit the value the BF16 ops would round. Rows up to kRegUnits units per thread (every Llama-8B/70B shape
// except SwiGLU at inter 28672) take the row-in-registers kernels below instead: one pass over memory, same bits.
// Every code is y / s, the IEEE quotient, computed through one reciprocal per row (divisor::with_divisor,
// shared_divisor.h) when s is in that header's domain — every row scale but a NaN or one under 2^-60.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/decoder_ops.cuh"
#include "cuda/fp8_block_quant.cuh"
#include "cuda/hadamard_lanes.cuh"
#include "cuda/ptx/cvt.cuh"
#include "cuda/shared_divisor.h"

namespace futransformer::cuda::fp8p {

using ops::kMaxBlockThreads;
using ops::kWarp;

constexpr float kFp8Max = 448.0f;  // formats::kFp8E4M3Max
constexpr int kRmsnormVec = 4;     // fp32 values per 16-byte load of x (rmsnorm_bf16's float4 units)
constexpr int kBf16Vec = 8;        // BF16 values per 16-byte load

// Maximum of v over the block, identical in every thread. max is exact and commutative, so unlike block_sum the
// order does not matter. Once per kernel (`red` is not re-synchronised for a second call).
__device__ __forceinline__ float block_max(float v, float* red /* [kWarp] shared */) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = 0.0f;
  const int warps = blockDim.x / kWarp;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, red[w]);
  return m;
}

// V codes of consecutive values in memory order (byte 0 = y[0]); the E4M3 conversion works on pairs.
template <int V>
__device__ __forceinline__ void store_codes(uint8_t* dst, const float (&q)[V]) {
  if constexpr (V == 1) {
    *dst = static_cast<uint8_t>(ptx::cvt_rn_satfinite_e4m3x2_f32(q[0], 0.0f));
  } else if constexpr (V == 4) {
    const uint32_t lo = ptx::cvt_rn_satfinite_e4m3x2_f32(q[0], q[1]), hi = ptx::cvt_rn_satfinite_e4m3x2_f32(q[2], q[3]);
    *reinterpret_cast<uint32_t*>(dst) = lo | (hi << 16);  // dst 4-byte aligned (launcher)
  } else {
    static_assert(V == 8, "units are 1, 4 or 8 values");
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = ptx::cvt_rn_satfinite_e4m3x2_f32(q[2 * k], q[2 * k + 1]);
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));  // dst 8-byte aligned
  }
}

// Per-token FP8 of one row of `units` × V values, where gen(u, y) computes the V values of unit u (thread t handles
// units t, t + blockDim.x, ... in both passes). codes: the row's codes; scale: where its scale goes; y_debug: the
// row's fp32 y, or null. Every thread of the block must call this (it synchronises).
template <int V, class Gen>
__device__ __forceinline__ void quantize_row(const Gen& gen, int units, uint8_t* codes, float* scale, float* y_debug,
                                             float* red /* [kWarp] shared */) {
  float amax = 0.0f;
  int finite = 1;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    float y[V];
    gen(u, y);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      finite &= isfinite(y[k]) ? 1 : 0;
      amax = fmaxf(amax, fabsf(y[k]));
      if (y_debug) y_debug[u * V + k] = y[k];
    }
  }
  // fmaxf drops NaNs, so a non-finite y is tracked apart; the CPU quantiser refuses such a row (throws), here it
  // becomes a NaN scale, which makes every code below NaN (y / NaN) and the GEMM's output row NaN.
  const bool all_finite = __syncthreads_and(finite) != 0;
  amax = block_max(amax, red);
  // formats::fp8_scale_for_amax: IEEE division (not a reciprocal multiply), unit scale when amax / 448 is 0.
  float s = __fdiv_rn(amax, kFp8Max);
  if (!(s > 0.0f)) s = 1.0f;
  if (!all_finite) s = ops::nan_f32();
  if (threadIdx.x == 0) *scale = s;
  divisor::with_divisor(s, [&](const auto& div) {
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
      float y[V];
      gen(u, y);
#pragma unroll
      for (int k = 0; k < V; ++k) y[k] = div(y[k]);
      store_codes<V>(codes + u * V, y);
    }
  });
}

// The scale step of quantize_row, once every thread holds its amax and finite flag: the same reduction, the same
// IEEE division and the same special cases, so the same bits. Every thread of the block must call this.
__device__ __forceinline__ float row_scale(float amax, int finite, float* scale, float* red /* [kWarp] shared */) {
  const bool all_finite = __syncthreads_and(finite) != 0;
  amax = block_max(amax, red);
  float s = __fdiv_rn(amax, kFp8Max);
  if (!(s > 0.0f)) s = 1.0f;
  if (!all_finite) s = ops::nan_f32();
  if (threadIdx.x == 0) *scale = s;
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Row-in-registers variants (the prefill shapes). quantize_row above computes y twice and, with one thread per
// 16-byte unit up to 1024, gives an SM two 1024-thread rows whose threads all wait at the same barriers: the load,
// the reductions and the stores of a row never overlap another's (SwiGLU at 2048 x 14336 ran at a third of the DRAM
// roofline). Here a thread keeps kRegUnits units of y in registers, so each input byte is read once and y is
// computed once (SwiGLU's expf and two divisions are the kernel's arithmetic bound), and a row takes a quarter of
// the threads, so several rows at different phases share an SM. amax, the finite flag and hence the scale and codes
// do not depend on which thread owns which unit (max is exact and commutative): the bits are quantize_row's.
constexpr int kRegUnits = 4;         // 16-byte units per thread held in registers
constexpr int kRegMaxThreads = 512;  // rows of up to kRegUnits * 512 units take this path (SwiGLU: inter <= 16384)

// Codes of one thread's units (unit u = threadIdx.x + k * blockDim.x) from its y registers.
template <int V, int kUnits>
__device__ __forceinline__ void store_units(const float (&y)[kUnits][V], int units, uint8_t* codes, float s) {
  divisor::with_divisor(s, [&](const auto& div) {
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
      if (u >= units) break;
      float q[V];
#pragma unroll
      for (int e = 0; e < V; ++e) q[e] = div(y[k][e]);
      store_codes<V>(codes + static_cast<int64_t>(u) * V, q);
    }
  });
}

// amax, finite flag and debug copy of one thread's y registers.
template <int V, int kUnits>
__device__ __forceinline__ void scan_units(const float (&y)[kUnits][V], int units, float* y_debug, float& amax,
                                           int& finite) {
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u >= units) break;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      finite &= isfinite(y[k][e]) ? 1 : 0;
      amax = fmaxf(amax, fabsf(y[k][e]));
      if (y_debug) y_debug[static_cast<int64_t>(u) * V + e] = y[k][e];
    }
  }
}

// SwiGLU → FP8, row in registers: 16-byte units of 8 values, gate_up 16-byte aligned, inter % 8 == 0, codes 8-byte
// aligned, inter / 8 <= kRegUnits * blockDim.x. The gate and up halves are read exactly once (evict-first: 117 MB
// at 2048 rows would otherwise push the next GEMM's weights out of L2).
__global__ void __launch_bounds__(kRegMaxThreads)
    swiglu_fp8_reg_kernel(const __nv_bfloat16* gate_up, uint8_t* codes, float* scales, float* y_debug, int inter) {
  ops::pdl_prologue();
  __shared__ float red_max[kWarp];
  const int units = inter / kBf16Vec;
  const uint4* g8 = reinterpret_cast<const uint4*>(gate_up + static_cast<int64_t>(blockIdx.x) * 2 * inter);
  const uint4* u8 = g8 + units;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * inter;
  // All loads first: 2 x kRegUnits 16-byte loads in flight per thread before any arithmetic.
  uint4 gr[kRegUnits], ur[kRegUnits];
#pragma unroll
  for (int k = 0; k < kRegUnits; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u < units) {
      gr[k] = __ldcs(g8 + u);
      ur[k] = __ldcs(u8 + u);
    }
  }
  float y[kRegUnits][kBf16Vec];
#pragma unroll
  for (int k = 0; k < kRegUnits; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u >= units) break;
    float gf[kBf16Vec], uf[kBf16Vec];
    ops::bf16x8_to_f32(gr[k], gf);
    ops::bf16x8_to_f32(ur[k], uf);
#pragma unroll
    for (int e = 0; e < kBf16Vec; ++e) y[k][e] = ops::silu_mul(gf[e], uf[e]);
  }
  float amax = 0.0f;
  int finite = 1;
  scan_units<kBf16Vec, kRegUnits>(y, units, y_debug ? y_debug + row : nullptr, amax, finite);
  const float s = row_scale(amax, finite, scales + blockIdx.x, red_max);
  store_units<kBf16Vec, kRegUnits>(y, units, codes + row, s);
}

// BF16 rows → FP8, row in registers: cols % 8 == 0, row_stride % 8 == 0, x 16-byte and codes 8-byte aligned,
// cols / 8 <= kRegUnits * blockDim.x. The attention output is read once (evict-first).
__global__ void __launch_bounds__(kRegMaxThreads)
    quantize_rows_fp8_reg_kernel(const __nv_bfloat16* x, int64_t row_stride, uint8_t* codes, float* scales,
                                 int cols) {
  ops::pdl_prologue();
  __shared__ float red_max[kWarp];
  const int units = cols / kBf16Vec;
  const uint4* x8 = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(blockIdx.x) * row_stride);
  uint4 xr[kRegUnits];
#pragma unroll
  for (int k = 0; k < kRegUnits; ++k) {
    const int u = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (u < units) xr[k] = __ldcs(x8 + u);
  }
  float y[kRegUnits][kBf16Vec];
#pragma unroll
  for (int k = 0; k < kRegUnits; ++k) {
    if (static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x) >= units) break;
    ops::bf16x8_to_f32(xr[k], y[k]);
  }
  float amax = 0.0f;
  int finite = 1;
  scan_units<kBf16Vec, kRegUnits>(y, units, nullptr, amax, finite);
  const float s = row_scale(amax, finite, scales + blockIdx.x, red_max);
  store_units<kBf16Vec, kRegUnits>(y, units, codes + static_cast<int64_t>(blockIdx.x) * cols, s);
}

// Un-rotation + FP8 of the int4-hadamard attention output (unrotate_rows_fp8), row in registers: one CTA per row,
// thread t holds channels 16 t .. 16 t + 15 (head t / kLanes, lane t % kLanes of it: hadamard_lanes.cuh's layout,
// the one rotate_heads_bf16's vector kernel uses, so the same fp32 operations per pair), rounds them to BF16 as that
// kernel stores them, and then quantises the row as quantize_rows_fp8_reg_kernel does (amax and the finite flag are
// order-free; the scale is row_scale's). Threads past the row (the last warp's tail) hold zeros and join the
// shuffles. Requirements (launcher): cols = 16 · active threads, row_stride % 8 == 0, x 16-byte and codes 8-byte
// aligned.
template <int kLanes>
__global__ void __launch_bounds__(kMaxBlockThreads)
    unrotate_rows_fp8_kernel(const __nv_bfloat16* x, int64_t row_stride, uint8_t* codes, float* scales, int cols,
                             int block, float scale) {
  constexpr int kVec = hadamard::kLaneChannels;
  ops::pdl_prologue();
  __shared__ float red_max[kWarp];
  const int t = static_cast<int>(threadIdx.x);
  const bool active = t * kVec < cols;
  uint4 v[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
  if (active) {
    const uint4* p = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(blockIdx.x) * row_stride + t * kVec);
    v[0] = __ldcs(p);
    v[1] = __ldcs(p + 1);
  }
  float y[2][kBf16Vec];
  ops::bf16x8_to_f32(v[0], y[0]);
  ops::bf16x8_to_f32(v[1], y[1]);
  float h[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) h[j] = y[j / kBf16Vec][j % kBf16Vec];
  hadamard::blocks_over_lanes<kLanes>(h, t % kLanes, block, scale);
  float amax = 0.0f;
  int finite = 1;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float b = __bfloat162float(__float2bfloat16_rn(h[j]));  // the BF16 rotate_heads_bf16 stores
    y[j / kBf16Vec][j % kBf16Vec] = b;
    if (active) {
      finite &= isfinite(b) ? 1 : 0;
      amax = fmaxf(amax, fabsf(b));
    }
  }
  const float s = row_scale(amax, finite, scales + blockIdx.x, red_max);
  if (!active) return;
  divisor::with_divisor(s, [&](const auto& div) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      float q[kBf16Vec];
#pragma unroll
      for (int e = 0; e < kBf16Vec; ++e) q[e] = div(y[k][e]);
      store_codes<kBf16Vec>(codes + static_cast<int64_t>(blockIdx.x) * cols + t * kVec + k * kBf16Vec, q);
    }
  });
}

// RMSNorm → FP8, row in registers, with rmsnorm_kernel's summation order kept exactly. That order is defined by a
// block of VT = ops::rmsnorm_threads(hidden, true) threads: virtual thread v sums the squares of float4 units
// v, v + VT, ... (one fused multiply-add per element, in index order), each warp of 32 virtual threads reduces by
// the xor butterfly, and the VT / 32 warp partials are added in warp order. Here a real CTA of VT / K threads plays
// that block: real warp w, lane l is virtual thread (w K + i) 32 + l for each i < K, holding that virtual thread's
// kIter units in registers; the K butterflies are the same shuffles on K registers, and red_sum[] receives the
// same VT / 32 partials in the same slots. So s, y and the codes are rmsnorm_fp8_kernel's bits, the BF16 sibling
// rmsnorm_bf16 still rounds the same y, and x is read from DRAM once (16 KB per row at hidden 4096, 8 rows per SM
// in flight instead of 2 rows of 1024 threads). Requirements (launcher): hidden % 4 == 0, x and weight 16-byte
// aligned, codes 4-byte aligned, (VT / 32) % K == 0, hidden / 4 <= kIter * VT.
template <int K, int kIter>
__global__ void __launch_bounds__(kMaxBlockThreads)
    rmsnorm_fp8_reg_kernel(const float* x, const float* weight, uint8_t* codes, float* scales, float* y_debug,
                           int hidden, float eps) {
  ops::pdl_prologue();
  __shared__ float red_sum[kWarp], red_max[kWarp];
  const int units = hidden / kRmsnormVec;
  const int vt_count = K * static_cast<int>(blockDim.x);
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  const float4* x4 = reinterpret_cast<const float4*>(x + row);
  float4 v[K][kIter];
#pragma unroll
  for (int i = 0; i < K; ++i) {
#pragma unroll
    for (int k = 0; k < kIter; ++k) {
      const int j = (warp * K + i) * kWarp + lane + k * vt_count;
      if (j < units) v[i][k] = x4[j];
    }
  }
  float ss[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    ss[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kIter; ++k) {
      if ((warp * K + i) * kWarp + lane + k * vt_count < units) ss[i] = ops::sum_squares_add(ss[i], v[i][k]);
    }
  }
  // ops::block_sum, once per virtual warp.
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < K; ++i) ss[i] = __fadd_rn(ss[i], __shfl_xor_sync(0xffffffffu, ss[i], off));
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < K; ++i) red_sum[warp * K + i] = ss[i];
  }
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < vt_count / kWarp; ++w) total = __fadd_rn(total, red_sum[w]);
  const float s = ops::rms_scale(total, hidden, eps);

  const float4* w4 = reinterpret_cast<const float4*>(weight);
  float* yd = y_debug ? y_debug + row : nullptr;
  float amax = 0.0f;
  int finite = 1;
#pragma unroll
  for (int i = 0; i < K; ++i) {
#pragma unroll
    for (int k = 0; k < kIter; ++k) {
      const int j = (warp * K + i) * kWarp + lane + k * vt_count;
      if (j >= units) continue;
      const float4 w = __ldg(w4 + j);
      float4& y = v[i][k];  // y replaces x in place
      y.x = __fmul_rn(w.x, __fmul_rn(s, y.x));
      y.y = __fmul_rn(w.y, __fmul_rn(s, y.y));
      y.z = __fmul_rn(w.z, __fmul_rn(s, y.z));
      y.w = __fmul_rn(w.w, __fmul_rn(s, y.w));
      finite &= (isfinite(y.x) && isfinite(y.y) && isfinite(y.z) && isfinite(y.w)) ? 1 : 0;
      amax = fmaxf(fmaxf(amax, fmaxf(fabsf(y.x), fabsf(y.y))), fmaxf(fabsf(y.z), fabsf(y.w)));
      if (yd) {  // y_debug carries no alignment requirement
        yd[kRmsnormVec * j] = y.x;
        yd[kRmsnormVec * j + 1] = y.y;
        yd[kRmsnormVec * j + 2] = y.z;
        yd[kRmsnormVec * j + 3] = y.w;
      }
    }
  }
  const float q_scale = row_scale(amax, finite, scales + blockIdx.x, red_max);
  uint8_t* cr = codes + row;
  divisor::with_divisor(q_scale, [&](const auto& div) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
#pragma unroll
      for (int k = 0; k < kIter; ++k) {
        const int j = (warp * K + i) * kWarp + lane + k * vt_count;
        if (j >= units) continue;
        const float q[kRmsnormVec] = {div(v[i][k].x), div(v[i][k].y), div(v[i][k].z), div(v[i][k].w)};
        store_codes<kRmsnormVec>(cr + static_cast<int64_t>(j) * kRmsnormVec, q);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// RMSNorm → FP8. The sum of squares is rmsnorm_kernel's, element for element and in the same thread/warp order
// (the launcher picks the same vector flag and block size as rmsnorm_bf16 does for the same x, weight and
// alignment), so s and y = w · (s · x) are the bits rmsnorm_bf16 rounds to BF16. kVec: hidden % 4 == 0, x and
// weight 16-byte aligned, codes 4-byte aligned.
template <bool kVec>
__global__ void __launch_bounds__(kMaxBlockThreads)
    rmsnorm_fp8_kernel(const float* x, const float* weight, uint8_t* codes, float* scales, float* y_debug, int hidden,
                       float eps) {
  ops::pdl_prologue();
  __shared__ float red_sum[kWarp], red_max[kWarp];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  const float* xr = x + row;
  float* yd = y_debug ? y_debug + row : nullptr;
  float ss = 0.0f;
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int j = threadIdx.x; j < hidden / kRmsnormVec; j += blockDim.x) ss = ops::sum_squares_add(ss, x4[j]);
  } else {
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) ss = ops::sum_squares_add(ss, xr[j]);
  }
  const float s = ops::rms_scale(ops::block_sum(ss, red_sum), hidden, eps);
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    // The weight is shared by every row: __ldg keeps it on the read-only path, as rmsnorm_store_row does.
    const auto gen = [&](int j, float(&y)[kRmsnormVec]) {
      const float4 v = x4[j], w = __ldg(w4 + j);
      y[0] = __fmul_rn(w.x, __fmul_rn(s, v.x));
      y[1] = __fmul_rn(w.y, __fmul_rn(s, v.y));
      y[2] = __fmul_rn(w.z, __fmul_rn(s, v.z));
      y[3] = __fmul_rn(w.w, __fmul_rn(s, v.w));
    };
    quantize_row<kRmsnormVec>(gen, hidden / kRmsnormVec, codes + row, scales + blockIdx.x, yd, red_max);
  } else {
    const auto gen = [&](int j, float(&y)[1]) { y[0] = __fmul_rn(weight[j], __fmul_rn(s, xr[j])); };
    quantize_row<1>(gen, hidden, codes + row, scales + blockIdx.x, yd, red_max);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// BF16 rows → FP8 (the widening is exact). kVec: cols % 8 == 0, row_stride % 8 == 0, x 16-byte aligned, codes
// 8-byte aligned.
template <bool kVec>
__global__ void __launch_bounds__(kMaxBlockThreads)
    quantize_rows_fp8_kernel(const __nv_bfloat16* x, int64_t row_stride, uint8_t* codes, float* scales, int cols) {
  ops::pdl_prologue();
  __shared__ float red_max[kWarp];
  const __nv_bfloat16* xr = x + static_cast<int64_t>(blockIdx.x) * row_stride;
  uint8_t* cr = codes + static_cast<int64_t>(blockIdx.x) * cols;
  if constexpr (kVec) {
    const uint4* x8 = reinterpret_cast<const uint4*>(xr);
    const auto gen = [&](int j, float(&y)[kBf16Vec]) { ops::bf16x8_to_f32(x8[j], y); };
    quantize_row<kBf16Vec>(gen, cols / kBf16Vec, cr, scales + blockIdx.x, nullptr, red_max);
  } else {
    const auto gen = [&](int j, float(&y)[1]) { y[0] = __bfloat162float(xr[j]); };
    quantize_row<1>(gen, cols, cr, scales + blockIdx.x, nullptr, red_max);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// SwiGLU → FP8: y = ops::silu_mul(g, u), swiglu_kernel's expression. kVec: inter % 8 == 0, gate_up 16-byte
// aligned, codes 8-byte aligned.
template <bool kVec>
__global__ void __launch_bounds__(kMaxBlockThreads)
    swiglu_fp8_kernel(const __nv_bfloat16* gate_up, uint8_t* codes, float* scales, float* y_debug, int inter) {
  ops::pdl_prologue();
  __shared__ float red_max[kWarp];
  const __nv_bfloat16* g = gate_up + static_cast<int64_t>(blockIdx.x) * 2 * inter;
  const __nv_bfloat16* u = g + inter;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * inter;
  float* yd = y_debug ? y_debug + row : nullptr;
  if constexpr (kVec) {
    const uint4* g8 = reinterpret_cast<const uint4*>(g);
    const uint4* u8 = reinterpret_cast<const uint4*>(u);
    const auto gen = [&](int j, float(&y)[kBf16Vec]) {
      float gf[kBf16Vec], uf[kBf16Vec];
      ops::bf16x8_to_f32(g8[j], gf);
      ops::bf16x8_to_f32(u8[j], uf);
#pragma unroll
      for (int k = 0; k < kBf16Vec; ++k) y[k] = ops::silu_mul(gf[k], uf[k]);
    };
    quantize_row<kBf16Vec>(gen, inter / kBf16Vec, codes + row, scales + blockIdx.x, yd, red_max);
  } else {
    const auto gen = [&](int j, float(&y)[1]) { y[0] = ops::silu_mul(__bfloat162float(g[j]), __bfloat162float(u[j])); };
    quantize_row<1>(gen, inter, codes + row, scales + blockIdx.x, yd, red_max);
  }
}

// SwiGLU → FP8 per token per 128 channels: one warp per (row, 128-channel block), lane l holding channels 4 l .. 4 l + 3
// of the block (8-byte loads of gate and of up; inter % 128 == 0 makes every row and block 8-byte aligned). y is
// decoder_ops' silu_mul, the scale fp8blk's rule over the block's 128 values: what the gate|up GEMM's SwiGLU epilogue
// computes, and the unfused path beside it.
constexpr int kBlockWarpsPerCta = 8;
__global__ void __launch_bounds__(kBlockWarpsPerCta * kWarp)
    swiglu_fp8_block_kernel(const __nv_bfloat16* gate_up, uint8_t* codes, float* scales, int rows, int inter) {
  ops::pdl_prologue();
  const int blocks_per_row = inter / fp8blk::kBlockCols;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kBlockWarpsPerCta + threadIdx.x / kWarp;
  if (item >= static_cast<int64_t>(rows) * blocks_per_row) return;  // whole warps exit together
  const int lane = threadIdx.x % kWarp;
  const int64_t row = item / blocks_per_row;
  const int b = static_cast<int>(item % blocks_per_row);
  const int c = b * fp8blk::kBlockCols + 4 * lane;
  const __nv_bfloat16* g = gate_up + row * 2 * inter + c;
  const uint2 gr = __ldcs(reinterpret_cast<const uint2*>(g));
  const uint2 ur = __ldcs(reinterpret_cast<const uint2*>(g + inter));
  const __nv_bfloat16* gh = reinterpret_cast<const __nv_bfloat16*>(&gr);
  const __nv_bfloat16* uh = reinterpret_cast<const __nv_bfloat16*>(&ur);
  float y[4];
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    y[k] = ops::silu_mul(__bfloat162float(gh[k]), __bfloat162float(uh[k]));
    finite = finite && isfinite(y[k]);
    amax = fmaxf(amax, fabsf(y[k]));
  }
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float s = fp8blk::block_scale(amax, __all_sync(0xffffffffu, finite) != 0);
  const uint32_t lo = fp8blk::codes_x2(y[0], y[1], s), hi = fp8blk::codes_x2(y[2], y[3], s);
  *reinterpret_cast<uint32_t*>(codes + row * inter + c) = lo | (hi << 16);
  if (lane == 0) scales[item] = s;  // item = row * blocks_per_row + b: scales are [rows, inter / 128]
}

}  // namespace futransformer::cuda::fp8p
