// Device side of the per-row logit statistics (host side: src/cuda/logit_stats.cu; contract:
// include/futransformer/cuda/logit_stats.h). One CTA per row, two kernels: row_stats (max, Σ exp, argmax, finiteness
// in one pass over the row) and row_kl (Σ p (lp − lq) over two rows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace futransformer::cuda::logit_stats_ops {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 4;  // elements per group: one 16-byte load when the row is 16-byte aligned

static_assert(kThreads % 32 == 0 && kThreads <= 1024 && (kWarps & (kWarps - 1)) == 0,
              "whole warps, a power-of-two count of them (the cross-warp tree halves the count)");

// Group g of a row: elements [4g, 4g + 4) ∩ [0, vocab). kVec: the row start is 16-byte aligned, so a full group is
// one 16-byte load (ld.global.nc: the logits are read-only for the kernel's lifetime). The values and the order in
// which the caller visits them do not depend on kVec, so aligned and unaligned rows give bit-identical results.
template <bool kVec>
__device__ __forceinline__ int load_group(const float* __restrict__ row, int g, int vocab, float (&v)[kGroup]) {
  const int base = g * kGroup;
  const int n = min(kGroup, vocab - base);
  if (kVec && n == kGroup) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(row + base));
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) v[j] = j < n ? __ldg(row + base + j) : 0.0f;
  }
  return n;
}

// Running softmax state of a set of logits: max m and s = Σ exp(x − m) in fp64. Merging rescales the part with the
// smaller max; equal maxima (including two empty states, m = −inf) need no rescale and must not compute
// exp(−inf − (−inf)) = NaN.
struct SoftmaxState {
  float m;
  double s;
};

__device__ __forceinline__ SoftmaxState merge(SoftmaxState a, SoftmaxState b) {
  const float m = fmaxf(a.m, b.m);
  const double sa = a.m == m ? a.s : __dmul_rn(a.s, exp(static_cast<double>(a.m) - static_cast<double>(m)));
  const double sb = b.m == m ? b.s : __dmul_rn(b.s, exp(static_cast<double>(b.m) - static_cast<double>(m)));
  return {m, __dadd_rn(sa, sb)};
}

// The NaN a row with a non-finite logit (or a missing target) gets.
__device__ __forceinline__ double quiet_nan() { return __longlong_as_double(0x7ff8000000000000LL); }

// Larger value wins; equal values: the lower index (the first maximum, as eval::argmax).
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One CTA per row. Each thread folds its groups into (m, s) — one rescale per group whose max exceeds the running
// max, then the group's exp terms — so the row is read once; the per-thread states merge by warp shuffles (fixed
// xor tree) and then across warps in shared memory (fixed halving tree). The explicit __dmul_rn/__dadd_rn keep the
// compiler from contracting into FMAs, so the rounding is the one written here.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    row_stats_kernel(const float* __restrict__ logits, int64_t ld, int vocab, const int32_t* __restrict__ targets,
                     double* __restrict__ lse, double* __restrict__ nll, int32_t* __restrict__ argmax) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * ld;
  const int groups = (vocab + kGroup - 1) / kGroup;
  SoftmaxState st{-INFINITY, 0.0};
  float best_v = -INFINITY;
  int best_i = INT32_MAX;
  bool finite = true;
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float v[kGroup];
    const int n = load_group<kVec>(row, g, vocab, v);
    float gm = -INFINITY;
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j < n) {
        finite = finite && isfinite(v[j]);
        gm = fmaxf(gm, v[j]);
        // Indices grow along a thread's walk: a strict > keeps the first of equal values.
        if (v[j] > best_v) {
          best_v = v[j];
          best_i = g * kGroup + j;
        }
      }
    }
    if (gm > st.m) {
      // st.s is 0 while st.m is −inf, so the product is 0 (exp(−inf) = 0): no NaN.
      st.s = __dmul_rn(st.s, exp(static_cast<double>(st.m) - static_cast<double>(gm)));
      st.m = gm;
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      if (j < n) st.s = __dadd_rn(st.s, exp(static_cast<double>(v[j]) - static_cast<double>(st.m)));
  }
  // A NaN or ±Inf anywhere in the row makes the whole row's answer NaN; the block-wide AND also orders the loop
  // before the shared-memory exchange below.
  finite = __syncthreads_and(finite);

