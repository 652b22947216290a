// Kernels of the small decoder ops (launchers and the contract: include/futransformer/cuda/decoder_ops.h).
//
// All are memory bound and tiny at decode shapes (a few hundred KB per call), so the aim is only: 16-byte vector
// accesses where the caller's pointers allow (a kVec template flag; the scalar instance handles any alignment),
// enough CTAs to spread one row over several SMs where the op allows it, and arithmetic that mirrors the CPU twin
// operation for operation (explicit _rn intrinsics where nvcc would otherwise contract a product and a sum into
// one FMA and so round differently from the twin).
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>
#include <cstring>

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/griddep.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/math.cuh"
#include "cuda/rmsnorm_row.cuh"

namespace futransformer::cuda::ops {

constexpr int kEltThreads = 256;        // element-wise kernels (embed, residual, swiglu)
constexpr int kVecElems = 8;            // BF16 values in one 16-byte vector
constexpr int kArgmaxThreads = 1024;    // argmax: a CTA holds as many loads in flight as it can
constexpr int kArgmaxUnroll = 4;        // 16-byte loads in flight per argmax thread
constexpr int kArgmaxCluster = 8;       // CTAs per row (a portable cluster) from kArgmaxClusterMinVocab on
constexpr int kArgmaxClusterMinVocab = 16384;  // below, one CTA reads the row in a few rounds of loads
constexpr int kRopeThreads = 128;
constexpr int kRopeHeadsPerCta = 4;  // heads of one row per CTA; each CTA recomputes the row's cos/sin table
constexpr int kRopeMaxHalf = 256;    // head_dim / 2 (kRopeMaxHeadDim / 2)

static_assert(kEltThreads % kWarp == 0 && kArgmaxThreads % kWarp == 0 && kRopeThreads % kWarp == 0,
              "block sizes must be whole warps (the reductions use full-warp shuffles)");
static_assert(kArgmaxThreads <= kWarp * kWarp && kMaxBlockThreads <= kWarp * kWarp,
              "the per-warp partials of a block reduction must fit in one warp's lanes");

// First statement of every kernel here and in fused_ops.cuh. Under FT_PDL=1 the launchers start a kernel as a
// programmatic dependent of the previous one on the stream: it must wait until that grid has completed and its
// writes are visible before reading anything. Then it lets its own dependent launch, so that kernel's launch
// latency overlaps this one's work (the dependent waits for this grid's completion in turn). Without the launch
// attribute both instructions do nothing.
__device__ __forceinline__ void pdl_prologue() {
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
}

// pdl_prologue with the two instructions swapped, for rmsnorm_kernel only: its dependent (in the decode step a W4A16
// GEMM) launches while this kernel still waits for the GEMM before it, so its CTAs fetch their constant weights
// during that GEMM instead of after it. Safe: the dependent waits for this grid's completion (which follows this
// wait), and it only launches once every CTA of this grid is resident. Not the default for every kernel: releasing
// first everywhere let the weights of the o and gate|up GEMMs be prefetched during decode attention, whose
// latency-bound cache reads then queued behind them (attention 4.9 -> 11.0 µs in the batch-1 step; step +1.4 % at
// batch 1, +1.6 % at batch 32, -2.3 % at batch 8; CUPTI trace, docs/results.md, eleventh session).
__device__ __forceinline__ void pdl_release_then_wait() {
  ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
}

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }

// 8 BF16 (one uint4) -> 8 fp32: exact (a BF16 is the top half of an fp32).
__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __uint_as_float(w[k] << 16);
    f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Embedding gather. grid = (column chunks, rows). The table row is read once per step and not reused: __ldg
