// A W4A16 weight, as the W4A16 GEMM reads it (words from formats::repack_int4_for_mma, scales from
// repack_int4_scales_for_mma), dequantised on the GPU into a row-major BF16 [N, K] matrix, so that large-M
// projections can run as one BF16 tensor-core GEMM (cuBLAS) instead of the decode kernel's 64-row launches:
//   w[n, k] = bf16_rn((u − 8) · s)    u the stored nibble, s its group scale (FP16 or BF16, converted exactly),
// the product exact in fp32 and rounded once to BF16 (relative error ≤ 2⁻⁹ per weight; the W4A16 GEMM instead
// multiplies the exact (u − 8) · s into its fp32 sums). CPU twin: formats::int4_dequantize_bf16_mma_order.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "futransformer/formats/int4.h"
#include "futransformer/formats/int4_mma.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

// Row order of the BF16 output.
enum class Int4DequantRows : uint8_t {
  packed,     // row n is packed row n: the W4A16 GEMM's output column n (for any packing)
  canonical,  // row n is row n of the weight before packing (undoes Int4MmaRows::swiglu_interleaved: [gate | up])
};

// cudaSuccess when the kernel takes the shape (the W4A16 GEMM's: N and K positive multiples of 32 up to 2^18, K a
// multiple of group, group 32, 64 or 128), else cudaErrorInvalidValue and, when why is not null, a sentence naming
// the parameter. Needs no device.
cudaError_t int4_dequant_bf16_can_implement(int N, int K, int group, std::string* why);

// Enqueues one kernel on `stream` (no allocation, no synchronisation: graph-capturable). w_packed (N·K/8 words) and
// w (N·K BF16) 16-byte aligned device pointers, scales (N·K/group values) 2-byte aligned; `packing` is the row order
// the weight was repacked with, `rows` the order wanted. Returns cudaErrorInvalidValue (message in
// int4_dequant_last_error()) for rejected shapes and null or misaligned pointers; otherwise the launch's error.
cudaError_t int4_dequant_bf16(const uint32_t* w_packed, const uint16_t* scales, __nv_bfloat16* w, int N, int K,
                              int group, formats::ScaleType scale_type, formats::Int4MmaRows packing,
                              Int4DequantRows rows, cudaStream_t stream);

// Why the last int4_dequant_bf16 call on this thread returned cudaErrorInvalidValue ("" after an accepted call).
const char* int4_dequant_last_error();

}  // namespace futransformer::cuda
