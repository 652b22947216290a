// Host side of the paged decode attention: shape checks, split choice, kernel instance dispatch and the combine
// launch (programmatic dependent launch, so its launch latency hides behind the attention kernel).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/attention_decode.cuh"
#include "cuda/attention_decode_heuristics.h"
#include "cuda/fused_ops.cuh"
#include "cuda/launch_status.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/formats/hadamard.h"

namespace futransformer::cuda {
namespace {

using formats::KvFormat;

thread_local std::string g_last_error;

bool is_int4(KvFormat f) { return f == KvFormat::INT4 || f == KvFormat::INT4_HADAMARD; }

cudaError_t device_limits(attn::DeviceLimits* d) {
  int dev = 0, sms = 0, per_sm = 0, per_block = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  d->sm_count = sms;
  d->smem_per_sm = per_sm;
  d->smem_per_block = per_block;
  return cudaSuccess;
}

using DecodeFn = void (*)(attn::DecodeArgs, fused::QkvArgs);
using CombineFn = void (*)(const float*, const float*, __nv_bfloat16*, int, int, float);

// warps: the plan's (8 only where attn::has_eight_warp_instances: INT4, head_dim 128). cluster: the cluster-combine
// instances (no prologue; the caller checked).
DecodeFn pick_decode(bool int4, int head_dim, const fused::QkvArgs* pro, KvFormat pro_format, int warps,
                     bool cluster) {
  using attn::Prologue;
  if (pro) {  // the launcher checked: INT4 formats, head_dim 128
    if (pro_format == KvFormat::INT4_HADAMARD)
      return warps == 8 ? attn::attention_decode_kernel<true, 128, Prologue::kInt4Hadamard, 8>
                        : attn::attention_decode_kernel<true, 128, Prologue::kInt4Hadamard>;
    return warps == 8 ? attn::attention_decode_kernel<true, 128, Prologue::kInt4, 8>
                      : attn::attention_decode_kernel<true, 128, Prologue::kInt4>;
  }
  if (cluster) {
    if (int4 && head_dim == 128)
      return warps == 8 ? attn::attention_decode_kernel<true, 128, Prologue::kNone, 8, true>
                        : attn::attention_decode_kernel<true, 128, Prologue::kNone, attn::kWarps, true>;
    if (int4) return attn::attention_decode_kernel<true, 64, Prologue::kNone, attn::kWarps, true>;
    return head_dim == 128 ? attn::attention_decode_kernel<false, 128, Prologue::kNone, attn::kWarps, true>
                           : attn::attention_decode_kernel<false, 64, Prologue::kNone, attn::kWarps, true>;
  }
  if (int4 && head_dim == 128)
    return warps == 8 ? attn::attention_decode_kernel<true, 128, Prologue::kNone, 8>
                      : attn::attention_decode_kernel<true, 128>;
  if (int4) return attn::attention_decode_kernel<true, 64>;
  return head_dim == 128 ? attn::attention_decode_kernel<false, 128> : attn::attention_decode_kernel<false, 64>;
}
CombineFn pick_combine(int head_dim, bool unrotate) {
  if (unrotate)
    return head_dim == 128 ? attn::attention_decode_combine_kernel<128, true>
                           : attn::attention_decode_combine_kernel<64, true>;
  return head_dim == 128 ? attn::attention_decode_combine_kernel<128, false>
                         : attn::attention_decode_combine_kernel<64, false>;
}

bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

// unrotated non-null: attention_decode_int4_unrotated (unrotate_block checked here, *unrotated set on success);
// null: the plain launchers (unrotate_block ignored). pro non-null: the fused prologue (checked arguments, q unused).
cudaError_t launch(KvFormat format, const __nv_bfloat16* q, const uint8_t* kv_pool, const int32_t* block_table,
                   const int32_t* seq_lens, __nv_bfloat16* out, int batch, int n_heads, int n_kv_heads, int head_dim,
                   int max_pages, int max_seq_len, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   int unrotate_block = 0, bool* unrotated = nullptr, const fused::QkvArgs* pro = nullptr,
                   KvFormat pro_format = KvFormat::INT4, bool early_copies = false) {
  if (!pro) g_last_error.clear();
  if (unrotated) *unrotated = false;
  if (attention_decode_can_implement(format, batch, n_heads, n_kv_heads, head_dim, max_pages, max_seq_len,
                                     &g_last_error) != cudaSuccess)
    return cudaErrorInvalidValue;
  if (unrotated &&
      (unrotate_block < 0 || (unrotate_block > 1 && (!is_pow2(unrotate_block) || head_dim % unrotate_block != 0)))) {
    return reject(&g_last_error, "attention_decode: unrotate_block = " + std::to_string(unrotate_block) +
                                     ", expected 0 or 1 (no un-rotation) or a power of two dividing head_dim = " +
                                     std::to_string(head_dim));
  }
  if ((!q && !pro) || !kv_pool || !block_table || !seq_lens || !out || !aligned(q, 16) || !aligned(kv_pool, 16) ||
      !aligned(out, 2)) {
    return reject(&g_last_error,
                  "attention_decode: q, kv_pool, block_table, seq_lens and out must be non-null; q and kv_pool "
                  "16-byte aligned, out 2-byte aligned");
  }
  attn::DeviceLimits d;
  if (const cudaError_t e = device_limits(&d); e != cudaSuccess) return e;
  const bool int4 = is_int4(format);
  const attn::Plan plan = attn::choose_plan(int4, head_dim, batch, n_kv_heads, max_seq_len, d);
  if (print_heuristics()) {
    std::fprintf(stderr, "%s\n",
                 attn::describe_plan(plan, int4, head_dim, batch, n_heads, n_kv_heads, max_seq_len, d).c_str());
  }
  // The prologue instances add static shared memory (attn::PrologueSmem), which counts toward the 48 KB default.
  const int static_smem = pro ? static_cast<int>(sizeof(attn::PrologueSmem)) : 0;
  if (plan.smem_bytes + static_smem > d.smem_per_block) {
    return reject(&g_last_error, "attention_decode: the kernel needs " + std::to_string(plan.smem_bytes + static_smem) +
                                     " bytes of shared memory, the device allows " + std::to_string(d.smem_per_block));
  }
  const int64_t need = attn::workspace_bytes_for(plan, batch, n_heads, head_dim);
  if (const cudaError_t e = check_workspace("attention_decode", need, workspace, workspace_bytes, &g_last_error);
      e != cudaSuccess)
    return e;

  // The un-rotation needs the whole BF16 head: a split plan's combine (kernel or cluster) holds it in one CTA, an
  // unsplit plan's decode CTA after its cross-warp merge (INT4 only: the BF16 cache has no rotated format).
  const bool unrotate = int4 && unrotated != nullptr && unrotate_block > 1;
  const float unrotate_scale = unrotate ? formats::hadamard_scale(unrotate_block) : 1.0f;
  float* partial_o = static_cast<float*>(workspace);
  float* partial_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                                attn::workspace_lse_offset(plan, batch, n_heads, head_dim));
  const attn::DecodeArgs args{q,
                              kv_pool,
                              block_table,
                              seq_lens,
                              out,
                              plan.splits > 1 ? partial_o : nullptr,
                              plan.splits > 1 ? partial_lse : nullptr,
                              n_heads,
                              n_kv_heads,
                              n_heads / n_kv_heads,
                              max_pages,
                              plan.splits,
                              static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(head_dim))),
                              (pro != nullptr || early_copies) ? 1 : 0,
                              unrotate ? unrotate_block : 1,
                              unrotate_scale};
  // The split CTAs of one (KV head, sequence) combine inside their cluster (no combine kernel) where the knob allows
  // this many splits; the fused prologue keeps the combine kernel.
  const bool cluster = pro == nullptr && attn::combines_in_cluster(plan.splits);
  const DecodeFn kernel = pick_decode(int4, head_dim, pro, pro_format, plan.warps, cluster);
  if (plan.smem_bytes + static_smem > 48 * 1024) {
    // Per function and device; cheap enough to repeat, and it keeps multi-device use correct.
    if (const cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem_bytes);
        e != cudaSuccess)
      return e;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim =
      dim3(static_cast<unsigned>(plan.splits), static_cast<unsigned>(n_kv_heads), static_cast<unsigned>(batch));
  cfg.blockDim = dim3(static_cast<unsigned>(plan.warps * attn::kWarpSize));
  cfg.dynamicSmemBytes = static_cast<size_t>(plan.smem_bytes);
  cfg.stream = stream;
  // Under programmatic_launch() the attention kernel is a programmatic dependent of the kernel before it (it
  // waits before reading anything, see the kernel): its launch overlaps that kernel's tail.
  cudaLaunchAttribute decode_attrs[2];
  add_programmatic_attribute(&cfg, &decode_attrs[0]);
  if (cluster) {
    cudaLaunchAttribute& a = decode_attrs[cfg.numAttrs];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = static_cast<unsigned>(plan.splits);
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
    cfg.attrs = decode_attrs;
    cfg.numAttrs += 1;
    if (plan.splits > 8) {  // a non-portable cluster size (per function and device; cheap to repeat)
      if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
          e != cudaSuccess)
        return e;
    }
  }
  const fused::QkvArgs pro_args = pro ? *pro : fused::QkvArgs{};
  if (const cudaError_t e = launch_kernel_ex(&cfg, kernel, args, pro_args); e != cudaSuccess) return e;
  if (plan.splits == 1 || cluster) {
    if (unrotate) *unrotated = true;
    return cudaSuccess;
  }

  cudaLaunchAttribute attr;
  cudaLaunchConfig_t ccfg{};
  ccfg.gridDim = dim3(static_cast<unsigned>(int64_t{batch} * n_heads));
  ccfg.blockDim = dim3(static_cast<unsigned>(head_dim));
  ccfg.stream = stream;
  add_programmatic_attribute(&ccfg, &attr, /*always=*/true);
  const cudaError_t e =
      launch_kernel_ex(&ccfg, pick_combine(head_dim, unrotate), static_cast<const float*>(partial_o),
                       static_cast<const float*>(partial_lse), out, plan.splits, unrotate ? unrotate_block : 1,
                       unrotate_scale);
  if (e == cudaSuccess && unrotate) *unrotated = true;
  return e;
}

}  // namespace

