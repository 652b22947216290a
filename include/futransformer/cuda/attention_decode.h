// Decode attention over the paged KV cache on Hopper (sm_90a): one new query token per sequence, GQA, fp32
// softmax, BF16 output. docs/kernels.md describes the kernel; docs/formats.md the page bytes it reads.
//
//   q            BF16 [batch, n_heads, head_dim]. For an INT4_HADAMARD cache q must already be rotated
//                (H·q, formats::kv_rotate_query; the QKV epilogue does it), in which case
//   out          BF16 [batch, n_heads, head_dim] is in the cache's rotated basis too: out = H·o. The caller
//                un-rotates it (the O projection with Hᵀ folded into its weights offline, or an explicit
//                formats::kv_unrotate_output / rotate_heads_bf16), or attention_decode_int4_unrotated does it
//                where it can. For INT4 and BF16 caches both are in the model's basis.
//   kv_pool      one layer's pages: the page (64 token slots, formats::kv_page_layout(format, head_dim)) of
//                KV head h of page id p is at kv_pool + (p * n_kv_heads + h) * page_bytes; 16-byte aligned.
//   block_table  int32 [batch, max_pages_per_seq]: block_table[b * max_pages_per_seq + i] is the page id of
//                sequence b's tokens 64 i .. 64 i + 63 (shared by all layers); entries covering seq_lens[b]
//                tokens must be valid page ids of kv_pool.
//   seq_lens     int32 [batch]: tokens of each sequence in the cache (the new token included), at most
//                max_pages_per_seq * 64 (larger values are clamped to it); 0 gives a zero output.
//   max_seq_len  host-side upper bound of seq_lens (it sizes the split of long sequences across CTAs).
// scores = q·k / sqrt(head_dim); the softmax and both products accumulate in fp32 (mma bf16 inputs: INT4 codes
// enter as exact integers, key scales are applied in fp32, value scales are folded into the probabilities).
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

constexpr int kAttentionDecodeMaxGqa = 8;           // n_heads / n_kv_heads
constexpr int kAttentionDecodeMaxTokens = 1 << 24;  // max_pages_per_seq * 64
constexpr int kAttentionDecodeMaxGrid = 65535;      // batch and n_kv_heads

// cudaSuccess when a kernel handles the shape for `format` (INT4 and INT4_HADAMARD: attention_decode_int4;
// BF16: attention_decode_bf16; FP8 is not supported); otherwise cudaErrorInvalidValue and, when why is not
// null, a sentence naming the offending parameter and what is expected. Needs no device.
cudaError_t attention_decode_can_implement(formats::KvFormat format, int batch, int n_heads, int n_kv_heads,
                                           int head_dim, int max_pages_per_seq, int max_seq_len, std::string* why);

// Workspace bytes the call needs on the current device (0 when it does not split sequences across CTAs, for
// rejected shapes, and without a device).
size_t attention_decode_workspace_bytes(formats::KvFormat format, int batch, int n_heads, int n_kv_heads, int head_dim,
                                        int max_pages_per_seq, int max_seq_len);

// Enqueue the attention on `stream`. Device pointers; q, kv_pool and workspace 16-byte aligned, out 2-byte
// aligned; the workspace must not be used by a concurrent launch. Returns cudaErrorInvalidValue (message in
// attention_decode_last_error()) for rejected shapes, null or misaligned pointers or a workspace smaller than
// attention_decode_workspace_bytes; otherwise the launch's error, if any. Deterministic. Under programmatic launch
// (on by default, FT_PDL=0 off) seq_lens is read before the kernel's griddepcontrol.wait, possibly while kernels
// enqueued before it still run: none of those may write it (q, the cache and the block table are read after).
//
// early_copies (decode steps): the caller promises that, of the cache entries this call reads, kernels enqueued before
// it that may still run write only each sequence's last token (seq_lens[b] − 1) — as in a decode step, where the
// attention prologue appends that token and nothing else. The kernel then copies every other cache tile (and reads
// the block table) before its griddepcontrol.wait, so those copies overlap the kernel before it; the tile holding the
// last token is copied after the wait. Same output bits either way. false: everything is read after the wait.
cudaError_t attention_decode_int4(const __nv_bfloat16* q, const uint8_t* kv_pool, const int32_t* block_table,
                                  const int32_t* seq_lens, __nv_bfloat16* out, int batch, int n_heads, int n_kv_heads,
                                  int head_dim, int max_pages_per_seq, int max_seq_len, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream, bool early_copies = false);
