// Small kernels only the CUDA engine uses: moving query heads out of the fused q|k|v rows (with the KV cache's Hadamard
// rotation when it has one), rotating the attention output back, widening the INT4 head's BF16 logits to fp32, and
// filling synthetic weights in GPU memory. Launchers take raw device pointers and a stream and are graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

struct __nv_bfloat16;

namespace futransformer::cuda {

// dst[r, h, :] = H · src[r * src_row_stride + h * head_dim + :] for rows r < rows and heads h < n_heads, where H
// is the normalised block Hadamard of formats/hadamard.h with the given block (0 or 1: a plain copy). Each head is
// read into fp32, transformed in fp32 in hadamard_blocks' order and rounded once to BF16. dst may equal src only
// when src_row_stride == n_heads * head_dim (the in-place un-rotation of the attention output).
cudaError_t rotate_heads_bf16(const __nv_bfloat16* src, int src_row_stride, __nv_bfloat16* dst, int rows,
                              int n_heads, int head_dim, int hadamard_block, cudaStream_t stream);

// dst[r, c] = float(src[r * src_row_stride + c]) for r < rows, c < cols (dst rows contiguous): the INT4 LM head's
// BF16 logits (W4A16 writes N padded to its tile) widened to the fp32 logits the argmax, the sampler and the host
// read. Exact (every BF16 value is an fp32 value). cudaErrorInvalidValue, before any launch, for null pointers,
// rows outside [0, 65535], cols < 1 or src_row_stride < cols.
cudaError_t widen_rows_bf16_to_f32(const __nv_bfloat16* src, int src_row_stride, float* dst, int rows, int cols,
                                   cudaStream_t stream);

// Deterministic pseudo-random fills (a counter hash of seed and index), for synthetic models.
cudaError_t fill_random_u32(uint32_t* p, size_t n, uint64_t seed, cudaStream_t stream);
// Bit patterns of FP16 (bf16 = false) or BF16 values uniform in [lo, hi).
cudaError_t fill_random_half_bits(uint16_t* p, size_t n, float lo, float hi, bool bf16, uint64_t seed,
                                  cudaStream_t stream);
// Random FP8 E4M3 codes (formats/fp8.h) of magnitude at most 1.875, never NaN; n a multiple of 4, p 4-byte aligned.
cudaError_t fill_random_fp8_e4m3(uint8_t* p, size_t n, uint64_t seed, cudaStream_t stream);
cudaError_t fill_f32(float* p, size_t n, float value, cudaStream_t stream);

}  // namespace futransformer::cuda