// (read-only path). An id outside [0, vocab) writes NaNs and reads nothing.
template <bool kVec>
__global__ void __launch_bounds__(kEltThreads)
    embed_rows_kernel(const __nv_bfloat16* table, const int32_t* tokens, float* x, int hidden, int vocab) {
  pdl_prologue();
  const int r = blockIdx.y;
  const int32_t tok = tokens[r];
  const bool ok = tok >= 0 && tok < vocab;
  const __nv_bfloat16* er = table + static_cast<int64_t>(ok ? tok : 0) * hidden;
  float* xr = x + static_cast<int64_t>(r) * hidden;
  const int t = blockIdx.x * kEltThreads + threadIdx.x;
  if constexpr (kVec) {
    const int i = t * kVecElems;  // hidden % 8 == 0, table and x 16-byte aligned
    if (i >= hidden) return;
    float f[kVecElems];
    if (ok) {
      bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(er + i)), f);
    } else {
#pragma unroll
      for (int k = 0; k < kVecElems; ++k) f[k] = nan_f32();
    }
    reinterpret_cast<float4*>(xr + i)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(xr + i)[1] = make_float4(f[4], f[5], f[6], f[7]);
  } else {
    if (t >= hidden) return;
    xr[t] = ok ? __bfloat162float(er[t]) : nan_f32();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Sum of `v` over the block, identical in every thread. Fixed order: shuffle butterfly in each warp, then every
// thread adds the warp partials 0, 1, ... in turn, so the result does not depend on scheduling. Once per kernel
// (`red` is not re-synchronised for a second call).
__device__ __forceinline__ float block_sum(float v, float* red /* [kWarp] shared */) {
  v = warp_sum_xor(v);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0.0f;
  const int warps = blockDim.x / kWarp;
  for (int w = 0; w < warps; ++w) total = __fadd_rn(total, red[w]);
  return total;
}

// The pieces of RMSNorm shared with the fused residual-add + RMSNorm (src/cuda/fused_ops.cuh), the FP8 producers and
// the W4A16 GEMM's norm prologue (sum_squares_add, warp_sum_xor, rms_scale, rmsnorm_scale_bf16x4) live in
// rmsnorm_row.cuh, so all produce the same bits.

// Pass 2 of RMSNorm over one row: y = bf16(w · (s · x)) in this order, as ref::rmsnorm. Thread t handles the
// same elements (float4 or scalar units t, t + blockDim.x, ...) as in pass 1. kVec: hidden % 4 == 0; x, weight
// 16-byte and y 8-byte aligned. w_first (kVec only, may be null): this thread's first weight float4 (unit
// threadIdx.x), already loaded by the caller — rmsnorm_kernel reads it before griddepcontrol.wait (a weight no
// kernel writes), so its latency overlaps the previous kernel under programmatic launch.
template <bool kVec>
__device__ __forceinline__ void rmsnorm_store_row(const float* xr, const float* weight, __nv_bfloat16* yr, int hidden,
                                                  float s, const float4* w_first = nullptr) {
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    for (int j = threadIdx.x; j < hidden / 4; j += blockDim.x) {
      const float4 v = x4[j], w = (w_first != nullptr && j == static_cast<int>(threadIdx.x)) ? *w_first : __ldg(w4 + j);
      reinterpret_cast<uint2*>(yr)[j] = rmsnorm_scale_bf16x4(v, w, s);
    }
  } else {
    for (int j = threadIdx.x; j < hidden; j += blockDim.x)
      yr[j] = __float2bfloat16_rn(__fmul_rn(weight[j], __fmul_rn(s, xr[j])));
  }
}

// Launch shape of an RMSNorm row: rmsnorm_vec / rmsnorm_threads (rmsnorm_row.cuh).

// RMSNorm, one CTA per row (blockDim a multiple of 32, <= 1024). Pass 1 sums x² (each thread its strided elements
// in index order); pass 2 re-reads the row, which the first pass left in L1 (64 KB for hidden 16384).
template <bool kVec>
__global__ void __launch_bounds__(kMaxBlockThreads)
    rmsnorm_kernel(const float* x, const float* weight, __nv_bfloat16* y, int hidden, float eps) {
  // The weight is constant: this thread's first float4 of it is loaded before the wait (see rmsnorm_store_row).
  float4 w_first = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if constexpr (kVec) {
    if (static_cast<int>(threadIdx.x) < hidden / 4)
      w_first = __ldg(reinterpret_cast<const float4*>(weight) + threadIdx.x);
  }
  pdl_release_then_wait();
  __shared__ float red[kWarp];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  const float* xr = x + row;
  float ss = 0.0f;
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int j = threadIdx.x; j < hidden / 4; j += blockDim.x) ss = sum_squares_add(ss, x4[j]);
  } else {
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) ss = sum_squares_add(ss, xr[j]);
  }
  const float s = rms_scale(block_sum(ss, red), hidden, eps);
  rmsnorm_store_row<kVec>(xr, weight, y + row, hidden, s, kVec ? &w_first : nullptr);
}

