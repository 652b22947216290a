// Internal switches of the fused decoder ops, for tests and benches (not part of the public API).
#pragma once

#include "futransformer/formats/kv_cache.h"

namespace futransformer::cuda {

// Which kernel kv_append_rotate_q runs where the quad-per-head kernel applies (INT4 / INT4_HADAMARD caches,
// head_dim 128, 16-byte aligned qkv and q_out): kDefault follows FT_QKV_QUAD (=1: quad; otherwise the warp-per-head
// kernel — the quad kernel was built after the seventh session's last device call and has not run yet), kOff / kOn
// force it. Process-wide, not thread-safe: set it before enqueueing.
enum class QuadAppend { kDefault, kOff, kOn };
void set_kv_append_rotate_q_quad(QuadAppend mode);
// Whether kv_append_rotate_q would run the quad kernel for these arguments under the current setting.
bool kv_append_rotate_q_uses_quad(formats::KvFormat format, int head_dim, const void* qkv, const void* q_out);

}  // namespace futransformer::cuda
