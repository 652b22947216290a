// Device side of the GPU sampler (host side and launch plan: src/cuda/sampling.cu; contract:
// include/futransformer/cuda/sampling.h). Three steps per row: prepare (max, validity, fp64 p and sort keys),
// CUB's stable segmented radix sort (descending p, ids ascending within equal p), walk (cuts and draw).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/sampling_exp.h"

namespace futransformer::cuda::sampling_ops {

constexpr int kPrepareThreads = 512;
constexpr int kWalkThreads = 128;
// Once the running sum is >= 1 (it is from the first sorted token on: that token's p is the largest, and the
// largest logit's p is exactly exp(0) = 1), adding any p < 2^-53 (less than half an ulp of the sum) changes nothing.
constexpr double kNegligibleP = 0x1.0p-53;

static_assert(kPrepareThreads % 32 == 0 && kPrepareThreads <= 1024, "whole warps, one CTA");

// Larger value wins; equal values: the lower index (futransformer::argmax keeps the first maximum).
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One CTA per row. Writes out[row]: -1 for a row the CPU sampler rejects, the argmax at temperature 0, else 0 (the
// walk overwrites it). At temperature > 0 also the sort input: key = bits of p (p >= 0, so unsigned order is p's
// order), id = token, and the segment offset of the row.
__global__ void __launch_bounds__(kPrepareThreads)
    prepare_kernel(const float* __restrict__ logits, const double* __restrict__ uniforms, int32_t* __restrict__ out,
                   unsigned long long* __restrict__ keys, int32_t* __restrict__ ids, int32_t* __restrict__ offsets,
                   int rows, int vocab, double inv_t, bool greedy) {
  const int row = blockIdx.x;
  const float* l = logits + static_cast<int64_t>(row) * vocab;
  float best_v = -INFINITY;
  int best_i = INT32_MAX;
  bool nan = false;
  for (int i = threadIdx.x; i < vocab; i += kPrepareThreads) {
    const float v = l[i];
    if (v != v) {
      nan = true;
    } else {
      better(best_v, best_i, v, i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    better(best_v, best_i, __shfl_xor_sync(0xffffffffu, best_v, o), __shfl_xor_sync(0xffffffffu, best_i, o));
  }
  nan = __any_sync(0xffffffffu, nan);
  __shared__ float warp_v[kPrepareThreads / 32];
  __shared__ int warp_i[kPrepareThreads / 32];
  __shared__ int warp_nan[kPrepareThreads / 32];
  __shared__ float row_max;
  __shared__ bool row_ok;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_v[warp] = best_v;
    warp_i[warp] = best_i;
    warp_nan[warp] = nan;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    bool any_nan = false;
    for (int w = 0; w < kPrepareThreads / 32; ++w) {
      better(best_v, best_i, warp_v[w], warp_i[w]);
      any_nan |= warp_nan[w] != 0;
    }
    // Every value is -inf or larger, so best_i is a real index unless the row is all NaN (then any_nan is set).
    bool ok = !any_nan;
    if (!greedy) {
      const double u = uniforms[row];
      ok = ok && isfinite(best_v) && u >= 0.0 && u < 1.0;
      offsets[row] = row * vocab;
      if (row == rows - 1) offsets[rows] = rows * vocab;
    }
    out[row] = !ok ? -1 : greedy ? best_i : 0;
    row_max = best_v;
    row_ok = ok;
  }
  if (greedy) return;
  __syncthreads();
  const bool ok = row_ok;
  const double mx = static_cast<double>(row_max);
  unsigned long long* k = keys + static_cast<int64_t>(row) * vocab;
  int32_t* id = ids + static_cast<int64_t>(row) * vocab;
  for (int i = threadIdx.x; i < vocab; i += kPrepareThreads) {
    // The CPU's (double(logit) - max) * inv_t, each operation rounded on its own.
    const double p = ok ? sampling_detail::sampling_exp(__dmul_rn(__dsub_rn(static_cast<double>(l[i]), mx), inv_t))
                        : 0.0;
    k[i] = static_cast<unsigned long long>(__double_as_longlong(p));
    id[i] = i;
  }
}

// First index in [0, n) with pred(a[index]) true, n when none; pred must be false then true along a.
template <typename Pred>
__device__ __forceinline__ int first_true(const double* a, int n, Pred pred) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (pred(a[mid])) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// One thread per row, over the sorted row: p[j] = the j-th largest p, id[j] its token. Replays
// sample_with_uniform's sums in its order: s[j] = s[j-1] + p[j] (fp64, rounded each step), written to `prefix` (the
// sort's input keys, free after the sort: a separate array keeps the streamed key lines in L1 untouched by stores).
// The walk stops at the first negligible p (index m): every later s equals s[m-1], so S(j) = s[min(j, m - 1)].
__global__ void __launch_bounds__(kWalkThreads)
    walk_kernel(const unsigned long long* __restrict__ sorted_keys, double* __restrict__ prefix,
                const int32_t* __restrict__ sorted_ids,
                const double* __restrict__ uniforms, int32_t* __restrict__ out, int rows, int vocab, int top_k,
                float top_p) {
  const int row = blockIdx.x * kWalkThreads + threadIdx.x;
  if (row >= rows || out[row] < 0) return;
  const double* p_sorted = reinterpret_cast<const double*>(sorted_keys + static_cast<int64_t>(row) * vocab);
  double* s = prefix + static_cast<int64_t>(row) * vocab;
  const int32_t* id = sorted_ids + static_cast<int64_t>(row) * vocab;
  int keep = top_k > 0 && top_k < vocab ? top_k : vocab;
  double sum = 0.0;
  int m = 0;
  for (; m < keep; ++m) {
    const double p = p_sorted[m];
    if (m > 0 && p < kNegligibleP) break;
    sum = __dadd_rn(sum, p);
    s[m] = sum;
  }
  // m >= 1: keep >= 1 and the first token is never negligible.
  if (top_p < 1.0f) {
    const double total = s[min(keep, m) - 1];
    const double target = __dmul_rn(static_cast<double>(top_p), total);
    // CPU: the shortest prefix whose sum reaches target (all of `keep` when none does).
    const int j = first_true(s, m, [target](double x) { return x >= target; });
    if (j < m) keep = j + 1;
  }
  const double total = s[min(keep, m) - 1];
  const double u = __dmul_rn(uniforms[row], total);
  // CPU: the first token whose running sum exceeds u; id[keep - 1] if none (u < total, so it is not reached).
  const int j = first_true(s, min(keep, m), [u](double x) { return u < x; });
  out[row] = id[j < min(keep, m) ? j : keep - 1];
}

}  // namespace futransformer::cuda::sampling_ops