cudaError_t attention_decode_can_implement(KvFormat format, int batch, int n_heads, int n_kv_heads, int head_dim,
                                           int max_pages_per_seq, int max_seq_len, std::string* why) {
  using std::to_string;
  if (format != KvFormat::BF16 && !is_int4(format))
    return reject(why, std::string("attention_decode: KV format ") + formats::kv_format_name(format) +
                           " is not supported (expected bf16, int4 or int4-hadamard)");
  if (head_dim != 64 && head_dim != 128)
    return reject(why,
                  "attention_decode: head_dim = " + to_string(head_dim) + " is not supported (expected 64 or 128)");
  if (batch < 1 || batch > kAttentionDecodeMaxGrid)
    return reject(
        why, "attention_decode: batch = " + to_string(batch) + ", expected 1.." + to_string(kAttentionDecodeMaxGrid));
  if (n_kv_heads < 1 || n_kv_heads > kAttentionDecodeMaxGrid)
    return reject(why, "attention_decode: n_kv_heads = " + to_string(n_kv_heads) + ", expected 1.." +
                           to_string(kAttentionDecodeMaxGrid));
  if (n_heads < 1 || n_heads % n_kv_heads != 0 || n_heads / n_kv_heads > kAttentionDecodeMaxGqa)
    return reject(why, "attention_decode: n_heads = " + to_string(n_heads) + " with n_kv_heads = " +
                           to_string(n_kv_heads) + ", expected a multiple of n_kv_heads with at most " +
                           to_string(kAttentionDecodeMaxGqa) + " query heads per KV head");
  if (max_pages_per_seq < 1 || max_pages_per_seq > kAttentionDecodeMaxTokens / attn::kPageTokens)
    return reject(why, "attention_decode: max_pages_per_seq = " + to_string(max_pages_per_seq) + ", expected 1.." +
                           to_string(kAttentionDecodeMaxTokens / attn::kPageTokens));
  if (max_seq_len < 1 || max_seq_len > max_pages_per_seq * attn::kPageTokens)
    return reject(why, "attention_decode: max_seq_len = " + to_string(max_seq_len) + ", expected 1.." +
                           to_string(max_pages_per_seq * attn::kPageTokens) + " (max_pages_per_seq * 64)");
  if (why) why->clear();
  return cudaSuccess;
}

