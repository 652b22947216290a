#include "cuda/engine/engine_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hadamard_lanes.cuh"
#include "cuda/kv_append.cuh"

namespace futransformer::cuda {
namespace {

constexpr int kMaxHeadDim = 1024;
constexpr int kWarp = kv::kWarp;
constexpr int kRotateWarps = 4;         // warps per CTA of rotate_heads_warp_kernel
constexpr int kRotateHeadsPerWarp = 2;  // heads one warp loads before it transforms any
constexpr int kRotateWarpMaxHeadDim = kv::kMaxPerLane * kWarp;

// Three kernels, picked by shape (launcher): rotate_heads_vec_kernel (16-byte lanes) for head_dim 16 * 2^k with
// 16-byte aligned rows; rotate_heads_warp_kernel for the other multiples of 32 up to 256; rotate_heads_kernel for
// everything else. The first replaced one CTA per head with a __syncthreads per butterfly stage (2048 rows x 32
// heads: 65536 CTAs of serial load → 7 barriers → store, 101 us; now 12 us including ~4 us of event overhead).
//
// One warp per kRotateHeadsPerWarp consecutive (row, head) items, in kv_append.cuh's register layout (lane l holds
// channels 32 i + l), transformed by its hadamard_warp: the CPU's butterfly order and final scale multiply, with
// no barrier at all (strides below 32 are shuffles, larger ones registers of one lane). 2-byte accesses and 20
// shuffles per 128-wide head make it issue-bound at prefill sizes (~1 TB/s), hence the 16-byte kernel below.
// Requirements (launcher): head_dim % 32 == 0, head_dim <= kRotateWarpMaxHeadDim, block 1 (copy) or a power of
// two dividing head_dim. In place (src == dst) is safe: a warp writes only the heads it read, after reading them.
__global__ void __launch_bounds__(kRotateWarps * kWarp)
    rotate_heads_warp_kernel(const __nv_bfloat16* src, int src_row_stride, __nv_bfloat16* dst, int n_heads,
                             int head_dim, int64_t items, int block, float scale) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t first =
      (static_cast<int64_t>(blockIdx.x) * kRotateWarps + threadIdx.x / kWarp) * kRotateHeadsPerWarp;
  const int nv = head_dim / kWarp;
  float x[kRotateHeadsPerWarp][kv::kMaxPerLane];
#pragma unroll
  for (int k = 0; k < kRotateHeadsPerWarp; ++k) {
    const int64_t item = first + k;
    if (item >= items) break;  // warp-uniform
    const int64_t r = item / n_heads, h = item % n_heads;
    kv::load_head(src + r * src_row_stride + h * head_dim, head_dim, lane, x[k]);
  }
#pragma unroll
  for (int k = 0; k < kRotateHeadsPerWarp; ++k) {
    const int64_t item = first + k;
    if (item >= items) break;
    if (block > 1) kv::hadamard_warp(x[k], nv, block, scale, lane);
    __nv_bfloat16* d = dst + item * head_dim;  // dst rows are [n_heads, head_dim]: item = r * n_heads + h
#pragma unroll
    for (int i = 0; i < kv::kMaxPerLane; ++i) {
      const int c = i * kWarp + lane;
      if (c < head_dim) d[c] = __float2bfloat16_rn(x[k][i]);
    }
  }
}

// The 16-byte shape, for head_dim = 16 * kLanes (kLanes a power of two <= 32: head_dim 16 .. 512): kLanes lanes
// per head, lane s of a head holding channels 16 s .. 16 s + 15 (two 16-byte loads and stores), 32 / kLanes heads
// per warp. Butterfly strides 1..8 pair registers of one lane, strides 16 m pair lane s with lane s ^ m (the lane
// with bit m clear holds the pair's first element a, its partner b: a + b there, a - b here), stage by stage in the
// CPU's ascending order, then the one scale multiply: the CPU's operations on every pair, so its bits. Compared with
// the 32-channel-per-register layout of kv_append.cuh, a 128-wide head takes 12 shuffles instead of 20 and 4
// instructions per 16 bytes moved instead of 16 (at 2048 x 32 heads the former kernel was issue-bound, ~1 TB/s).
// Lanes past the last item still join the shuffles (on zeros) and store nothing.
template <int kLanes>
__global__ void __launch_bounds__(kRotateWarps * kWarp)
    rotate_heads_vec_kernel(const __nv_bfloat16* src, int src_row_stride, __nv_bfloat16* dst, int n_heads,
                            int64_t items, int block, float scale) {
  constexpr int kVec = 16;  // channels per lane
  constexpr int kHeadDim = kVec * kLanes;
  static_assert(kLanes >= 1 && kLanes <= kWarp && (kLanes & (kLanes - 1)) == 0, "lanes per head: 1, 2, 4 .. 32");
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int s = lane % kLanes;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * kRotateWarps + threadIdx.x / kWarp) * (kWarp / kLanes) +
                       lane / kLanes;
  const bool active = item < items;
  uint4 v[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
  if (active) {
    const int64_t r = item / n_heads, h = item % n_heads;
    const uint4* p = reinterpret_cast<const uint4*>(src + r * src_row_stride + h * kHeadDim + s * kVec);
    v[0] = p[0];
    v[1] = p[1];
  }
  float x[kVec];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // a BF16 is the top half of an fp32: exact widening
      x[8 * k + 2 * e] = __uint_as_float(w[e] << 16);
      x[8 * k + 2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
  }
  hadamard::blocks_over_lanes<kLanes>(x, s, block, scale);
  if (!active) return;
  uint32_t o[kVec / 2];
#pragma unroll
  for (int j = 0; j < kVec / 2; ++j)
    o[j] = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * j]))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * j + 1]))) << 16);
  uint4* d = reinterpret_cast<uint4*>(dst + item * kHeadDim + s * kVec);  // dst rows [n_heads, head_dim]
  d[0] = make_uint4(o[0], o[1], o[2], o[3]);
  d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

