// Generic decode attention over the paged KV cache: the fallback for the shapes that the fast kernel
// (attention_decode.h: head_dim 64/128, at most 8 query heads per KV head) rejects, e.g. stories260K's head_dim 8.
// One new query token per sequence, any GQA ratio, fp32 scores / online softmax / P·V, BF16 output.
// Needs sm_90 (the split of a sequence across CTAs is merged through a thread-block cluster).
//
// The same conventions as attention_decode.h:
//   q            BF16 [batch, n_heads, head_dim]; for an INT4_HADAMARD cache already rotated (H·q), in which case
//   out          BF16 [batch, n_heads, head_dim] is in the cache's rotated basis too (H·o). BF16 and INT4: the
//                model's basis.
//   kv_pool      one layer's pages (64 token slots, formats::kv_page_layout(format, head_dim)): the page of KV head
//                h of page id p is at kv_pool + (p * n_kv_heads + h) * page_bytes; 16-byte aligned.
//   block_table  int32 [batch, max_pages_per_seq]: page ids of sequence b's tokens 64 i .. 64 i + 63; the entries
//                that cover seq_lens[b] tokens must be valid page ids of kv_pool (the others are never read).
//   seq_lens     int32 [batch]: tokens of each sequence (the new one included); values above
//                max_pages_per_seq * 64 are clamped to it, 0 (or a negative value) gives a zero output.
// Query head h reads KV head h / (n_heads / n_kv_heads). scores = q·k / sqrt(head_dim), all in fp32 (INT4 values
// decode exactly to (u − z)·s in fp32). Needs no workspace, never synchronises or allocates: a launch can be
// captured into a CUDA graph. Deterministic (fixed summation orders).
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

constexpr int kAttentionGenericMaxHeadDim = 512;
constexpr int kAttentionGenericMaxGrid = 65535;      // batch and n_heads (grid z and y)
constexpr int kAttentionGenericMaxTokens = 1 << 30;  // max_pages_per_seq * 64, as ref::paged_decode_attention

// cudaSuccess when attention_decode_generic handles the shape: format BF16 (head_dim a multiple of 8, 8..512),
// INT4 or INT4_HADAMARD (a multiple of 32, 32..512); FP8 is not supported. batch 1..65535, n_kv_heads >= 1,
// n_heads 1..65535 and a multiple of n_kv_heads, max_pages_per_seq 1..2^24. Otherwise cudaErrorInvalidValue and,
// when why is not null, a sentence naming the offending parameter and what is expected. Needs no device.
cudaError_t attention_generic_can_implement(formats::KvFormat format, int batch, int n_heads, int n_kv_heads,
                                            int head_dim, int max_pages_per_seq, std::string* why);

// Enqueue the attention on `stream`. Device pointers: kv_pool 16-byte aligned, q and out 2-byte aligned,
// block_table and seq_lens 4-byte aligned. Returns cudaErrorInvalidValue (message in
// attention_generic_last_error()) for rejected shapes and null or misaligned pointers, before touching the
// device; otherwise the launch's error, if any.
cudaError_t attention_decode_generic(formats::KvFormat format, const __nv_bfloat16* q, const uint8_t* kv_pool,
                                     const int32_t* block_table, const int32_t* seq_lens, __nv_bfloat16* out, int batch,
                                     int n_heads, int n_kv_heads, int head_dim, int max_pages_per_seq,
                                     cudaStream_t stream);

// Why the last attention_decode_generic call on this thread returned cudaErrorInvalidValue ("" after a success).
const char* attention_generic_last_error();

}  // namespace futransformer::cuda
