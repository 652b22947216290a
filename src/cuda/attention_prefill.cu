// Host side of the paged prefill attention: shape checks, kernel instance dispatch and the launch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/attention_prefill.cuh"
#include "cuda/attention_prefill_internal.h"
#include "cuda/attention_prefill_wgmma.cuh"
#include "cuda/launch_status.h"
#include "futransformer/cuda/attention_prefill.h"
#include "futransformer/formats/hadamard.h"

namespace futransformer::cuda {
namespace {

using formats::KvFormat;

thread_local std::string g_last_error;

bool is_int4(KvFormat f) { return f == KvFormat::INT4 || f == KvFormat::INT4_HADAMARD; }

using PrefillFn = void (*)(prefill::PrefillArgs);

template <bool kInt4, int kD>
constexpr int smem_bytes() {
  return prefill::Layout<kInt4, kD>::kSmemBytes;
}

PrefillFn pick_wgmma(bool int4, int head_dim, int* smem) {
  namespace w = prefill_wgmma;
  if (int4) {
    *smem = head_dim == 128 ? w::Layout<true, 128>::kAllocBytes : w::Layout<true, 64>::kAllocBytes;
    return head_dim == 128 ? w::attention_prefill_wgmma_kernel<true, 128> : w::attention_prefill_wgmma_kernel<true, 64>;
  }
  *smem = head_dim == 128 ? w::Layout<false, 128>::kAllocBytes : w::Layout<false, 64>::kAllocBytes;
  return head_dim == 128 ? w::attention_prefill_wgmma_kernel<false, 128> : w::attention_prefill_wgmma_kernel<false, 64>;
}

PrefillFn pick(bool int4, int head_dim, int* smem) {
  if (int4) {
    *smem = head_dim == 128 ? smem_bytes<true, 128>() : smem_bytes<true, 64>();
    return head_dim == 128 ? prefill::attention_prefill_kernel<true, 128> : prefill::attention_prefill_kernel<true, 64>;
  }
  *smem = head_dim == 128 ? smem_bytes<false, 128>() : smem_bytes<false, 64>();
  return head_dim == 128 ? prefill::attention_prefill_kernel<false, 128> : prefill::attention_prefill_kernel<false, 64>;
}

}  // namespace

cudaError_t attention_prefill_can_implement(KvFormat format, int rows, int n_chunks, int n_heads, int n_kv_heads,
                                            int head_dim, int max_pages_per_seq, int max_chunk_rows,
                                            std::string* why) {
  using std::to_string;
  if (format != KvFormat::BF16 && !is_int4(format))
    return reject(why, std::string("attention_prefill: KV format ") + formats::kv_format_name(format) +
                           " is not supported (expected bf16, int4 or int4-hadamard)");
  if (head_dim != 64 && head_dim != 128)
    return reject(why,
                  "attention_prefill: head_dim = " + to_string(head_dim) + " is not supported (expected 64 or 128)");
  if (n_kv_heads < 1 || n_kv_heads > kAttentionPrefillMaxGrid)
    return reject(why, "attention_prefill: n_kv_heads = " + to_string(n_kv_heads) + ", expected 1.." +
                           to_string(kAttentionPrefillMaxGrid));
  if (n_heads < 1 || n_heads % n_kv_heads != 0 || n_heads / n_kv_heads > kAttentionPrefillMaxGqa)
    return reject(why, "attention_prefill: n_heads = " + to_string(n_heads) + " with n_kv_heads = " +
                           to_string(n_kv_heads) + ", expected a multiple of n_kv_heads with at most " +
                           to_string(kAttentionPrefillMaxGqa) + " query heads per KV head");
  if (rows < 0 || rows > kAttentionPrefillMaxRows)
    return reject(why, "attention_prefill: rows = " + to_string(rows) + ", expected 0.." +
                           to_string(kAttentionPrefillMaxRows));
  if (n_chunks < 0 || n_chunks > kAttentionPrefillMaxGrid)
    return reject(why, "attention_prefill: n_chunks = " + to_string(n_chunks) + ", expected 0.." +
                           to_string(kAttentionPrefillMaxGrid));
  if (max_chunk_rows < 0 || max_chunk_rows > rows)
    return reject(why, "attention_prefill: max_chunk_rows = " + to_string(max_chunk_rows) + ", expected 0.." +
                           to_string(rows) + " (rows)");
  if (max_pages_per_seq < 1 || max_pages_per_seq > kAttentionPrefillMaxTokens / prefill::kBlockTokens)
    return reject(why, "attention_prefill: max_pages_per_seq = " + to_string(max_pages_per_seq) + ", expected 1.." +
                           to_string(kAttentionPrefillMaxTokens / prefill::kBlockTokens));
  if (why) why->clear();
  return cudaSuccess;
}

const char* attention_prefill_last_error() { return g_last_error.c_str(); }

const char* attention_prefill_kernel_name(AttentionPrefillKernel kernel) {
  return kernel == AttentionPrefillKernel::kMmaSync ? "mma-sync" : "wgmma";
}

namespace {
PrefillPingPong g_pingpong = PrefillPingPong::kDefault;
}  // namespace

void set_attention_prefill_pingpong(PrefillPingPong mode) { g_pingpong = mode; }

bool pingpong_enabled() {
  if (g_pingpong != PrefillPingPong::kDefault) return g_pingpong == PrefillPingPong::kOn;
  static const bool env = [] {
    const char* e = std::getenv("FT_PREFILL_PINGPONG");
    return e != nullptr && e[0] == '1';
  }();
  return env;
}

AttentionPrefillKernel attention_prefill_default_kernel() {
  static const AttentionPrefillKernel k = [] {
    const char* e = std::getenv("FT_PREFILL_ATTENTION");
    const char* mma_sync = attention_prefill_kernel_name(AttentionPrefillKernel::kMmaSync);
    return e != nullptr && std::strcmp(e, mma_sync) == 0 ? AttentionPrefillKernel::kMmaSync
                                                         : AttentionPrefillKernel::kWgmma;
  }();
  return k;
}

cudaError_t attention_prefill(KvFormat format, const __nv_bfloat16* q, const uint8_t* kv_pool,
                              const int32_t* block_table, const int32_t* chunk_first_row,
                              const int32_t* chunk_start_pos, __nv_bfloat16* out, int rows, int n_chunks, int n_heads,
                              int n_kv_heads, int head_dim, int max_pages_per_seq, int max_chunk_rows,
                              cudaStream_t stream) {
  return attention_prefill_with(attention_prefill_default_kernel(), format, q, kv_pool, block_table, chunk_first_row,
                                chunk_start_pos, out, rows, n_chunks, n_heads, n_kv_heads, head_dim,
                                max_pages_per_seq, max_chunk_rows, stream);
}

namespace {

// attention_prefill_with, and with unrotate_block > 1 (INT4_HADAMARD, the default wgmma shape only: the caller
// checked) the un-rotating instance of the wgmma kernel (the caller checked that it is the default).
cudaError_t launch_prefill(AttentionPrefillKernel which, KvFormat format, const __nv_bfloat16* q,
                           const uint8_t* kv_pool, const int32_t* block_table, const int32_t* chunk_first_row,
                           const int32_t* chunk_start_pos, __nv_bfloat16* out, int rows, int n_chunks, int n_heads,
                           int n_kv_heads, int head_dim, int max_pages_per_seq, int max_chunk_rows, int unrotate_block,
                           cudaStream_t stream) {
  g_last_error.clear();
  if (attention_prefill_can_implement(format, rows, n_chunks, n_heads, n_kv_heads, head_dim, max_pages_per_seq,
                                      max_chunk_rows, &g_last_error) != cudaSuccess)
    return cudaErrorInvalidValue;
  if (rows == 0 || n_chunks == 0 || max_chunk_rows == 0) return cudaSuccess;  // nothing to compute
  if (!q || !kv_pool || !block_table || !chunk_first_row || !chunk_start_pos || !out || !aligned(q, 4) ||
      !aligned(out, 4) || !aligned(kv_pool, 16) || !aligned(block_table, 4) || !aligned(chunk_first_row, 4) ||
      !aligned(chunk_start_pos, 4)) {
    return reject(&g_last_error,
                  "attention_prefill: q, kv_pool, block_table, chunk_first_row, chunk_start_pos and out must be "
                  "non-null; kv_pool 16-byte aligned, q, out and the int32 arrays 4-byte aligned");
  }
  const int gqa = n_heads / n_kv_heads;
  int smem = 0;
  PrefillFn kernel = nullptr;
  int threads = 0, tile_vectors = 0;
  if (which == AttentionPrefillKernel::kMmaSync) {
    kernel = pick(is_int4(format), head_dim, &smem);
    threads = prefill::kThreads;
    tile_vectors = prefill::kTileVectors;
  } else {
    kernel = pick_wgmma(is_int4(format), head_dim, &smem);
    threads = prefill_wgmma::Shape::kThreads;
    tile_vectors = prefill_wgmma::Shape::kTileVectors;
  }
  if (unrotate_block > 1) {
    kernel = head_dim == 128 ? prefill_wgmma::attention_prefill_wgmma_kernel<true, 128, true>
                             : prefill_wgmma::attention_prefill_wgmma_kernel<true, 64, true>;
  }
  const int tiles = prefill_wgmma::tiles_for_rows(max_chunk_rows, gqa, tile_vectors);
  if (print_heuristics()) {
    std::fprintf(stderr,
                 "attention_prefill (%s): %s head_dim %d, %d/%d heads, %d chunks of <= %d rows: grid %d x %d x %d "
                 "CTAs of %d threads (%d query vectors each), %d bytes of shared memory\n",
                 attention_prefill_kernel_name(which), formats::kv_format_name(format), head_dim, n_heads,
                 n_kv_heads, n_chunks, max_chunk_rows, tiles, n_kv_heads, n_chunks, threads, tile_vectors, smem);
  }
  if (smem > 48 * 1024) {
    // Per function and device; cheap enough to repeat, and it keeps multi-device use correct.
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess)
      return e;
  }
  const prefill::PrefillArgs args{q,
                                  kv_pool,
                                  block_table,
                                  chunk_first_row,
                                  chunk_start_pos,
                                  out,
                                  rows,
                                  n_heads,
                                  n_kv_heads,
                                  gqa,
                                  max_pages_per_seq,
                                  max_chunk_rows,
                                  static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(head_dim))),
                                  unrotate_block,
                                  // rotate_heads_bf16's scale: formats::hadamard_scale's formula
                                  unrotate_block > 1 ? formats::hadamard_scale(unrotate_block) : 1.0f,
                                  which == AttentionPrefillKernel::kWgmma && pingpong_enabled() ? 1 : 0};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(n_kv_heads), static_cast<unsigned>(n_chunks));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  return launch_kernel_ex(&cfg, kernel, args);
}

}  // namespace

