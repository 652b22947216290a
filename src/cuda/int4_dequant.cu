// Host side of int4_dequant_bf16: argument checks and the launch (kernel: src/cuda/int4_dequant.cuh).
#include "futransformer/cuda/int4_dequant.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/int4_dequant.cuh"
#include "cuda/launch_status.h"

namespace futransformer::cuda {
namespace {

using std::to_string;

thread_local std::string g_last_error;

constexpr int kMaxDim = 1 << 18;  // the W4A16 GEMM's limit; N / 32 n blocks then fit grid.y

bool multiple_in_range(int v, int m) { return v > 0 && v % m == 0 && v <= kMaxDim; }

}  // namespace

cudaError_t int4_dequant_bf16_can_implement(int N, int K, int group, std::string* why) {
  if (group != 32 && group != 64 && group != 128)
    return reject(why, "int4_dequant_bf16: group = " + to_string(group) + ", expected 32, 64 or 128");
  if (!multiple_in_range(N, w4a16::kBlockN))
    return reject(why, "int4_dequant_bf16: N = " + to_string(N) + ", expected a positive multiple of " +
                           to_string(w4a16::kBlockN) + " up to " + to_string(kMaxDim));
  if (!multiple_in_range(K, w4a16::kBlockK) || K % group != 0)
    return reject(why, "int4_dequant_bf16: K = " + to_string(K) + ", expected a positive multiple of " +
                           to_string(w4a16::kBlockK) + " and of the group size " + to_string(group) + " up to " +
                           to_string(kMaxDim));
  return cudaSuccess;
}

cudaError_t int4_dequant_bf16(const uint32_t* w_packed, const uint16_t* scales, __nv_bfloat16* w, int N, int K,
                              int group, formats::ScaleType scale_type, formats::Int4MmaRows packing,
                              Int4DequantRows rows, cudaStream_t stream) {
  g_last_error.clear();
  if (const cudaError_t e = int4_dequant_bf16_can_implement(N, K, group, &g_last_error); e != cudaSuccess) return e;
  if (!w_packed || !scales || !w)
    return reject(&g_last_error, "int4_dequant_bf16: w_packed, scales and w must be non-null device pointers");
  if (!aligned(w_packed, 16) || !aligned(w, 16) || !aligned(scales, 2))
    return reject(&g_last_error, "int4_dequant_bf16: w_packed and w must be 16-byte aligned, scales 2-byte aligned");
  const bool to_canonical =
      packing == formats::Int4MmaRows::swiglu_interleaved && rows == Int4DequantRows::canonical;
  const int k_tiles = (K + int4_dequant::kTileCols - 1) / int4_dequant::kTileCols;
  const dim3 grid(static_cast<unsigned>(k_tiles), static_cast<unsigned>(N / int4_dequant::kTileRows));
  auto kernel = scale_type == formats::ScaleType::BF16 ? int4_dequant::int4_dequant_bf16_kernel<true>
                                                       : int4_dequant::int4_dequant_bf16_kernel<false>;
  kernel<<<grid, int4_dequant::kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(w_packed), scales,
                                                      reinterpret_cast<uint4*>(w), N, K, group, to_canonical);
  return cudaGetLastError();
}

const char* int4_dequant_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
