// Host side of the KV-cache append and key-anchor kernels: argument checks, page geometry, launch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cuda/kv_append.cuh"
#include "cuda/launch_status.h"
#include "futransformer/cuda/kv_append.h"
#include "futransformer/formats/hadamard.h"

namespace futransformer::cuda {
namespace {

using formats::KvFormat;
using std::to_string;

thread_local std::string g_last_error;

constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();
constexpr int kMaxGridY = 65535;

int head_dim_multiple(KvFormat f) {
  return f == KvFormat::BF16 ? 8 : f == KvFormat::FP8 ? 16 : static_cast<int>(formats::kKvInt4Group);
}

// The `part` slice [offset, offset + n_kv_heads * head_dim) must lie inside a row; n_kv_heads and head_dim are
// already checked positive.
cudaError_t check_slice(const char* op, const char* name, int offset, int n_kv_heads, int head_dim, int row_stride,
                        std::string* why) {
  const int64_t end = static_cast<int64_t>(offset) + static_cast<int64_t>(n_kv_heads) * head_dim;
  if (offset < 0 || end > row_stride)
    return reject(why, std::string(op) + ": " + name + " = " + to_string(offset) + " with n_kv_heads * head_dim = " +
                           to_string(static_cast<int64_t>(n_kv_heads) * head_dim) +
                           ", expected a slice inside a row of row_stride = " + to_string(row_stride) + " elements");
  return cudaSuccess;
}

template <KvFormat F>
cudaError_t launch_append(const kv::AppendArgs& args, int64_t blocks, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kv::kAppendWarps * kv::kWarp);
  cfg.stream = stream;
  return launch_kernel_ex(&cfg, kv::kv_append_kernel<F>, args);
}

}  // namespace