cudaError_t attention_prefill_with(AttentionPrefillKernel which, KvFormat format, const __nv_bfloat16* q,
                                   const uint8_t* kv_pool, const int32_t* block_table, const int32_t* chunk_first_row,
                                   const int32_t* chunk_start_pos, __nv_bfloat16* out, int rows, int n_chunks,
                                   int n_heads, int n_kv_heads, int head_dim, int max_pages_per_seq,
                                   int max_chunk_rows, cudaStream_t stream) {
  return launch_prefill(which, format, q, kv_pool, block_table, chunk_first_row, chunk_start_pos, out, rows, n_chunks,
                        n_heads, n_kv_heads, head_dim, max_pages_per_seq, max_chunk_rows, 0, stream);
}

cudaError_t attention_prefill_int4_unrotated(const __nv_bfloat16* q, const uint8_t* kv_pool,
                                             const int32_t* block_table, const int32_t* chunk_first_row,
                                             const int32_t* chunk_start_pos, __nv_bfloat16* out, int rows,
                                             int n_chunks, int n_heads, int n_kv_heads, int head_dim,
                                             int max_pages_per_seq, int max_chunk_rows, int hadamard_block,
                                             cudaStream_t stream, bool* unrotated) {
  if (unrotated) *unrotated = false;
  g_last_error.clear();
  if (hadamard_block < 2 || (hadamard_block & (hadamard_block - 1)) != 0 || hadamard_block > head_dim)
    return reject(&g_last_error, "attention_prefill_int4_unrotated: hadamard_block = " +
                                     std::to_string(hadamard_block) + ", expected a power of two in 2.." +
                                     std::to_string(head_dim) + " (head_dim)");
  const AttentionPrefillKernel which = attention_prefill_default_kernel();
  const bool fused = which == AttentionPrefillKernel::kWgmma;  // the kernel with un-rotating instances
  const cudaError_t e =
      launch_prefill(which, KvFormat::INT4_HADAMARD, q, kv_pool, block_table, chunk_first_row, chunk_start_pos, out,
                     rows, n_chunks, n_heads, n_kv_heads, head_dim, max_pages_per_seq, max_chunk_rows,
                     fused ? hadamard_block : 0, stream);
  if (e == cudaSuccess && unrotated) *unrotated = fused;
  return e;
}

}  // namespace futransformer::cuda