size_t attention_decode_workspace_bytes(KvFormat format, int batch, int n_heads, int n_kv_heads, int head_dim,
                                        int max_pages_per_seq, int max_seq_len) {
  if (attention_decode_can_implement(format, batch, n_heads, n_kv_heads, head_dim, max_pages_per_seq, max_seq_len,
                                     nullptr) != cudaSuccess)
    return 0;
  attn::DeviceLimits d;
  if (device_limits(&d) != cudaSuccess) {
    cudaGetLastError();  // a missing device is answered with 0, not left as a sticky error
    return 0;
  }
  const attn::Plan plan = attn::choose_plan(is_int4(format), head_dim, batch, n_kv_heads, max_seq_len, d);
  return static_cast<size_t>(attn::workspace_bytes_for(plan, batch, n_heads, head_dim));
}

const char* attention_decode_last_error() { return g_last_error.c_str(); }

cudaError_t attention_decode_int4(const __nv_bfloat16* q, const uint8_t* kv_pool, const int32_t* block_table,
                                  const int32_t* seq_lens, __nv_bfloat16* out, int batch, int n_heads, int n_kv_heads,
                                  int head_dim, int max_pages_per_seq, int max_seq_len, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream, bool early_copies) {
  return launch(KvFormat::INT4, q, kv_pool, block_table, seq_lens, out, batch, n_heads, n_kv_heads, head_dim,
                max_pages_per_seq, max_seq_len, workspace, workspace_bytes, stream, 0, nullptr, nullptr, KvFormat::INT4,
                early_copies);
}