cudaError_t kv_append_can_implement(KvFormat format, int rows, int n_kv_heads, int head_dim, int row_stride,
                                    int k_offset, int v_offset, std::string* why) {
  if (format > KvFormat::INT4_HADAMARD)
    return reject(why, "kv_append: unknown KV format " + to_string(static_cast<int>(format)) +
                           " (expected bf16, fp8, int4 or int4-hadamard)");
  const int multiple = head_dim_multiple(format);
  if (head_dim < multiple || head_dim > kKvAppendMaxHeadDim || head_dim % multiple != 0)
    return reject(why, std::string("kv_append: head_dim = ") + to_string(head_dim) + " is not supported for " +
                           formats::kv_format_name(format) + " (expected a positive multiple of " +
                           to_string(multiple) + ", at most " + to_string(kKvAppendMaxHeadDim) + ")");
  if (n_kv_heads < 1)
    return reject(why, "kv_append: n_kv_heads = " + to_string(n_kv_heads) + ", expected at least 1");
  if (rows < 0) return reject(why, "kv_append: rows = " + to_string(rows) + ", expected 0 or more");
  // One warp per (row, KV head, part), kAppendWarps per CTA, on a 1-D grid.
  const int64_t warps = static_cast<int64_t>(rows) * n_kv_heads * 2;
  if ((warps + kv::kAppendWarps - 1) / kv::kAppendWarps > kMaxGridX)
    return reject(why, "kv_append: rows * n_kv_heads = " + to_string(static_cast<int64_t>(rows) * n_kv_heads) +
                           " is too large (expected at most " + to_string(kMaxGridX * kv::kAppendWarps / 2) + ")");
  if (const cudaError_t e = check_slice("kv_append", "k_offset", k_offset, n_kv_heads, head_dim, row_stride, why);
      e != cudaSuccess)
    return e;
  if (const cudaError_t e = check_slice("kv_append", "v_offset", v_offset, n_kv_heads, head_dim, row_stride, why);
      e != cudaSuccess)
    return e;
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t kv_append(KvFormat format, const __nv_bfloat16* qkv, int row_stride, int k_offset, int v_offset, int rows,
                      int n_kv_heads, int head_dim, const int32_t* row_page, const int32_t* row_slot,
                      const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool, cudaStream_t stream) {
  g_last_error.clear();
  if (kv_append_can_implement(format, rows, n_kv_heads, head_dim, row_stride, k_offset, v_offset, &g_last_error) !=
      cudaSuccess)
    return cudaErrorInvalidValue;
  if (!qkv || !row_page || !row_slot || !kv_pool || !aligned(qkv, 2) || !aligned(row_page, 4) ||
      !aligned(row_slot, 4) || !aligned(kv_pool, 16))
    return reject(&g_last_error,
                  "kv_append: qkv, row_page, row_slot and kv_pool must be non-null; qkv 2-byte aligned, row_page and "
                  "row_slot 4-byte aligned, kv_pool 16-byte aligned");
  const bool hadamard = format == KvFormat::INT4_HADAMARD;
  if (hadamard && (!key_anchors || !row_anchor || !aligned(key_anchors, 2) || !aligned(row_anchor, 4)))
    return reject(&g_last_error,
                  "kv_append: int4-hadamard needs key_anchors (non-null, 2-byte aligned) and row_anchor (non-null, "
                  "4-byte aligned)");
  if (rows == 0) return cudaSuccess;

  kv::AppendArgs args{};
  args.qkv = qkv;
  args.row_stride = row_stride;
  args.part_offset[0] = k_offset;
  args.part_offset[1] = v_offset;
  args.rows = rows;
  args.n_kv_heads = n_kv_heads;
  args.head_dim = head_dim;
  args.row_page = row_page;
  args.row_slot = row_slot;
  args.key_anchors = hadamard ? key_anchors : nullptr;
  args.row_anchor = hadamard ? row_anchor : nullptr;
  args.pool = kv_pool;
  args.geo = kv::page_geometry(format, head_dim);
  if (hadamard) {
    // The host's own function supplies the constant, so the device multiplies by exactly the CPU's value.
    args.hadamard_block = static_cast<int32_t>(formats::kv_hadamard_block(format, head_dim));
    args.hadamard_scale = formats::hadamard_scale(args.hadamard_block);
  }
  const int64_t blocks = (static_cast<int64_t>(rows) * n_kv_heads * 2 + kv::kAppendWarps - 1) / kv::kAppendWarps;
  switch (format) {
    case KvFormat::BF16: return launch_append<KvFormat::BF16>(args, blocks, stream);
    case KvFormat::FP8: return launch_append<KvFormat::FP8>(args, blocks, stream);
    case KvFormat::INT4: return launch_append<KvFormat::INT4>(args, blocks, stream);
    case KvFormat::INT4_HADAMARD: return launch_append<KvFormat::INT4_HADAMARD>(args, blocks, stream);
  }
  return reject(&g_last_error, "kv_append: unknown KV format");  // unreachable: checked above
}

cudaError_t kv_key_anchor_compute_can_implement(int n_kv_heads, int head_dim, int n_seqs, int row_stride, int k_offset,
                                                std::string* why) {
  const int multiple = static_cast<int>(formats::kKvInt4Group);
  if (head_dim < multiple || head_dim > kKvAppendMaxHeadDim || head_dim % multiple != 0)
    return reject(why, "kv_key_anchor_compute: head_dim = " + to_string(head_dim) +
                           " is not supported (expected a positive multiple of " + to_string(multiple) +
                           ", at most " + to_string(kKvAppendMaxHeadDim) + ")");
  if (n_kv_heads < 1 || n_kv_heads > kMaxGridY / kv::kAnchorCluster)
    return reject(why, "kv_key_anchor_compute: n_kv_heads = " + to_string(n_kv_heads) + ", expected 1.." +
                           to_string(kMaxGridY / kv::kAnchorCluster));
  if (n_seqs < 0 || n_seqs > kMaxGridY)
    return reject(why,
                  "kv_key_anchor_compute: n_seqs = " + to_string(n_seqs) + ", expected 0.." + to_string(kMaxGridY));
  if (const cudaError_t e =
          check_slice("kv_key_anchor_compute", "k_offset", k_offset, n_kv_heads, head_dim, row_stride, why);
      e != cudaSuccess)
    return e;
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t kv_key_anchor_compute(const __nv_bfloat16* qkv, int row_stride, int k_offset, int n_kv_heads, int head_dim,
                                  int n_seqs, const int32_t* first_row, const int32_t* row_count,
                                  const int32_t* anchor_index, uint16_t* key_anchors, cudaStream_t stream) {
  g_last_error.clear();
  if (kv_key_anchor_compute_can_implement(n_kv_heads, head_dim, n_seqs, row_stride, k_offset, &g_last_error) !=
      cudaSuccess)
    return cudaErrorInvalidValue;
  if (!qkv || !first_row || !row_count || !anchor_index || !key_anchors || !aligned(qkv, 2) ||
      !aligned(first_row, 4) || !aligned(row_count, 4) || !aligned(anchor_index, 4) || !aligned(key_anchors, 2))
    return reject(&g_last_error,
                  "kv_key_anchor_compute: qkv, first_row, row_count, anchor_index and key_anchors must be non-null; "
                  "qkv and key_anchors 2-byte aligned, the int32 arrays 4-byte aligned");
  if (n_seqs == 0) return cudaSuccess;

  kv::AnchorArgs args{};
  args.qkv = qkv;
  args.row_stride = row_stride;
  args.k_offset = k_offset;
  args.n_kv_heads = n_kv_heads;
  args.head_dim = head_dim;
  args.first_row = first_row;
  args.row_count = row_count;
  args.anchor_index = anchor_index;
  args.key_anchors = key_anchors;
  args.hadamard_block = static_cast<int32_t>(formats::kv_hadamard_block(KvFormat::INT4_HADAMARD, head_dim));
  args.hadamard_scale = formats::hadamard_scale(args.hadamard_block);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(n_kv_heads * kv::kAnchorCluster), static_cast<unsigned>(n_seqs));
  cfg.blockDim = dim3(kv::kAnchorThreads);
  cfg.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kv::kAnchorCluster;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cfg.attrs = &cluster;
  cfg.numAttrs = 1;
  // Two channels per 4-byte load need every key row 4-byte aligned: the pointer, the row stride and the offset
  // (a CTA's first channel, a multiple of head_dim / 8 — itself a multiple of 4 — is even).
  const bool pairs = reinterpret_cast<uintptr_t>(qkv) % 4 == 0 && row_stride % 2 == 0 && k_offset % 2 == 0;
  return pairs ? launch_kernel_ex(&cfg, kv::kv_key_anchor_kernel<2>, args)
               : launch_kernel_ex(&cfg, kv::kv_key_anchor_kernel<1>, args);
}

const char* kv_append_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