// ---------------------------------------------------------------------------------------------------------------
// x += float(delta) over the flattened [rows * hidden] tensor, grid-stride. kVec: 8 elements per step (x and
// delta 16-byte aligned), the last partial group element by element.
template <bool kVec>
__global__ void __launch_bounds__(kEltThreads) add_residual_kernel(float* x, const __nv_bfloat16* delta, int64_t n) {
  pdl_prologue();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kEltThreads;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kEltThreads + threadIdx.x;
  if constexpr (kVec) {
    for (int64_t g = t0; g * kVecElems < n; g += stride) {
      const int64_t i = g * kVecElems;
      if (i + kVecElems <= n) {
        float d[kVecElems];
        bf16x8_to_f32(*reinterpret_cast<const uint4*>(delta + i), d);
        float4* x4 = reinterpret_cast<float4*>(x + i);
        float4 a = x4[0], b = x4[1];
        a.x = __fadd_rn(a.x, d[0]);
        a.y = __fadd_rn(a.y, d[1]);
        a.z = __fadd_rn(a.z, d[2]);
        a.w = __fadd_rn(a.w, d[3]);
        b.x = __fadd_rn(b.x, d[4]);
        b.y = __fadd_rn(b.y, d[5]);
        b.z = __fadd_rn(b.z, d[6]);
        b.w = __fadd_rn(b.w, d[7]);
        x4[0] = a;
        x4[1] = b;
      } else {
        for (int64_t k = i; k < n; ++k) x[k] = __fadd_rn(x[k], __bfloat162float(delta[k]));
      }
    }
  } else {
    for (int64_t i = t0; i < n; i += stride) x[i] = __fadd_rn(x[i], __bfloat162float(delta[i]));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// silu(g) · u as ref::silu / ref::swiglu compute it — g / (1 + exp(−g)), then the product — with the two special
// functions on the SFU instead of expf and an IEEE division (at 2048 prompt rows the FP8 SwiGLU producer was bound
// by their ~60 SASS instructions per value, slow paths included: 54 -> 47 µs per 8B layer with these, twenty-third
// session):
//   e = 2^(−g·log2 e): the product split into hi = RN(−g·L2E) and its exact remainder lo (one FMA, plus the tail of
//       log2 e), e = ex2.approx(hi) · (1 + lo·ln 2); without the remainder the exponent's rounding alone would cost
//       |g|·2^-24 relative (2^-17.5 at |g| = 88);
//   silu = g · rcp.approx(1 + e) (rcp.approx keeps subnormal results: g in [−88.7, −87.3] gives the same tiny value
//       as the division; 1 + e = inf gives −0 as g / inf does).
// Relative error of the product against exact arithmetic, by the PTX ISA's bounds (ex2.approx 2^-22, rcp.approx
// 1 ulp) plus five roundings: below 2^-21 (kSwigluYRelTol in tests/gpu/test_fp8_producers.cpp checks 2^-20 against
// the C library's). A NaN g gives NaN; e = inf (g < −88.7) skips the correction, whose inf · lo could be −inf.
namespace silu_detail {
constexpr float kLog2e = 0x1.715476p+0f;      // RN(log2 e)
constexpr float kLog2eLo = 0x1.4ae0c0p-26f;   // log2 e − kLog2e
constexpr float kLn2 = 0x1.62e430p-1f;        // RN(ln 2)
}  // namespace silu_detail
__device__ __forceinline__ float silu_mul(float g, float u) {
  using namespace silu_detail;
  const float a = -g;
  const float hi = __fmul_rn(a, kLog2e);
  const float lo = __fmaf_rn(a, kLog2eLo, __fmaf_rn(a, kLog2e, -hi));
  const float e0 = ptx::ex2_approx(hi);
  const float e = isinf(e0) ? e0 : __fmaf_rn(e0, __fmul_rn(lo, kLn2), e0);
  return __fmul_rn(__fmul_rn(g, ptx::rcp_approx(__fadd_rn(1.0f, e))), u);
}

// grid = (column chunks, rows). gate_up row r: [gate | up], each `inter` wide.
template <bool kVec>
__global__ void __launch_bounds__(kEltThreads)
    swiglu_kernel(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int inter) {
  pdl_prologue();
  const int r = blockIdx.y;
  const __nv_bfloat16* g = gate_up + static_cast<int64_t>(r) * 2 * inter;
  const __nv_bfloat16* u = g + inter;
  __nv_bfloat16* o = out + static_cast<int64_t>(r) * inter;
  const int t = blockIdx.x * kEltThreads + threadIdx.x;
  if constexpr (kVec) {  // inter % 8 == 0; gate_up and out 16-byte aligned
    const int i = t * kVecElems;
    if (i >= inter) return;
    float gf[kVecElems], uf[kVecElems];
    bf16x8_to_f32(*reinterpret_cast<const uint4*>(g + i), gf);
    bf16x8_to_f32(*reinterpret_cast<const uint4*>(u + i), uf);
    uint4 v;
    v.x = pack_bf16x2_rn(silu_mul(gf[0], uf[0]), silu_mul(gf[1], uf[1]));
    v.y = pack_bf16x2_rn(silu_mul(gf[2], uf[2]), silu_mul(gf[3], uf[3]));
    v.z = pack_bf16x2_rn(silu_mul(gf[4], uf[4]), silu_mul(gf[5], uf[5]));
    v.w = pack_bf16x2_rn(silu_mul(gf[6], uf[6]), silu_mul(gf[7], uf[7]));
    *reinterpret_cast<uint4*>(o + i) = v;
  } else {
    if (t >= inter) return;
    o[t] = __float2bfloat16_rn(silu_mul(__bfloat162float(g[t]), __bfloat162float(u[t])));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE arithmetic of ref::apply_rope, shared with the fused QKV kernel (src/cuda/fused_ops.cuh): the (cos, sin)
// of angle pos · inv_freq evaluated in fp64 and rounded to fp32, then the rotate-half pair (x0 = x[i],
// x1 = x[i + d/2]) with each product and the sum rounded separately.
__device__ __forceinline__ float2 rope_cos_sin(double pos, float inv_freq) {
  double s, c;
  sincos(__dmul_rn(pos, static_cast<double>(inv_freq)), &s, &c);
  return make_float2(__double2float_rn(c), __double2float_rn(s));
}
__device__ __forceinline__ float rope_lo(float x0, float x1, float2 cs) {  // new x[i]
  return __fsub_rn(__fmul_rn(x0, cs.x), __fmul_rn(x1, cs.y));
}
__device__ __forceinline__ float rope_hi(float x0, float x1, float2 cs) {  // new x[i + d/2]
  return __fadd_rn(__fmul_rn(x1, cs.x), __fmul_rn(x0, cs.y));
}

// out[r][i] = rope_cos_sin(positions[r], inv_freq[i]) for i < half; grid = ceil(rows · half / kRopeThreads).
static __global__ void __launch_bounds__(kRopeThreads)
    rope_table_kernel(const int32_t* positions, const float* inv_freq, int rows, int half, float2* out) {
  pdl_prologue();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRopeThreads + threadIdx.x;
  if (j >= static_cast<int64_t>(rows) * half) return;
  const int r = static_cast<int>(j / half), i = static_cast<int>(j % half);
  out[j] = rope_cos_sin(static_cast<double>(positions[r]), inv_freq[i]);
}

// RoPE on the q and k heads of the fused QKV rows, in place. grid = (ceil(rot_heads / kRopeHeadsPerCta), rows),
// kRopeThreads threads. The row's cos/sin table (head_dim / 2 pairs, fp64 sincos rounded to fp32 as
// ref::apply_rope) is built in shared memory once per CTA: fp64 sincos costs ~100 instructions, so it is not
// repeated per head. Then each thread rotates (head, i) pairs; consecutive threads touch consecutive channels.
// static: this header is included by more than one .cu file (fused_ops.cu reuses its device functions), and a
// non-template kernel with external linkage would be defined in each of them.
static __global__ void __launch_bounds__(kRopeThreads)
    rope_qk_kernel(__nv_bfloat16* qkv, const int32_t* positions, const float* inv_freq, int rot_heads, int row_width,
                   int head_dim) {
  pdl_prologue();
  __shared__ float2 cs[kRopeMaxHalf];
  const int half = head_dim / 2;
  const int r = blockIdx.y;
  const double pos = static_cast<double>(positions[r]);
  for (int i = threadIdx.x; i < half; i += kRopeThreads) cs[i] = rope_cos_sin(pos, inv_freq[i]);
  __syncthreads();
  const int head0 = blockIdx.x * kRopeHeadsPerCta;
  const int heads = min(kRopeHeadsPerCta, rot_heads - head0);
  __nv_bfloat16* base = qkv + static_cast<int64_t>(r) * row_width + static_cast<int64_t>(head0) * head_dim;
  for (int j = threadIdx.x; j < heads * half; j += kRopeThreads) {
    const int h = j / half, i = j - h * half;
    __nv_bfloat16* p = base + h * head_dim;
    const float x0 = __bfloat162float(p[i]), x1 = __bfloat162float(p[i + half]);
    p[i] = __float2bfloat16_rn(rope_lo(x0, x1, cs[i]));
    p[i + half] = __float2bfloat16_rn(rope_hi(x0, x1, cs[i]));
  }
}

// RoPE, 16-byte vector instance (head_dim % 16 == 0, qkv 16-byte aligned). grid = (ceil(rot_heads · head_dim / 16
// / kRopeThreads), rows). Thread t of the row's units owns 8 consecutive pairs (i .. i + 7, i + d/2 .. i + d/2 + 7)
// of one head: two 16-byte loads and two 16-byte stores, where rope_qk_kernel made 2-byte accesses. A CTA covers
// kRopeThreads · 8 pairs (16 heads of 128), so the fp64 cos/sin table is built 3 times per 40-head row instead of
// 10, and a 2048-row prefill is 6144 CTAs of 128 threads streaming 16-byte vectors. Same arithmetic per pair.
static __global__ void __launch_bounds__(kRopeThreads)
    rope_qk_vec_kernel(__nv_bfloat16* qkv, const int32_t* positions, const float* inv_freq, int rot_heads,
                       int row_width, int head_dim) {
  pdl_prologue();
  __shared__ float2 cs[kRopeMaxHalf];
  const int half = head_dim / 2;
  const int r = blockIdx.y;
  const double pos = static_cast<double>(positions[r]);
  for (int i = threadIdx.x; i < half; i += kRopeThreads) cs[i] = rope_cos_sin(pos, inv_freq[i]);
  __syncthreads();
  const int groups = half / kVecElems;  // 8-pair groups per head
  const int unit = blockIdx.x * kRopeThreads + threadIdx.x;
  if (unit >= rot_heads * groups) return;
  const int h = unit / groups, i0 = (unit - h * groups) * kVecElems;
  __nv_bfloat16* p = qkv + static_cast<int64_t>(r) * row_width + static_cast<int64_t>(h) * head_dim + i0;
  uint4* lo = reinterpret_cast<uint4*>(p);
  uint4* hi = reinterpret_cast<uint4*>(p + half);
  float x0[kVecElems], x1[kVecElems];
  bf16x8_to_f32(*lo, x0);
  bf16x8_to_f32(*hi, x1);
  uint32_t a[kVecElems / 2], b[kVecElems / 2];
#pragma unroll
  for (int k = 0; k < kVecElems / 2; ++k) {
    const float2 c0 = cs[i0 + 2 * k], c1 = cs[i0 + 2 * k + 1];
    a[k] = pack_bf16x2_rn(rope_lo(x0[2 * k], x1[2 * k], c0), rope_lo(x0[2 * k + 1], x1[2 * k + 1], c1));
    b[k] = pack_bf16x2_rn(rope_hi(x0[2 * k], x1[2 * k], c0), rope_hi(x0[2 * k + 1], x1[2 * k + 1], c1));
  }
  *lo = make_uint4(a[0], a[1], a[2], a[3]);
  *hi = make_uint4(b[0], b[1], b[2], b[3]);
}

// ---------------------------------------------------------------------------------------------------------------
// Argmax order: a number beats a NaN; a larger number wins; equal values (or two NaNs) go to the lower index. A
// strict total order on (value, index) pairs, so the reduction tree's shape cannot change the answer.
__device__ __forceinline__ bool argmax_better(float av, int ai, float bv, int bi) {
  const bool an = isnan(av), bn = isnan(bv);
  if (an != bn) return bn;
  if (!an && av != bv) return av > bv;
  return ai < bi;
}

// A thread's running winner (argmax_better order).
struct ArgmaxBest {
  float v = nan_f32();
  int i = INT_MAX;
  __device__ __forceinline__ void take(float value, int index) {
    if (argmax_better(value, index, v, i)) {
      v = value;
      i = index;
    }
  }
  __device__ __forceinline__ void take_warp() {  // the warp's winner in every lane (shuffle butterfly)
#pragma unroll
    for (int off = kWarp / 2; off > 0; off >>= 1)
      take(__shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, i, off));
  }
};

// The chunk [lo, hi) of a row of `units` load units that CTA `rank` of the row's `parts` CTAs scans.
__device__ __forceinline__ void argmax_chunk(int units, int rank, int parts, int* lo, int* hi) {
  const int chunk = (units + parts - 1) / parts;
  *lo = min(units, rank * chunk);
  *hi = min(units, *lo + chunk);
}

// Every thread of every CTA of the row calls it with its running winner: a shuffle butterfly per warp, warp 0 over the
// warps' winners; with kCl > 1, rank 0 then reduces the kCl CTAs' winners through distributed shared memory between
// two cluster barriers. Thread 0 of rank 0 stores the index (0 for a row of NaNs) to *out.
template <int kCl>
__device__ __forceinline__ void argmax_finish(ArgmaxBest b, int rank, int32_t* out) {
  static_assert(kCl >= 1 && kCl <= kWarp, "rank 0's lanes read one CTA's winner each");
  static_assert(kArgmaxThreads == kWarp * kWarp, "the second level reads one warp's winner per lane");
  __shared__ float red_v[kWarp];
  __shared__ int red_i[kWarp];
  b.take_warp();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    red_v[warp] = b.v;
    red_i[warp] = b.i;
  }
  __syncthreads();
  if (warp == 0) {
    b.v = red_v[lane];
    b.i = red_i[lane];
    b.take_warp();
  }
  if constexpr (kCl == 1) {
    if (threadIdx.x == 0) *out = isnan(b.v) ? 0 : b.i;
  } else {
    __syncthreads();  // every warp-0 lane has read red_v / red_i before thread 0 overwrites slot 0
    if (threadIdx.x == 0) {
      red_v[0] = b.v;
      red_i[0] = b.i;
    }
    ptx::cluster_sync();  // every CTA's winner written (release) and visible to rank 0 (acquire)
    if (rank == 0 && warp == 0) {
      ArgmaxBest c;
      if (lane < kCl) {
        c.v = ptx::ld_shared_cluster_f32(ptx::map_shared_rank(ptx::smem_addr(&red_v[0]), static_cast<uint32_t>(lane)));
        c.i = __float_as_int(
            ptx::ld_shared_cluster_f32(ptx::map_shared_rank(ptx::smem_addr(&red_i[0]), static_cast<uint32_t>(lane))));
      }
      c.take_warp();
      if (lane == 0) *out = isnan(c.v) ? 0 : c.i;
    }
    ptx::cluster_sync();  // no CTA leaves (freeing its shared memory) while rank 0 may still read it
  }
}

// Row blockIdx.y, split over the kCl CTAs of a cluster along x (kCl = 1: one CTA per row, no cluster): CTA `rank`
// scans its contiguous chunk of the row, each thread its strided elements, then argmax_finish. Order-free
// (argmax_better is a total order), so the answer is the single-CTA one. One CTA streamed a whole 128k-entry row
// (500 KB) alone in ~12 µs, bound by the loads one SM keeps in flight; eight CTAs read a row in one round of loads.
// Logits are read once: __ldcs (evict-first) keeps them from displacing weights and activations in L2.
template <bool kVec, int kCl>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_kernel(const float* logits, int32_t* out, int vocab) {
  pdl_prologue();
  const float* lr = logits + static_cast<int64_t>(blockIdx.y) * vocab;
  const int rank = static_cast<int>(blockIdx.x);  // the cluster spans grid x: rank == blockIdx.x
  ArgmaxBest b;
  int lo, hi;
  if constexpr (kVec) {  // vocab % 4 == 0, logits 16-byte aligned
    // kArgmaxUnroll independent 16-byte loads are issued before any compare.
    const float4* l4 = reinterpret_cast<const float4*>(lr);
    argmax_chunk(vocab / 4, rank, kCl, &lo, &hi);
    for (int j0 = lo + static_cast<int>(threadIdx.x); j0 < hi; j0 += kArgmaxUnroll * kArgmaxThreads) {
      float4 v[kArgmaxUnroll];
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k) {
        const int j = j0 + k * kArgmaxThreads;
        v[k] = j < hi ? __ldcs(l4 + j) : make_float4(nan_f32(), nan_f32(), nan_f32(), nan_f32());
      }
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k) {  // a NaN filler (index >= hi) loses to every real element
        const int j = j0 + k * kArgmaxThreads;
        b.take(v[k].x, 4 * j);
        b.take(v[k].y, 4 * j + 1);
        b.take(v[k].z, 4 * j + 2);
        b.take(v[k].w, 4 * j + 3);
      }
    }
  } else {
    argmax_chunk(vocab, rank, kCl, &lo, &hi);
    for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += kArgmaxThreads) b.take(__ldcs(lr + j), j);
  }
  argmax_finish<kCl>(b, rank, out + blockIdx.y);
}