cudaError_t attention_decode_int4_unrotated(const __nv_bfloat16* q, const uint8_t* kv_pool,
                                            const int32_t* block_table, const int32_t* seq_lens, __nv_bfloat16* out,
                                            int batch, int n_heads, int n_kv_heads, int head_dim,
                                            int max_pages_per_seq, int max_seq_len, int unrotate_block,
                                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                            bool* unrotated, bool early_copies) {
  if (unrotated == nullptr) {
    g_last_error.clear();
    return reject(&g_last_error, "attention_decode_int4_unrotated: unrotated must be non-null");
  }
  return launch(KvFormat::INT4, q, kv_pool, block_table, seq_lens, out, batch, n_heads, n_kv_heads, head_dim,
                max_pages_per_seq, max_seq_len, workspace, workspace_bytes, stream, unrotate_block, unrotated, nullptr,
                KvFormat::INT4, early_copies);
}

cudaError_t attention_decode_int4_with_prologue(const AttentionDecodePrologue& p, uint8_t* kv_pool,
                                               const int32_t* block_table, const int32_t* seq_lens, __nv_bfloat16* out,
                                               int batch, int n_heads, int n_kv_heads, int head_dim,
                                               int max_pages_per_seq, int max_seq_len, int unrotate_block,
                                               void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                               bool* unrotated) {
  constexpr const char* op = "attention_decode_int4_with_prologue";
  g_last_error.clear();
  if (unrotated) *unrotated = false;
  if (unrotated == nullptr) return reject(&g_last_error, std::string(op) + ": unrotated must be non-null");
  if (!is_int4(p.format))
    return reject(&g_last_error, std::string(op) + ": KV format " + formats::kv_format_name(p.format) +
                                     " is not supported (expected int4 or int4-hadamard)");
  if (head_dim != 128)
    return reject(&g_last_error, std::string(op) + ": head_dim = " + std::to_string(head_dim) +
                                     " is not supported (expected 128)");
  if (!p.qkv || !aligned(p.qkv, 16))
    return reject(&g_last_error, std::string(op) + ": qkv must be a non-null, 16-byte aligned device pointer");
  fused::QkvArgs a{};
  if (const cudaError_t e = fused::make_qkv_args(op, /*rope=*/true, p.format, const_cast<__nv_bfloat16*>(p.qkv), batch,
                                                 n_heads, n_kv_heads, head_dim, p.positions, p.inv_freq, p.row_page,
                                                 p.row_slot, p.key_anchors, p.row_anchor, kv_pool, p.hadamard_block,
                                                 nullptr, &a, &g_last_error, /*needs_q_out=*/false);
      e != cudaSuccess)
    return e;
  return launch(KvFormat::INT4, nullptr, kv_pool, block_table, seq_lens, out, batch, n_heads, n_kv_heads, head_dim,
                max_pages_per_seq, max_seq_len, workspace, workspace_bytes, stream, unrotate_block, unrotated, &a,
                p.format);
}

cudaError_t attention_decode_bf16(const __nv_bfloat16* q, const uint8_t* kv_pool, const int32_t* block_table,
                                  const int32_t* seq_lens, __nv_bfloat16* out, int batch, int n_heads, int n_kv_heads,
                                  int head_dim, int max_pages_per_seq, int max_seq_len, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream, bool early_copies) {
  return launch(KvFormat::BF16, q, kv_pool, block_table, seq_lens, out, batch, n_heads, n_kv_heads, head_dim,
                max_pages_per_seq, max_seq_len, workspace, workspace_bytes, stream, 0, nullptr, nullptr, KvFormat::INT4,
                early_copies);
}

}  // namespace futransformer::cuda
