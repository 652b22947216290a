// Writing new tokens' K and V into the paged KV cache that attention_decode reads, and the int4-hadamard key
// anchors. The bytes are identical to the CPU quantiser given the same (BF16) inputs:
//   kv_append             == formats::kv_encode_token of each row's K and V head vectors (bf16 widened to fp32)
//   kv_key_anchor_compute == formats::kv_key_anchor of the chunk's keys rotated with formats::kv_rotate_query
// docs/formats.md documents the page bytes; docs/kernels.md the kernels.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

// One warp holds a head vector in registers, at most 8 values per lane.
constexpr int kKvAppendMaxHeadDim = 256;

// cudaSuccess when kv_append handles the shape; otherwise cudaErrorInvalidValue and, when why is not null, a
// sentence naming the offending parameter and what is expected. head_dim: a multiple of 8 (BF16), 16 (FP8) or
// 32 (INT4, INT4_HADAMARD), at most kKvAppendMaxHeadDim. rows >= 0, n_kv_heads >= 1, and the K and V slices
// [k_offset, k_offset + n_kv_heads * head_dim) and likewise for v_offset must lie inside a row of row_stride
// elements. Needs no device.
cudaError_t kv_append_can_implement(formats::KvFormat format, int rows, int n_kv_heads, int head_dim, int row_stride,
                                    int k_offset, int v_offset, std::string* why);

// Writes `rows` tokens' K and V into one layer's page pool in `format`. Row r's K of KV head h is
// qkv[r * row_stride + k_offset + h * head_dim + j], its V qkv[r * row_stride + v_offset + h * head_dim + j]
// (j < head_dim). Destination: page id row_page[r], slot row_slot[r]; the page of (page id p, KV head h) starts at
// kv_pool + (p * n_kv_heads + h) * layout.page_bytes, layout = formats::kv_page_layout(format, head_dim).
// Exactly the bytes kv_encode_token writes are written (code row, and the fp32 scale or the int4 scales and zeros
// of the slot); all others are left alone.
// INT4_HADAMARD: keys are stored relative to the anchor key_anchors + (row_anchor[r] * n_kv_heads + h) * head_dim
// (fp16 bits), as kv_encode_token with that key_anchor; a row with row_anchor[r] < 0 is stored without an anchor
// (kv_encode_token with an empty key_anchor). key_anchors and row_anchor must be non-null for INT4_HADAMARD and
// are ignored for the other formats.
// A row with row_page[r] < 0 (a padding row), or a slot outside 0..63, is skipped. Page ids and anchor indices
// must lie inside their buffers, and two rows must not name the same (page, slot).
// Inputs must satisfy kv_encode_token's contract (finite values whose int4 group scales fit fp16); where the CPU
// would throw, the bytes written are unspecified (no error is reported).
// Device pointers: kv_pool 16-byte aligned, qkv and key_anchors 2-byte aligned, the int32 arrays 4-byte aligned.
// Returns cudaErrorInvalidValue (message in kv_append_last_error()) for rejected shapes or pointers, otherwise the
// launch's error, if any. No allocation or synchronisation: graph-capturable. rows == 0 launches nothing.
cudaError_t kv_append(formats::KvFormat format, const __nv_bfloat16* qkv, int row_stride, int k_offset, int v_offset,
                      int rows, int n_kv_heads, int head_dim, const int32_t* row_page, const int32_t* row_slot,
                      const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool, cudaStream_t stream);

// cudaSuccess when kv_key_anchor_compute handles the shape: head_dim a multiple of 32 up to kKvAppendMaxHeadDim,
// 1 <= n_kv_heads <= 65535, 0 <= n_seqs <= 65535, the K slice inside a row of row_stride elements. Needs no device.
cudaError_t kv_key_anchor_compute_can_implement(int n_kv_heads, int head_dim, int n_seqs, int row_stride, int k_offset,
                                                std::string* why);

// For each of n_seqs sequences whose first chunk is rows [first_row[i], first_row[i] + row_count[i]) of qkv:
// key_anchors[(anchor_index[i] * n_kv_heads + h) * head_dim + c] = formats::kv_key_anchor(INT4_HADAMARD, that
// chunk's keys of head h): fp64 sums of the raw keys in token order, fp32 mean, the mean rotated as
// formats::kv_rotate_query does (hadamard_blocks with kv_hadamard_block(INT4_HADAMARD, head_dim)), fp16 RNE with
// saturation to ±65504 (NaN → 0); bit-identical. A sequence with row_count[i] <= 0, first_row[i] < 0 or anchor_index[i] < 0 is skipped.
// Call it before kv_append of the same rows, on the same stream. Pointers and errors as for kv_append.
cudaError_t kv_key_anchor_compute(const __nv_bfloat16* qkv, int row_stride, int k_offset, int n_kv_heads, int head_dim,
                                  int n_seqs, const int32_t* first_row, const int32_t* row_count,
                                  const int32_t* anchor_index, uint16_t* key_anchors, cudaStream_t stream);

// Why the last kv_append or kv_key_anchor_compute call on this thread returned cudaErrorInvalidValue ("" after a
// success).
const char* kv_append_last_error();

}  // namespace futransformer::cuda