template <int kLanes>
void launch_rotate_vec(const __nv_bfloat16* src, int src_row_stride, __nv_bfloat16* dst, int n_heads, int64_t items,
                       int block, float scale, cudaStream_t stream) {
  const int64_t per_cta = int64_t{kRotateWarps} * (kWarp / kLanes);
  rotate_heads_vec_kernel<kLanes><<<static_cast<unsigned>((items + per_cta - 1) / per_cta), kRotateWarps * kWarp, 0,
                                    stream>>>(src, src_row_stride, dst, n_heads, items, block, scale);
}

// The general shape (any even head_dim up to kMaxHeadDim, any block): one CTA per (row, head), one thread per
// element, the butterflies in shared memory stage by stage.
__global__ void rotate_heads_kernel(const __nv_bfloat16* src, int src_row_stride, __nv_bfloat16* dst, int n_heads,
                                    int head_dim, int block, float scale) {
  __shared__ float v[kMaxHeadDim];
  const int r = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const __nv_bfloat16* s = src + static_cast<size_t>(r) * src_row_stride + static_cast<size_t>(h) * head_dim;
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) v[j] = __bfloat162float(s[j]);
  __syncthreads();
  if (block > 1) {
    for (int stride = 1; stride < block; stride *= 2) {
      // Each thread owns pairs (j, j + stride) with (j / stride) even inside its block: head_dim / 2 pairs.
      for (int p = threadIdx.x; p < head_dim / 2; p += blockDim.x) {
        const int j = (p / stride) * 2 * stride + p % stride;
        const float a = v[j], b = v[j + stride];
        v[j] = __fadd_rn(a, b);
        v[j + stride] = __fsub_rn(a, b);
      }
      __syncthreads();
    }
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) v[j] = __fmul_rn(v[j], scale);
    __syncthreads();
  }
  __nv_bfloat16* d = dst + (static_cast<size_t>(r) * n_heads + h) * head_dim;
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) d[j] = __float2bfloat16_rn(v[j]);
}

// blockIdx.y is the row; the columns of a row are spread over blockIdx.x × threads (coalesced 2-byte loads and
// 4-byte stores; the whole copy is a few MB at most, one pass over the logits).
__global__ void widen_rows_kernel(const __nv_bfloat16* src, int src_row_stride, float* dst, int cols) {
  const __nv_bfloat16* s = src + static_cast<size_t>(blockIdx.y) * src_row_stride;
  float* d = dst + static_cast<size_t>(blockIdx.y) * cols;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
    d[c] = __bfloat162float(s[c]);
}

__device__ __forceinline__ uint32_t hash32(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}

__global__ void fill_u32_kernel(uint32_t* p, size_t n, uint64_t seed, uint32_t mask) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = hash32(seed, i) & mask;
}

__global__ void fill_half_kernel(uint16_t* p, size_t n, float lo, float hi, bool bf16, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(hash32(seed, i) >> 8) * (1.0f / 16777216.0f);
    const float x = lo + (hi - lo) * u;
    p[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
  }
}

