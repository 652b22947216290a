// Device code of GPTQ on the GPU (host side: gptq_cuda.cu). The per-block column loop is the CPU's loop of
// gptq.cpp with the rows spread over warps; the other kernels are the elementwise steps around cuBLAS / cuSOLVER.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "int4_device.cuh"

namespace futransformer::cuda::gptq_ops {

constexpr int kMaxBlock = 128;             // columns per device block: U's block tile is kMaxBlock² fp32 = 64 KiB
constexpr int kSlots = kMaxBlock / 32;     // columns each lane holds: lane l has block columns l, l + 32, …
constexpr int kRowsPerCta = 16;            // one warp per weight row; 16 warps share one U tile
constexpr unsigned kFullMask = 0xffffffffu;

// Why a row stopped (row_fail = (block + 1) · 4 + kind; block −1 is the static-group pass of act_order).
constexpr int kFailNonFinite = 1;
constexpr int kFailScaleOverflow = 2;
constexpr int32_t kNoFailure = 0x7f7f7f7f;  // what a 0x7F byte fill leaves: larger than any failure code

struct BlockArgs {
  float* w;                    // [N, K] fp32, columns in quantisation order (permuted with act_order)
  const float* u;              // [K, K] fp32, U = upper Cholesky factor of H⁻¹ (permuted order)
  const int32_t* perm;         // [K]: original column of quantisation position j
  uint16_t* scale_bits;        // [N, n_groups]: written at each group start (plain), read (act_order)
  uint8_t* zeros;              // [N, n_groups], asymmetric only (else null)
  float* err;                  // [N, b]: the block's scaled errors, the lazy GEMM's left operand
  uint8_t* nibbles;            // [N, K] in original column order
  double* row_loss;            // [N]
  int32_t* row_fail;           // [N]
  float* rounded;              // [N, K] original order, or null
  float* group_inputs;         // [N, K], or null (plain order only; act_order's are the original weights)
  int64_t N, K, G, i1;
  int b, n_groups, block_index;
  bool act, symmetric, bf16;
};

__device__ __forceinline__ float warp_min(float v) {
  for (int o = 16; o > 0; o >>= 1) v = int4_device::range_lo(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = int4_device::range_hi(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// One warp per row r, columns [i1, i1 + b) of the block in sequence: params at each group start (plain order),
// round column j, e = (x − deq) / U_jj, subtract e·U[j, t] from the block's later columns t (kept in registers, U's
// block tile in shared memory), record e for the lazy update. Arithmetic as the CPU's: separate fp32 multiply and
// subtract (no FMA), the loss in fp64.
__global__ void __launch_bounds__(kRowsPerCta * 32, 2) block_kernel(BlockArgs a) {
  extern __shared__ float u_tile[];  // [b][b]: u_tile[jj·b + t] = U[i1 + jj][i1 + t]
  const int b = a.b;
  for (int idx = threadIdx.x; idx < b * b; idx += blockDim.x) {
    const int jj = idx / b, t = idx - jj * b;
    u_tile[idx] = a.u[(a.i1 + jj) * a.K + a.i1 + t];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + (threadIdx.x >> 5);
  if (r >= a.N) return;  // whole warps leave together; no barrier follows
  float* wr = a.w + r * a.K;
  float v[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int t = lane + 32 * s;
    v[s] = t < b ? wr[a.i1 + t] : 0.0f;
  }
  const int64_t n_groups = a.n_groups;
  int4_device::Params p{1.0f, int4_device::kSymmetricZero, 0};
  if (!a.act && a.i1 % a.G != 0) {
    // A group wider than the block began in an earlier block, whose launch stored its params.
    const int64_t g = a.i1 / a.G;
    p = int4_device::params_from_bits(a.scale_bits[r * n_groups + g],
                                      a.zeros ? a.zeros[r * n_groups + g] : int4_device::kSymmetricZero, a.bf16);
  }
  double loss = 0.0;
  int fail = 0;
  for (int jj = 0; jj < b; ++jj) {
    const int64_t j = a.i1 + jj;
    if (!a.act && static_cast<int>(j) % static_cast<int>(a.G) == 0) {  // K <= 65536: 32-bit modulo
      // The group [j, j + G): its columns inside the block are current in registers; any beyond the block (a group
      // wider than the block starts at a block start) are current in global memory, all lazy updates applied.
      const int64_t g_end = j + a.G;
      float lo = 0.0f, hi = 0.0f;
      bool finite = true;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int t = lane + 32 * s;
        if (t >= jj && t < b && a.i1 + t < g_end) {
          finite = finite && isfinite(v[s]);
          lo = int4_device::range_lo(lo, v[s]);
          hi = int4_device::range_hi(hi, v[s]);
          if (a.group_inputs) a.group_inputs[r * a.K + a.i1 + t] = v[s];
        }
      }
      for (int64_t c = a.i1 + b + lane; c < g_end; c += 32) {
        const float x = wr[c];
        finite = finite && isfinite(x);
        lo = int4_device::range_lo(lo, x);
        hi = int4_device::range_hi(hi, x);
        if (a.group_inputs) a.group_inputs[r * a.K + c] = x;
      }
      if (!__all_sync(kFullMask, finite)) {
        fail = kFailNonFinite;
        break;
      }
      lo = warp_min(lo);
      hi = warp_max(hi);
      if (!int4_device::params_from_range(lo, hi, a.symmetric, a.bf16, p)) {
        fail = kFailScaleOverflow;
        break;
      }
      if (lane == 0) {
        a.scale_bits[r * n_groups + j / a.G] = p.bits;
        if (a.zeros) a.zeros[r * n_groups + j / a.G] = static_cast<uint8_t>(p.zero);
      }
    }
    const int64_t col = a.act ? a.perm[j] : j;
    if (a.act) {
      const int64_t g = col / a.G;
      p = int4_device::params_from_bits(a.scale_bits[r * n_groups + g],
                                        a.zeros ? a.zeros[r * n_groups + g] : int4_device::kSymmetricZero, a.bf16);
    }
    // Column jj lives in lane jj % 32, slot jj / 32; a select chain keeps v[] in registers (no dynamic indexing).
    const int owner = jj & 31, slot = jj >> 5;
    float mine = v[0];
#pragma unroll
    for (int s = 1; s < kSlots; ++s)
      if (slot == s) mine = v[s];
    const float x = __shfl_sync(kFullMask, mine, owner);
    if (!isfinite(x)) {
      fail = kFailNonFinite;
      break;
    }
    const uint8_t q = int4_device::quantize_value(x, p);
    const float* uj = u_tile + jj * b;
    const float e = __fdiv_rn(__fsub_rn(x, int4_device::dequantize_value(q, p)), uj[jj]);
    loss += 0.5 * static_cast<double>(e) * static_cast<double>(e);
    if (lane == owner) {
      a.nibbles[r * a.K + col] = q;
      if (a.rounded) a.rounded[r * a.K + col] = x;
      a.err[r * b + jj] = e;
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int t = lane + 32 * s;
      if (t > jj && t < b) v[s] = __fsub_rn(v[s], __fmul_rn(e, uj[t]));
    }
  }
  if (lane == 0) {
    a.row_loss[r] += loss;
    if (fail && a.row_fail[r] == kNoFailure) a.row_fail[r] = (a.block_index + 1) * 4 + fail;
  }
}

// act_order's static groups: params of each (row, group) of the original weights, one warp per pair.
__global__ void static_params_kernel(const float* w, int64_t N, int64_t K, int64_t G, int n_groups, bool symmetric,
                                     bool bf16, uint16_t* scale_bits, uint8_t* zeros, int32_t* row_fail) {
  const int lane = threadIdx.x & 31;
  const int64_t pair = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (pair >= N * n_groups) return;
  const int64_t r = pair / n_groups, g = pair - r * n_groups;
  const float* src = w + r * K + g * G;
  float lo = 0.0f, hi = 0.0f;
  for (int64_t c = lane; c < G; c += 32) {
    lo = int4_device::range_lo(lo, src[c]);
    hi = int4_device::range_hi(hi, src[c]);
  }
  lo = warp_min(lo);
  hi = warp_max(hi);
  if (lane != 0) return;
  int4_device::Params p;
  if (!int4_device::params_from_range(lo, hi, symmetric, bf16, p)) {
    atomicMin(&row_fail[r], kFailScaleOverflow);  // block −1: code (−1 + 1)·4 + kind
    return;
  }
  scale_bits[pair] = p.bits;
  if (zeros) zeros[pair] = static_cast<uint8_t>(p.zero);
}

// W[:, c] = 0 for each dead input c.
__global__ void zero_columns_kernel(float* w, int64_t N, int64_t K, const int32_t* cols, int n_cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * n_cols) return;
  const int64_t r = i / n_cols;
  w[r * K + cols[i - r * n_cols]] = 0.0f;
}

// dst[r, j] = src[r, perm[j]].
__global__ void permute_columns_kernel(const float* src, float* dst, int64_t N, int64_t K, const int32_t* perm) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K) return;
  const int64_t r = i / K, j = i - r * K;
  dst[i] = src[r * K + perm[j]];
}

// R = J·(H_perm + λI)·J, lower triangle, row-major (R[a][b] = H[perm[K−1−a]][perm[K−1−b]] for b < a): the
// reversed matrix whose Cholesky factor inverts to GPTQ's U (quant/dense.h). H is read from its upper triangle.
// diag: diag(H) with dead inputs set to 1. Also records R's diagonal for the pivot check.
__global__ void build_reversed_kernel(const double* h, const double* diag, const int32_t* perm, double lambda,
                                      int64_t K, double* r, double* r_diag) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t a = blockIdx.y; a < K; a += gridDim.y) {  // gridDim.y is capped at 65535
    if (b > a) continue;
    const int64_t i = perm[K - 1 - a];
    if (b == a) {
      const double d = diag[i] + lambda;
      r[a * K + a] = d;
      r_diag[a] = d;
      continue;
    }
    const int64_t j = perm[K - 1 - b];
    r[a * K + b] = h[(i < j ? i : j) * K + (i < j ? j : i)];
  }
}

