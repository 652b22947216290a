// Prefill attention over the paged KV cache on Hopper (sm_90a): the rows of prompt chunks attend causally to their
// sequence's cache, GQA, fp32 softmax, BF16 output. docs/kernels.md ("Prefill attention") describes the kernel;
// docs/formats.md the page bytes it reads.
//
// A call serves n_chunks chunks; chunk c is rows chunk_first_row[c] .. chunk_first_row[c + 1] − 1 of q / out, all of
// one sequence, whose block table is row c of block_table. Row i of chunk c (row r = chunk_first_row[c] + i) attends
// to cache positions 0 .. chunk_start_pos[c] + i, i.e. as a decode query with seq_len = chunk_start_pos[c] + i + 1.
// The chunk's own keys and values must already be in the cache (the engine appends before it attends): the kernel
// reads every key and value from the paged pool, in the cache's format. This is deliberate: prompt rows then see
// exactly the bytes that later decode steps (attention_decode_*) and the reference engine (ref::PagedKvStore) see,
// not the higher-precision K/V the projections produced, so prefill and decode agree on what the cache holds.
//
//   q                BF16 [rows, n_heads, head_dim], 4-byte aligned. For an INT4_HADAMARD cache q must already be
//                    rotated (H·q, formats::kv_rotate_query), in which case
//   out              BF16 [rows, n_heads, head_dim], 4-byte aligned, is in the cache's rotated basis too (H·o; the
//                    caller un-rotates it, as for attention_decode_*). For INT4 and BF16 caches both are in the
//                    model's basis. Rows that belong to no chunk are not written.
//   kv_pool          one layer's pages: the page (64 token slots, formats::kv_page_layout(format, head_dim)) of KV
//                    head h of page id p is at kv_pool + (p * n_kv_heads + h) * page_bytes; 16-byte aligned.
//   block_table      int32 [n_chunks, max_pages_per_seq]: page ids of each chunk's sequence (entry i holds tokens
//                    64 i .. 64 i + 63); the entries covering chunk_start_pos[c] + (rows of c) tokens must be valid.
//   chunk_first_row  int32 [n_chunks + 1]: non-decreasing prefix offsets into the rows, the last at most `rows`;
//                    no chunk may have more than max_chunk_rows rows (extra rows are not computed).
//   chunk_start_pos  int32 [n_chunks]: tokens already in the cache before the chunk's first row (negative values
//                    count as 0; positions beyond max_pages_per_seq * 64 − 1 are clamped to it).
//   max_chunk_rows   host-side upper bound of the chunks' row counts (it sizes the grid).
// scores = q·k / sqrt(head_dim); both products accumulate in fp32, the output is rounded once to BF16.
// Deterministic (no atomics, no split of the keys). The default kernel (warp-specialised wgmma, docs/kernels.md)
// reads BF16 caches as BF16 and rounds the probabilities to BF16 before P·V; it dequantises INT4 caches once per CTA
// to f16 values (u − z)·s (one f16 rounding), converts q to f16 (exact for 2^-14 <= |q| <= 65504; larger |q|
// overflows) and rounds the probabilities to f16. The first design (FT_PREFILL_ATTENTION=mma-sync) keeps INT4 codes
// exact (u − z, key scales applied in fp32 to per-group dot products, value scales folded into the BF16-rounded
// probabilities).
// FP8 caches are rejected. Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

constexpr int kAttentionPrefillMaxGqa = 8;           // n_heads / n_kv_heads
constexpr int kAttentionPrefillMaxRows = 1 << 24;    // rows
constexpr int kAttentionPrefillMaxTokens = 1 << 24;  // max_pages_per_seq * 64
constexpr int kAttentionPrefillMaxGrid = 65535;      // n_chunks and n_kv_heads

// cudaSuccess when the kernel handles the shape for `format` (BF16, INT4, INT4_HADAMARD); otherwise
// cudaErrorInvalidValue and, when why is not null, a sentence naming the offending parameter and what is expected.
// rows, n_chunks and max_chunk_rows may be 0 (nothing to do). Needs no device.
cudaError_t attention_prefill_can_implement(formats::KvFormat format, int rows, int n_chunks, int n_heads,
                                            int n_kv_heads, int head_dim, int max_pages_per_seq, int max_chunk_rows,
                                            std::string* why);

// Enqueue the attention on `stream` (device pointers; graph-capturable: no host synchronisation, no workspace).
// Returns cudaErrorInvalidValue (message in attention_prefill_last_error()) for rejected shapes and null or
// misaligned pointers; otherwise the launch's error, if any.
cudaError_t attention_prefill(formats::KvFormat format, const __nv_bfloat16* q, const uint8_t* kv_pool,
                              const int32_t* block_table, const int32_t* chunk_first_row,
                              const int32_t* chunk_start_pos, __nv_bfloat16* out, int rows, int n_chunks, int n_heads,
                              int n_kv_heads, int head_dim, int max_pages_per_seq, int max_chunk_rows,
                              cudaStream_t stream);

// attention_prefill on an INT4_HADAMARD cache with the output un-rotated before it is stored (the model's basis):
// the same bits as attention_prefill followed by rotate_heads_bf16(out, n_heads * head_dim, out, rows, n_heads,
// head_dim, hadamard_block), one launch fewer. hadamard_block: a power of two in 2..head_dim. *unrotated (may be
// null) tells the caller whether the kernel did it: false when the prefill kernel in use (FT_PREFILL_ATTENTION) has no
// un-rotating instance — the output is then attention_prefill's and the caller un-rotates. Errors as
// attention_prefill (messages in attention_prefill_last_error()).
cudaError_t attention_prefill_int4_unrotated(const __nv_bfloat16* q, const uint8_t* kv_pool,
                                             const int32_t* block_table, const int32_t* chunk_first_row,
                                             const int32_t* chunk_start_pos, __nv_bfloat16* out, int rows,
                                             int n_chunks, int n_heads, int n_kv_heads, int head_dim,
                                             int max_pages_per_seq, int max_chunk_rows, int hadamard_block,
                                             cudaStream_t stream, bool* unrotated);

// Why the last attention_prefill call on this thread returned cudaErrorInvalidValue ("" after a success).
const char* attention_prefill_last_error();

}  // namespace futransformer::cuda
