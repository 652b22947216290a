// The QKV projection of FP8 prefill with the attention prologue in its epilogue (sm_90a), for INT4 and int4-hadamard
// KV caches at head_dim 128:
//   D[m][n] = bf16((A · B^T)[m][n] · a_scale[m] · b_scale[n])       gemm_fp8's BF16 output, never written to memory
// and, on D's rows [q (n_heads heads) | k (n_kv_heads) | v (n_kv_heads)] of 128 channels each:
//   q heads → RoPE (rope_qk_bf16's arithmetic) → Hadamard with hadamard_block → BF16 q_out [M, n_heads, 128];
//   k heads → RoPE → either (qkv_keys == nullptr) the cache slot (row_page, row_slot) by kv_append's rule (int4-hadamard:
//             rotated, the row's key anchor subtracted when row_anchor >= 0), or (qkv_keys != nullptr) the RoPE'd
//             BF16 keys into qkv_keys's k slice (a [M, (n_heads + 2 n_kv_heads) · 128] buffer; q and v slices untouched);
//   v heads → the cache slot by kv_append's rule.
// Bit for bit: gemm_fp8 into qkv, rope_qk_bf16, then kv_append_rotate_q (or, with qkv_keys, its q and v part only;
// the keys then follow with kv_key_anchor_compute and kv_append_keys, fused_ops.h — the order a pass that starts
// int4-hadamard sequences needs, because a key anchor is a mean over the chunk's RoPE'd keys).
// rope_cos_sin: the pass's table from rope_cos_sin_table (decoder_ops.h), [M, 64] (cos, sin) fp32 pairs.
// Padding rows (row_page < 0) get q_out but no cache bytes, as in kv_append_rotate_q.
// Accepted: M >= 1, K a multiple of 16 (gemm_fp8's), head_dim 128, n_heads and n_kv_heads >= 1, hadamard_block 0, 1 or
// a power of two up to 128, A / B / q_out / kv_pool / qkv_keys 16-byte aligned, scales and metadata 4-byte aligned
// (anchors 2), int4-hadamard with key_anchors and row_anchor, an sm_90 device; anything else returns
// cudaErrorInvalidValue with the reason in gemm_fp8_qkv_last_error() and launches nothing. Graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;  // cuda_bf16.h's type, used through pointers only

namespace futransformer::cuda {

constexpr int kFp8QkvHeadDim = 128;  // one 128-column tile per head

struct GemmFp8QkvArgs {
  formats::KvFormat format = formats::KvFormat::INT4_HADAMARD;  // INT4 or INT4_HADAMARD
  int n_heads = 0, n_kv_heads = 0, head_dim = kFp8QkvHeadDim;
  const float* rope_cos_sin = nullptr;  // [M, head_dim / 2, 2]
  const int32_t* row_page = nullptr;
  const int32_t* row_slot = nullptr;
  const uint16_t* key_anchors = nullptr;  // int4-hadamard
  const int32_t* row_anchor = nullptr;    // int4-hadamard
  uint8_t* kv_pool = nullptr;             // one layer's pages
  int hadamard_block = 0;                 // q's rotation (0 / 1: none)
  __nv_bfloat16* q_out = nullptr;         // [M, n_heads, head_dim]
  __nv_bfloat16* qkv_keys = nullptr;      // non-null: keys as RoPE'd BF16 here instead of into the cache
};

// cudaSuccess when gemm_fp8_qkv takes the shape; otherwise cudaErrorInvalidValue and, when why is not null, a
// sentence naming the parameter and what is expected. Needs no device.
cudaError_t gemm_fp8_qkv_can_implement(formats::KvFormat format, int M, int n_heads, int n_kv_heads, int head_dim,
                                       int K, int hadamard_block, std::string* why);

// A: per-token E4M3 codes [M, K] with a_scale [M]; B: the qkv weight's E4M3 codes [(n_heads + 2 n_kv_heads) · 128, K]
// with b_scale per row (gemm_fp8's operands).
cudaError_t gemm_fp8_qkv(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale, int M, int K,
                         const GemmFp8QkvArgs& args, cudaStream_t stream);

// Why the last gemm_fp8_qkv call on this thread returned cudaErrorInvalidValue ("" after a success).
const char* gemm_fp8_qkv_last_error();

}  // namespace futransformer::cuda