#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const SoftmaxState o{__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s, off)};
    // Both lanes of a pair must compute the same merge: order the operands by lane (lower lane first).
    st = (threadIdx.x & off) ? merge(o, st) : merge(st, o);
    better(best_v, best_i, __shfl_xor_sync(0xffffffffu, best_v, off), __shfl_xor_sync(0xffffffffu, best_i, off));
  }
  __shared__ float sm_m[kWarps];
  __shared__ double sm_s[kWarps];
  __shared__ float sm_v[kWarps];
  __shared__ int sm_i[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm_m[warp] = st.m;
    sm_s[warp] = st.s;
    sm_v[warp] = best_v;
    sm_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int width = kWarps / 2; width > 0; width /= 2) {
    for (int w = 0; w < width; ++w) {
      const SoftmaxState r = merge({sm_m[w], sm_s[w]}, {sm_m[w + width], sm_s[w + width]});
      sm_m[w] = r.m;
      sm_s[w] = r.s;
      better(sm_v[w], sm_i[w], sm_v[w + width], sm_i[w + width]);
    }
  }
  const int r = blockIdx.x;
  const double row_lse = finite ? __dadd_rn(static_cast<double>(sm_m[0]), log(sm_s[0])) : quiet_nan();
  if (lse) lse[r] = row_lse;
  if (nll) {
    const int32_t t = targets[r];
    // A target outside the row (−1: "no target") is never read.
    nll[r] = finite && t >= 0 && t < vocab ? __dsub_rn(row_lse, static_cast<double>(row[t]))
                                           : quiet_nan();
  }
  if (argmax) argmax[r] = finite ? sm_i[0] : -1;
}

// Σ over thread partials in a fixed tree: warp xor shuffles, then warp 0 halves the per-warp sums.
__device__ __forceinline__ double block_sum_to_thread0(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const double o = __shfl_xor_sync(0xffffffffu, v, off);
    // Lower lane's value first on both sides of the pair, so every lane holds the same sum.
    v = (threadIdx.x & off) ? __dadd_rn(o, v) : __dadd_rn(v, o);
  }
  __shared__ double sm[kWarps];
  if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int width = kWarps / 2; width > 0; width /= 2)
      for (int w = 0; w < width; ++w) sm[w] = __dadd_rn(sm[w], sm[w + width]);
  return threadIdx.x == 0 ? sm[0] : 0.0;  // only thread 0 reads sm[0], after its own writes
}

// One CTA per row: Σ_i exp(lp_i) (lp_i − lq_i) with lp_i = x_i − lse_P, lq_i = y_i − lse_Q. Identical rows with
// identical lse give lp_i − lq_i = 0 exactly in every term, so KL is exactly 0.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    row_kl_kernel(const float* __restrict__ base, int64_t ld_base, const double* __restrict__ lse_base,
                  const float* __restrict__ other, int64_t ld_other, const double* __restrict__ lse_other, int vocab,
                  double* __restrict__ kl) {
  const int r = blockIdx.x;
  const float* x = base + static_cast<int64_t>(r) * ld_base;
  const float* y = other + static_cast<int64_t>(r) * ld_other;
  const double lp0 = lse_base[r], lq0 = lse_other[r];
  const int groups = (vocab + kGroup - 1) / kGroup;
  double acc = 0.0;
  bool finite = true;
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float xv[kGroup], yv[kGroup];
    const int n = load_group<kVec>(x, g, vocab, xv);
    load_group<kVec>(y, g, vocab, yv);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j < n) {
        finite = finite && isfinite(xv[j]) && isfinite(yv[j]);
        const double lp = __dsub_rn(static_cast<double>(xv[j]), lp0);
        const double lq = __dsub_rn(static_cast<double>(yv[j]), lq0);
        acc = __dadd_rn(acc, __dmul_rn(exp(lp), __dsub_rn(lp, lq)));
      }
    }
  }
  finite = __syncthreads_and(finite);
  const double total = block_sum_to_thread0(acc);
  if (threadIdx.x == 0) kl[r] = finite && isfinite(lp0) && isfinite(lq0) ? total : quiet_nan();
}

}  // namespace futransformer::cuda::logit_stats_ops
