// Internal switches of the fused decoder ops, for tests and benches (not part of the public API).
#pragma once

#include "futransformer/formats/kv_cache.h"

namespace futransformer::cuda {

// Which kernel kv_append_rotate_q and qkv_rope_kv_append run where the quad-per-head kernel applies (INT4 /
// INT4_HADAMARD caches, head_dim 128, at least 11 head items per row, 16-byte aligned qkv and q_out): kDefault
// follows FT_QKV_QUAD (quad unless it is 0: the eighth session measured 77.5 -> 31.0 us per 8B prefill layer at
// 2048 rows and 9.3 -> 8.4 us at decode batch 1, never slower), kOff / kOn force it. Process-wide, not thread-safe:
// set it before enqueueing. (The W4A16 GEMM's split-K QKV epilogue keeps the warp-per-head code.) Where it applies,
// the kernel runs quads (4 lanes per head item) or octets (8 lanes): kDefault octets for passes of up to
// fused::kOctetMaxRows rows (every pass; FT_QKV_OCTET_MAX_ROWS lowers it), kOn always quads, kOctet always octets.
enum class QuadAppend { kDefault, kOff, kOn, kOctet };
void set_kv_append_rotate_q_quad(QuadAppend mode);
// Whether kv_append_rotate_q / qkv_rope_kv_append would run the quad kernel for these arguments now.
bool qkv_append_uses_quad(formats::KvFormat format, int n_heads, int n_kv_heads, int head_dim, const void* qkv,
                          const void* q_out);

}  // namespace futransformer::cuda