// quant/dense.h's pivot rule after the factorization: every l_jj must be finite and keep at least kMinRelativePivot
// of its diagonal entry (l² >= 1e-10·R_jj), else the matrix counts as not positive definite.
__global__ void check_pivots_kernel(const double* l, const double* r_diag, int64_t K, double min_relative_pivot,
                                    int* bad) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= K) return;
  const double v = l[j * K + j];
  if (!(isfinite(v) && v * v >= min_relative_pivot * r_diag[j])) atomicExch(bad, 1);
}

// U[i][j] = float(L⁻¹[K−1−i][K−1−j]) for j >= i, 0 below the diagonal (L⁻¹ row-major lower).
__global__ void reversed_inverse_to_u_kernel(const double* linv, int64_t K, float* u) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= K) return;
  for (int64_t i = blockIdx.y; i < K; i += gridDim.y)
    u[i * K + j] = j >= i ? __double2float_rn(linv[(K - 1 - i) * K + (K - 1 - j)]) : 0.0f;
}

// qweight[r, c/2]: column 2c' in the low nibble, 2c' + 1 in the high one (formats/int4.h packing).
__global__ void pack_kernel(const uint8_t* nibbles, int64_t n_bytes, uint8_t* qweight) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_bytes) return;
  qweight[i] = static_cast<uint8_t>(nibbles[2 * i] | (nibbles[2 * i + 1] << 4));
}

// xd[e] = scale · double(x[e]) (the CPU's conversion: one fp64 rounding per element).
__global__ void scale_to_double_kernel(const float* x, int64_t n, double scale, double* xd) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) xd[i] = scale * static_cast<double>(x[i]);
}

// first = min flat index of a non-finite x (left at its initial value when none is).
__global__ void first_non_finite_kernel(const float* x, int64_t n, unsigned long long* first) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!isfinite(x[i])) atomicMin(first, static_cast<unsigned long long>(i));
}

}  // namespace futransformer::cuda::gptq_ops
