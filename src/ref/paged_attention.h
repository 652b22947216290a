// CPU twin of the GPU decode attention over the paged KV cache (include/futransformer/cuda/attention_decode.h):
// the same page pool and block table, decoded with formats::kv_decode_token and attended with ref::attention
// in fp32. GPU tests and the CPU emulation of the kernel both compare against it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "futransformer/formats/kv_cache.h"

namespace futransformer::ref {

// One layer's paged cache: the page of KV head h of page id p is at pool + (p * n_kv_heads + h) * page_bytes;
// block_table[b * max_pages_per_seq + i] is the page id of sequence b's tokens 64 i .. 64 i + 63 (i.e.
// layout.page_tokens per page).
struct PagedKvCache {
  formats::KvPageLayout layout;
  std::span<const uint8_t> pool;  // a whole number of (n_kv_heads pages) blocks
  int64_t n_kv_heads = 0;
  std::span<const int32_t> block_table;  // [batch, max_pages_per_seq]
  int64_t max_pages_per_seq = 0;
};

// Decode attention of one query token per sequence: q [batch, n_heads, head_dim] (for int4-hadamard already
// rotated, as the cache), seq_lens[b] tokens per sequence. Returns out [batch, n_heads, head_dim] fp32 in the
// cache's basis; a sequence of length 0 gives zeros. When abs_out is not null it receives the same attention
// with every value replaced by its magnitude, Σ_t p_t |v_t| per element: the scale of the error that rounding
// the probabilities contributes, which tolerances are built from.
// Throws Error naming the field for inconsistent sizes, lengths beyond the block table, or page ids outside
// the pool.
std::vector<float> paged_decode_attention(const PagedKvCache& cache, std::span<const int32_t> seq_lens,
                                          std::span<const float> q, int64_t n_heads,
                                          std::vector<float>* abs_out = nullptr);

}  // namespace futransformer::ref