__global__ void fill_f32_kernel(float* p, size_t n, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

int fill_blocks(size_t n) {
  const size_t b = (n + 255) / 256;
  return static_cast<int>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

cudaError_t rotate_heads_bf16(const __nv_bfloat16* src, int src_row_stride, __nv_bfloat16* dst, int rows,
                              int n_heads, int head_dim, int hadamard_block, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr || rows < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      head_dim > kMaxHeadDim || src_row_stride < n_heads * head_dim ||
      (hadamard_block > 1 && head_dim % hadamard_block != 0) ||
      static_cast<int64_t>(rows) * n_heads > 0x7fffffff)
    return cudaErrorInvalidValue;
  if (src == dst && src_row_stride != n_heads * head_dim) return cudaErrorInvalidValue;
  const int block = hadamard_block > 1 ? hadamard_block : 1;
  float scale = 1.0f;
  if (block > 1) scale = static_cast<float>(1.0 / __builtin_sqrt(static_cast<double>(block)));
  const bool pow2 = (block & (block - 1)) == 0;
  const int lanes = head_dim / 16;
  if (pow2 && head_dim % 16 == 0 && lanes <= kWarp && (lanes & (lanes - 1)) == 0 && src_row_stride % 8 == 0 &&
      reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const int64_t items = static_cast<int64_t>(rows) * n_heads;
    switch (lanes) {
      case 1: launch_rotate_vec<1>(src, src_row_stride, dst, n_heads, items, block, scale, stream); break;
      case 2: launch_rotate_vec<2>(src, src_row_stride, dst, n_heads, items, block, scale, stream); break;
      case 4: launch_rotate_vec<4>(src, src_row_stride, dst, n_heads, items, block, scale, stream); break;
      case 8: launch_rotate_vec<8>(src, src_row_stride, dst, n_heads, items, block, scale, stream); break;
      case 16: launch_rotate_vec<16>(src, src_row_stride, dst, n_heads, items, block, scale, stream); break;
      default: launch_rotate_vec<32>(src, src_row_stride, dst, n_heads, items, block, scale, stream); break;
    }
    return cudaGetLastError();
  }
  if (head_dim % kWarp == 0 && head_dim <= kRotateWarpMaxHeadDim && pow2) {
    const int64_t items = static_cast<int64_t>(rows) * n_heads;
    constexpr int64_t kPerCta = int64_t{kRotateWarps} * kRotateHeadsPerWarp;
    rotate_heads_warp_kernel<<<static_cast<unsigned>((items + kPerCta - 1) / kPerCta), kRotateWarps * kWarp, 0,
                               stream>>>(src, src_row_stride, dst, n_heads, head_dim, items, block, scale);
    return cudaGetLastError();
  }
  const int threads = head_dim >= 256 ? 256 : (head_dim < 32 ? 32 : head_dim);
  rotate_heads_kernel<<<rows * n_heads, threads, 0, stream>>>(src, src_row_stride, dst, n_heads, head_dim, block,
                                                              scale);
  return cudaGetLastError();
}

cudaError_t widen_rows_bf16_to_f32(const __nv_bfloat16* src, int src_row_stride, float* dst, int rows, int cols,
                                   cudaStream_t stream) {
  if (src == nullptr || dst == nullptr || rows < 0 || rows > 65535 || cols < 1 || src_row_stride < cols)
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks_x = (cols + kThreads - 1) / kThreads < 128 ? (cols + kThreads - 1) / kThreads : 128;
  widen_rows_kernel<<<dim3(blocks_x, rows), kThreads, 0, stream>>>(src, src_row_stride, dst, cols);
  return cudaGetLastError();
}

cudaError_t fill_random_u32(uint32_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_u32_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, seed, 0xFFFFFFFFu);
  return cudaGetLastError();
}

cudaError_t fill_random_fp8_e4m3(uint8_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (p == nullptr || n % 4 != 0 || reinterpret_cast<uintptr_t>(p) % 4 != 0) return cudaErrorInvalidValue;
  // Bit 6 of each byte is the exponent's top bit: clearing it caps the exponent field at 7 (|x| <= 1.875) and
  // rules out the NaN codes 0x7F / 0xFF.
  fill_u32_kernel<<<fill_blocks(n / 4), 256, 0, stream>>>(reinterpret_cast<uint32_t*>(p), n / 4, seed, 0xBFBFBFBFu);
  return cudaGetLastError();
}

cudaError_t fill_random_half_bits(uint16_t* p, size_t n, float lo, float hi, bool bf16, uint64_t seed,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_half_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, lo, hi, bf16, seed);
  return cudaGetLastError();
}

cudaError_t fill_f32(float* p, size_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_f32_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, value);
  return cudaGetLastError();
}

}  // namespace futransformer::cuda
