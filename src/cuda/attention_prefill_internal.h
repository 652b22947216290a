// Internal entry point of the prefill attention: the same call as cuda::attention_prefill with the kernel chosen
// explicitly, so tests and the bench run both designs in one process. Not part of the public API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "futransformer/cuda/attention_prefill.h"

namespace futransformer::cuda {

enum class AttentionPrefillKernel {
  kWgmma,    // warp-specialised, wgmma (attention_prefill_wgmma.cuh): a producer and two consumer warpgroups,
             // 128-vector tiles, one CTA per SM, the lean softmax — the default
  kMmaSync,  // the first design, mma.sync m16n8k16 with the dequantisation between barriers (attention_prefill.cuh)
};

// Name used by FT_PREFILL_ATTENTION and the bench: "wgmma", "mma-sync".
const char* attention_prefill_kernel_name(AttentionPrefillKernel kernel);

// The kernel attention_prefill runs: kWgmma unless FT_PREFILL_ATTENTION names another (read once per process).
AttentionPrefillKernel attention_prefill_default_kernel();

// The wgmma kernel's consumer ping-pong (FlashAttention-3's: the two consumer warpgroups take turns issuing their
// wgmmas, so one's softmax overlaps the other's tensor-core work; same arithmetic, same bits). kDefault follows
// FT_PREFILL_PINGPONG (off unless it is 1: built after the ninth session's last device call, not yet measured);
// kOff / kOn force it. Process-wide, not thread-safe: set it before enqueueing.
enum class PrefillPingPong { kDefault, kOff, kOn };
void set_attention_prefill_pingpong(PrefillPingPong mode);
bool pingpong_enabled();  // what the next wgmma launch will use

// attention_prefill with `kernel` instead of the default; same checks, errors and contract.
cudaError_t attention_prefill_with(AttentionPrefillKernel kernel, formats::KvFormat format, const __nv_bfloat16* q,
                                   const uint8_t* kv_pool, const int32_t* block_table, const int32_t* chunk_first_row,
                                   const int32_t* chunk_start_pos, __nv_bfloat16* out, int rows, int n_chunks,
                                   int n_heads, int n_kv_heads, int head_dim, int max_pages_per_seq,
                                   int max_chunk_rows, cudaStream_t stream);

}  // namespace futransformer::cuda
