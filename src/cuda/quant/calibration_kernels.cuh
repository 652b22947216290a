// Device code of GPTQ's fp32 calibration forward (calibration_forward.cu): the element-wise and per-row ops of
// src/ref/ops.cpp in the same fp32 operation order. Products and sums are written with __fmul_rn / __fadd_rn /
// __fsub_rn / __fdiv_rn because nvcc would otherwise contract a·b ± c·d into an FMA, which the CPU twin (x86-64
// without -mfma) never does; the remaining differences to the CPU are the reduction order of the fp64 sums and the
// GPU's expf / sincos (a few ulp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace futransformer::cuda::calib_ops {

constexpr int kRowThreads = 256;
static_assert(kRowThreads % 32 == 0 && kRowThreads <= 1024, "row kernels reduce whole warps in one block");

// Block-wide reductions over kRowThreads threads through shared memory (one slot per warp); every thread gets the
// result.
__device__ inline double block_sum(double v) {
  __shared__ double warp_sums[kRowThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // the slots may still be read by a previous call
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0.0;
  for (int w = 0; w < kRowThreads / 32; ++w) s += warp_sums[w];
  return s;
}

__device__ inline float block_max(float v) {
  __shared__ float warp_max[kRowThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = warp_max[0];
  for (int w = 1; w < kRowThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  return m;
}

// ref::rmsnorm per row (one block per row): y = w · (scale · x), scale = fp32(1 / sqrt(Σx²/n + eps)) in fp64.
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int64_t n,
                   float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * n;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) ss += static_cast<double>(xr[i]) * xr[i];
  ss = block_sum(ss);
  const float scale = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + static_cast<double>(eps)));
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) yr[i] = __fmul_rn(w[i], __fmul_rn(scale, xr[i]));
}

// ref::apply_rope on rows × n_heads heads in place; row r is at position pos[r]. One thread per (row, head, i < d/2).
__global__ void rope_kernel(float* __restrict__ x, int64_t rows, int n_heads, int head_dim,
                            const int32_t* __restrict__ pos, const float* __restrict__ inv_freq) {
  const int half = head_dim / 2;
  const int64_t total = rows * n_heads * half;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int64_t rh = t / half;  // row · n_heads + head
    const int64_t r = rh / n_heads;
    double s_d, c_d;
    sincos(static_cast<double>(pos[r]) * static_cast<double>(inv_freq[i]), &s_d, &c_d);
    const float c = static_cast<float>(c_d), s = static_cast<float>(s_d);
    float* head = x + rh * head_dim;
    const float x0 = head[i], x1 = head[i + half];
    head[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    head[i + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
}

// ref::softmax over each score row's causal prefix, the rest zeroed (one block per row). Rows are
// [n_heads][q_rows][len]; query b of the block sees keys 0 … first_visible + b − 1.
__global__ void __launch_bounds__(kRowThreads)
    causal_softmax_kernel(float* __restrict__ s, int64_t q_rows, int64_t len, int64_t first_visible) {
  const int64_t row = blockIdx.x;
  float* r = s + row * len;
  const int64_t visible = first_visible + row % q_rows;
  float m = -INFINITY;
  for (int64_t t = threadIdx.x; t < visible; t += kRowThreads) m = fmaxf(m, r[t]);
  m = block_max(m);
  double sum = 0.0;
  for (int64_t t = threadIdx.x; t < visible; t += kRowThreads) {
    const float e = expf(__fsub_rn(r[t], m));
    r[t] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / block_sum(sum));
  for (int64_t t = threadIdx.x; t < len; t += kRowThreads) r[t] = t < visible ? __fmul_rn(r[t], inv) : 0.0f;
}

// out = silu(gate) · up with silu(g) = g / (1 + exp(−g)) (ref::swiglu); out may alias gate.
__global__ void swiglu_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

// x += delta (the residual add).
__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ delta, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fadd_rn(x[i], delta[i]);
}

}  // namespace futransformer::cuda::calib_ops