cudaError_t attention_decode_bf16(const __nv_bfloat16* q, const uint8_t* kv_pool, const int32_t* block_table,
                                  const int32_t* seq_lens, __nv_bfloat16* out, int batch, int n_heads, int n_kv_heads,
                                  int head_dim, int max_pages_per_seq, int max_seq_len, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream, bool early_copies = false);

// attention_decode_int4, fused with the un-rotation of an INT4_HADAMARD output: with unrotate_block > 1, the kernel
// that finishes each output head — the combine (kernel or cluster) of a plan that splits the sequences across CTAs,
// the decode kernel itself after its cross-warp merge otherwise — applies the normalised block-diagonal
// Walsh–Hadamard transform of block unrotate_block to the BF16-rounded head before storing it: the same bits as
// attention_decode_int4 followed by rotate_heads_bf16(out, n_heads * head_dim, out, batch, n_heads, head_dim,
// unrotate_block) (src/cuda/engine/engine_kernels.h), one kernel fewer, and *unrotated becomes true. With
// unrotate_block 0 or 1 the output is exactly attention_decode_int4's and *unrotated is false. *unrotated is known
// on the host when the call returns. unrotate_block must be 0, 1 or a power of two dividing head_dim and unrotated
// non-null: cudaErrorInvalidValue naming the parameter otherwise (*unrotated false). Same contract otherwise.
cudaError_t attention_decode_int4_unrotated(const __nv_bfloat16* q, const uint8_t* kv_pool,
                                            const int32_t* block_table, const int32_t* seq_lens, __nv_bfloat16* out,
                                            int batch, int n_heads, int n_kv_heads, int head_dim,
                                            int max_pages_per_seq, int max_seq_len, int unrotate_block,
                                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                            bool* unrotated, bool early_copies = false);

// The decode step's attention prologue and attention_decode_int4_unrotated in one kernel (an INT4 or INT4_HADAMARD
// cache at head_dim 128, one new token per sequence). The fields are qkv_rope_kv_append's (fused_ops.h), for
// rows = batch: row b of qkv is the QKV projection of sequence b's new token, whose cache slot (row_page[b],
// row_slot[b]) must be the entry of token seq_lens[b] − 1 in the block table (padding rows: row_page[b] < 0 and
// seq_lens[b] = 0, or any length whose last token is not appended). hadamard_block is the query rotation's block.
struct AttentionDecodePrologue {
  formats::KvFormat format;
  const __nv_bfloat16* qkv;  // [batch, (n_heads + 2 n_kv_heads) * head_dim], 16-byte aligned; not written
  const int32_t* positions;
  const float* inv_freq;
  const int32_t* row_page;
  const int32_t* row_slot;
  const uint16_t* key_anchors;  // int4-hadamard only
  const int32_t* row_anchor;    // int4-hadamard only
  int hadamard_block;
};

// Bit for bit: qkv_rope_kv_append(p.format, qkv, batch, n_heads, n_kv_heads, head_dim, p.positions, p.inv_freq,
// p.row_page, p.row_slot, p.key_anchors, p.row_anchor, kv_pool, p.hadamard_block, q) followed by
// attention_decode_int4_unrotated(q, kv_pool, ...) with the other arguments given here: the same cache bytes, the
// same out and the same *unrotated — except that the RoPE'd q and k are not written back into qkv and no q buffer is
// written. Each CTA RoPEs and rotates its own query heads; the CTA whose split holds a sequence's last token encodes
// that token's key and value into the cache before reading it. Programmatic launch: positions, inv_freq, row_page,
// row_slot, row_anchor, seq_lens, the block table, key_anchors (prefetched into L1) AND every cache entry except each
// sequence's new token are read before griddepcontrol.wait (in a decode step no kernel of the pass writes them); qkv
// after. The
// workspace is attention_decode_workspace_bytes(p.format, ...)'s. Rejected arguments (qkv_rope_kv_append's and
// attention_decode's checks, another format or head dim, qkv not 16-byte aligned, unrotated null) return
// cudaErrorInvalidValue with the reason in attention_decode_last_error().
cudaError_t attention_decode_int4_with_prologue(const AttentionDecodePrologue& p, uint8_t* kv_pool,
                                               const int32_t* block_table, const int32_t* seq_lens, __nv_bfloat16* out,
                                               int batch, int n_heads, int n_kv_heads, int head_dim,
                                               int max_pages_per_seq, int max_seq_len, int unrotate_block,
                                               void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                               bool* unrotated);

// Why the last attention_decode_* launch on this thread returned cudaErrorInvalidValue ("" after a success).
const char* attention_decode_last_error();

}  // namespace futransformer::cuda
