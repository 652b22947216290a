// Host side of the generic paged decode attention: shape and pointer checks, the page layout from
// formats::kv_page_layout (the one definition of the page bytes), the split choice and the cluster launch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "cuda/attention_generic.cuh"
#include "cuda/launch_status.h"
#include "futransformer/cuda/attention_generic.h"

namespace futransformer::cuda {
namespace {

using formats::KvFormat;

thread_local std::string g_last_error;

bool is_int4(KvFormat f) { return f == KvFormat::INT4 || f == KvFormat::INT4_HADAMARD; }

}  // namespace

cudaError_t attention_generic_can_implement(KvFormat format, int batch, int n_heads, int n_kv_heads, int head_dim,
                                            int max_pages_per_seq, std::string* why) {
  using std::to_string;
  if (format != KvFormat::BF16 && !is_int4(format))
    return reject(why, std::string("attention_generic: KV format ") + formats::kv_format_name(format) +
                           " is not supported (expected bf16, int4 or int4-hadamard)");
  // A key or value row must be a whole number of 16-byte chunks: 8 BF16 channels, or 32 INT4 channels (one
  // scale group).
  const int multiple = is_int4(format) ? static_cast<int>(formats::kKvInt4Group) : 8;
  if (head_dim < multiple || head_dim > kAttentionGenericMaxHeadDim || head_dim % multiple != 0)
    return reject(why, "attention_generic: head_dim = " + to_string(head_dim) + " is not supported for " +
                           formats::kv_format_name(format) + " (expected a multiple of " + to_string(multiple) + ", " +
                           to_string(multiple) + ".." + to_string(kAttentionGenericMaxHeadDim) + ")");
  if (batch < 1 || batch > kAttentionGenericMaxGrid)
    return reject(
        why, "attention_generic: batch = " + to_string(batch) + ", expected 1.." + to_string(kAttentionGenericMaxGrid));
  if (n_kv_heads < 1)
    return reject(why, "attention_generic: n_kv_heads = " + to_string(n_kv_heads) + ", expected at least 1");
  if (n_heads < 1 || n_heads > kAttentionGenericMaxGrid || n_heads % n_kv_heads != 0)
    return reject(why, "attention_generic: n_heads = " + to_string(n_heads) +
                           " with n_kv_heads = " + to_string(n_kv_heads) +
                           ", expected a multiple of n_kv_heads in 1.." + to_string(kAttentionGenericMaxGrid));
  const int max_pages = kAttentionGenericMaxTokens / attn_generic::kPageTokens;
  if (max_pages_per_seq < 1 || max_pages_per_seq > max_pages)
    return reject(why, "attention_generic: max_pages_per_seq = " + to_string(max_pages_per_seq) + ", expected 1.." +
                           to_string(max_pages));
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t attention_decode_generic(KvFormat format, const __nv_bfloat16* q, const uint8_t* kv_pool,
                                     const int32_t* block_table, const int32_t* seq_lens, __nv_bfloat16* out, int batch,
                                     int n_heads, int n_kv_heads, int head_dim, int max_pages_per_seq,
                                     cudaStream_t stream) {
  g_last_error.clear();
  if (attention_generic_can_implement(format, batch, n_heads, n_kv_heads, head_dim, max_pages_per_seq, &g_last_error) !=
      cudaSuccess)
    return cudaErrorInvalidValue;
  // kv_pool: 16-byte (uint4) code loads; q, out: BF16 elements; block_table, seq_lens: int32 elements.
  if (!q || !kv_pool || !block_table || !seq_lens || !out || !aligned(kv_pool, 16) || !aligned(q, 2) ||
      !aligned(out, 2) || !aligned(block_table, 4) || !aligned(seq_lens, 4)) {
    return reject(&g_last_error,
                  "attention_generic: q, kv_pool, block_table, seq_lens and out must be non-null; kv_pool 16-byte "
                  "aligned, q and out 2-byte aligned, block_table and seq_lens 4-byte aligned");
  }
  const formats::KvPageLayout L = formats::kv_page_layout(format, head_dim);  // accepted by the checks above
  attn_generic::GenericArgs args{};
  args.q = q;
  args.pool = kv_pool;
  args.block_table = block_table;
  args.seq_lens = seq_lens;
  args.out = out;
  args.n_heads = n_heads;
  args.n_kv_heads = n_kv_heads;
  args.gqa = n_heads / n_kv_heads;
  args.head_dim = head_dim;
  args.max_pages = max_pages_per_seq;
  args.page_bytes = L.page_bytes;
  args.geo.row_bytes = static_cast<int>(L.code_row_bytes);
  args.geo.groups_per_token = static_cast<int>(L.groups);
  for (int p = 0; p < 2; ++p) {  // page_bytes <= 128 KiB (BF16, head_dim 512): every offset fits an int
    args.geo.codes[p] = static_cast<int>(L.codes[p]);
    args.geo.scales[p] = static_cast<int>(L.scales[p]);
    args.geo.zeros[p] = static_cast<int>(L.zeros[p]);
  }
  args.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));

  const int splits = attn_generic::splits_for(batch, n_heads, max_pages_per_seq);
  if (print_heuristics()) {
    std::fprintf(stderr, "attention_generic: %s head_dim %d, batch %d, heads %d/%d, max_pages %d: %d split(s)\n",
                 formats::kv_format_name(format), head_dim, batch, n_heads, n_kv_heads, max_pages_per_seq, splits);
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(splits), static_cast<unsigned>(n_heads), static_cast<unsigned>(batch));
  cfg.blockDim = dim3(attn_generic::kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (is_int4(format)) return cudaLaunchKernelEx(&cfg, attn_generic::attention_generic_kernel<true>, args);
  return cudaLaunchKernelEx(&cfg, attn_generic::attention_generic_kernel<false>, args);
}

const char* attention_generic_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
