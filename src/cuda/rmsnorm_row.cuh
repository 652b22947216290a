// The arithmetic of one RMSNorm row, shared by every kernel that must produce rmsnorm_bf16's bits: rmsnorm_kernel
// and the fused residual-add + RMSNorm (decoder_ops.cuh, fused_ops.cuh), the FP8 producers (fp8_producers.cuh) and
// the W4A16 GEMM's norm prologue (gemm_w4a16_norm.cuh). Kept apart from decoder_ops.cuh so that the GEMM's
// translation units include only these few device functions, not that header's kernels.
//
// The order that defines the bits (rmsnorm_kernel<true>, T = rmsnorm_threads(hidden, true) threads): thread v sums
// the squares of the row's float4 units v, v + T, ... (sum_squares_add, from 0.0f); each warp of 32 threads reduces
// by warp_sum_xor; the T / 32 warp partials are added in warp order from 0.0f; s = rms_scale(total, hidden, eps);
// y = bf16(w · (s · x)) element by element (rmsnorm_scale_bf16x4).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace futransformer::cuda::ops {

constexpr int kWarp = 32;
constexpr int kMaxBlockThreads = 1024;  // rmsnorm (one CTA per row)

__device__ __forceinline__ uint32_t pack_bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &p, 4);
  return r;
}

// The sum of squares is one fused multiply-add per element (x * x + ss, rounded once), written out rather than left
// to nvcc's contraction of `ss += x * x`, which it performed the same way.
__device__ __forceinline__ float sum_squares_add(float ss, float v) { return __fmaf_rn(v, v, ss); }
__device__ __forceinline__ float sum_squares_add(float ss, const float4& v) {
  ss = __fmaf_rn(v.x, v.x, ss);
  ss = __fmaf_rn(v.y, v.y, ss);
  ss = __fmaf_rn(v.z, v.z, ss);
  return __fmaf_rn(v.w, v.w, ss);
}

// Sum of v over the 32 lanes of the (full) warp: the xor butterfly 16, 8, 4, 2, 1. Every lane ends with the same
// bits (each step adds the same two values in both lanes of a pair, and fp32 addition is commutative).
__device__ __forceinline__ float warp_sum_xor(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// ref::rmsnorm: 1 / sqrt(sum / n + eps), each step correctly rounded (here in fp32, there in fp64).
__device__ __forceinline__ float rms_scale(float total, int hidden, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(hidden)), eps)));
}

// Four outputs of pass 2, bf16(w · (s · x)) in this order (ref::rmsnorm), as two BF16 pairs (lower index low).
__device__ __forceinline__ uint2 rmsnorm_scale_bf16x4(const float4& v, const float4& w, float s) {
  uint2 o;
  o.x = pack_bf16x2_rn(__fmul_rn(w.x, __fmul_rn(s, v.x)), __fmul_rn(w.y, __fmul_rn(s, v.y)));
  o.y = pack_bf16x2_rn(__fmul_rn(w.z, __fmul_rn(s, v.z)), __fmul_rn(w.w, __fmul_rn(s, v.w)));
  return o;
}

// Launch shape of an RMSNorm row (host side, shared by every launcher that must sum in rmsnorm_bf16's order): the
// float4 instance when the row and pointers allow it, and one thread per 16-byte vector (or element) up to a full
// CTA: a 4096-wide row is one float4 per thread.
inline bool rmsnorm_vec(const void* x, const void* weight, const void* y, int hidden) {
  const auto al = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  return hidden % 4 == 0 && al(x, 16) && al(weight, 16) && al(y, 8);
}
inline __host__ __device__ int rmsnorm_threads(int hidden, bool vec) {
  const int64_t units = vec ? hidden / 4 : hidden;
  const int64_t threads = (units + kWarp - 1) / kWarp * kWarp;
  return static_cast<int>(threads < kMaxBlockThreads ? threads : kMaxBlockThreads);
}

}  // namespace futransformer::cuda::ops