// The INT4 LM head's tail in one pass: BF16 logits (row stride src_stride) widened to fp32 [rows, vocab] (exactly,
// as widen_rows_bf16_to_f32) and their argmax, as argmax_rows_kernel computes it on the widened row. kVec: vocab % 8
// == 0, src_stride % 8 == 0, src and dst 16-byte aligned (one 16-byte load of 8 values, two float4 stores).
template <bool kVec, int kCl>
__global__ void __launch_bounds__(kArgmaxThreads)
    widen_argmax_rows_kernel(const __nv_bfloat16* src, int src_stride, float* dst, int32_t* out, int vocab) {
  pdl_prologue();
  const __nv_bfloat16* sr = src + static_cast<int64_t>(blockIdx.y) * src_stride;
  float* dr = dst + static_cast<int64_t>(blockIdx.y) * vocab;
  const int rank = static_cast<int>(blockIdx.x);
  ArgmaxBest b;
  int lo, hi;
  if constexpr (kVec) {
    const uint4* s8 = reinterpret_cast<const uint4*>(sr);
    float4* d4 = reinterpret_cast<float4*>(dr);
    argmax_chunk(vocab / 8, rank, kCl, &lo, &hi);
    for (int j0 = lo + static_cast<int>(threadIdx.x); j0 < hi; j0 += kArgmaxUnroll * kArgmaxThreads) {
      uint4 v[kArgmaxUnroll] = {};
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k) {
        const int j = j0 + k * kArgmaxThreads;
        if (j < hi) v[k] = __ldcs(s8 + j);
      }
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k) {
        const int j = j0 + k * kArgmaxThreads;
        if (j >= hi) break;
        const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        float f[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // BF16 -> fp32 is exact: the 16 bits become the high half
          f[2 * e] = __uint_as_float(w[e] << 16);
          f[2 * e + 1] = __uint_as_float(w[e] & 0xFFFF0000u);
        }
        d4[2 * j] = make_float4(f[0], f[1], f[2], f[3]);
        d4[2 * j + 1] = make_float4(f[4], f[5], f[6], f[7]);
#pragma unroll
        for (int e = 0; e < 8; ++e) b.take(f[e], 8 * j + e);
      }
    }
  } else {
    argmax_chunk(vocab, rank, kCl, &lo, &hi);
    for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += kArgmaxThreads) {
      const float f = __bfloat162float(sr[j]);
      dr[j] = f;
      b.take(f, j);
    }
  }
  argmax_finish<kCl>(b, rank, out + blockIdx.y);
}

}  // namespace futransformer::cuda::ops
