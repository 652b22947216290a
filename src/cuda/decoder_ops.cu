// Host side of the small decoder ops: argument checks, the vector/scalar instance choice and the launch
// configuration. Kernels: src/cuda/decoder_ops.cuh. Nothing here queries the device or allocates, so every launcher
// can be captured in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/decoder_ops.cuh"
#include "cuda/launch_status.h"
#include "futransformer/cuda/decoder_ops.h"

namespace futransformer::cuda {
namespace {

using std::to_string;

thread_local std::string g_last_error;

static_assert(kRopeMaxHeadDim / 2 == ops::kRopeMaxHalf, "the rope kernel's cos/sin table holds head_dim / 2 pairs");

// A grid-stride kernel needs no more CTAs than this to fill the GPU several times over.
constexpr int64_t kMaxStrideBlocks = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

cudaError_t check_range(const char* op, const char* name, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return cudaSuccess;
  return reject(&g_last_error, std::string(op) + ": " + name + " = " + to_string(v) + ", expected " + to_string(lo) +
                                   ".." + to_string(hi));
}

cudaError_t check_rows(const char* op, int rows) { return check_range(op, "rows", rows, 1, kDecoderOpsMaxRows); }

cudaError_t check_width(const char* op, const char* name, int v) {
  return check_range(op, name, v, 1, kDecoderOpsMaxWidth);
}

cudaError_t null_pointer(const char* op, const char* names) {
  return reject(&g_last_error, std::string(op) + ": " + names + " must be non-null device pointers");
}

}  // namespace

cudaError_t embed_rows_bf16(const __nv_bfloat16* table, const int32_t* tokens, float* x, int rows, int hidden,
                            int vocab, cudaStream_t stream) {
  constexpr const char* op = "embed_rows_bf16";
  g_last_error.clear();
  if (!table || !tokens || !x) return null_pointer(op, "table, tokens and x");
  if (check_rows(op, rows) || check_width(op, "hidden", hidden) || check_width(op, "vocab", vocab))
    return cudaErrorInvalidValue;
  const bool vec = hidden % ops::kVecElems == 0 && aligned(table, 16) && aligned(x, 16);
  const int64_t per_block = int64_t{ops::kEltThreads} * (vec ? ops::kVecElems : 1);
  const dim3 grid(static_cast<unsigned>(ceil_div(hidden, per_block)), static_cast<unsigned>(rows));
  return launch_maybe_programmatic(vec ? ops::embed_rows_kernel<true> : ops::embed_rows_kernel<false>, grid,
                                   dim3(ops::kEltThreads), stream, table, tokens, x, hidden, vocab);
}

cudaError_t rmsnorm_bf16(const float* x, const float* weight, __nv_bfloat16* y, int rows, int hidden, float eps,
                         cudaStream_t stream) {
  constexpr const char* op = "rmsnorm_bf16";
  g_last_error.clear();
  if (!x || !weight || !y) return null_pointer(op, "x, weight and y");
  if (check_rows(op, rows) || check_width(op, "hidden", hidden)) return cudaErrorInvalidValue;
  if (!std::isfinite(eps) || eps < 0.0f)
    return reject(&g_last_error, std::string(op) + ": eps = " + to_string(eps) + ", expected a finite value >= 0");
  const bool vec = ops::rmsnorm_vec(x, weight, y, hidden);
  const int threads = ops::rmsnorm_threads(hidden, vec);
  return launch_maybe_programmatic(vec ? ops::rmsnorm_kernel<true> : ops::rmsnorm_kernel<false>,
                                   dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(threads)), stream, x,
                                   weight, y, hidden, eps);
}

cudaError_t add_residual_bf16(float* x, const __nv_bfloat16* delta, int rows, int hidden, cudaStream_t stream) {
  constexpr const char* op = "add_residual_bf16";
  g_last_error.clear();
  if (!x || !delta) return null_pointer(op, "x and delta");
  if (check_rows(op, rows) || check_width(op, "hidden", hidden)) return cudaErrorInvalidValue;
  const int64_t n = int64_t{rows} * hidden;
  const bool vec = aligned(x, 16) && aligned(delta, 16);
  const int64_t work = vec ? ceil_div(n, ops::kVecElems) : n;
  const int64_t blocks = std::min(kMaxStrideBlocks, ceil_div(work, ops::kEltThreads));
  return launch_maybe_programmatic(vec ? ops::add_residual_kernel<true> : ops::add_residual_kernel<false>,
                dim3(static_cast<unsigned>(blocks)), dim3(ops::kEltThreads), stream, x, delta, n);
}

cudaError_t swiglu_bf16(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int rows, int inter, cudaStream_t stream) {
  constexpr const char* op = "swiglu_bf16";
  g_last_error.clear();
  if (!gate_up || !out) return null_pointer(op, "gate_up and out");
  if (check_rows(op, rows) || check_width(op, "inter", inter)) return cudaErrorInvalidValue;
  // A CTA may write its outputs before another has read the inputs they overwrite: refuse any overlap.
  const auto in_begin = reinterpret_cast<uintptr_t>(gate_up);
  const auto in_end = in_begin + static_cast<uintptr_t>(int64_t{rows} * 2 * inter) * sizeof(uint16_t);
  const auto out_begin = reinterpret_cast<uintptr_t>(out);
  const auto out_end = out_begin + static_cast<uintptr_t>(int64_t{rows} * inter) * sizeof(uint16_t);
  if (out_begin < in_end && in_begin < out_end)
    return reject(&g_last_error, std::string(op) + ": out overlaps gate_up; expected separate buffers");
  const bool vec = inter % ops::kVecElems == 0 && aligned(gate_up, 16) && aligned(out, 16);
  const int64_t per_block = int64_t{ops::kEltThreads} * (vec ? ops::kVecElems : 1);
  const dim3 grid(static_cast<unsigned>(ceil_div(inter, per_block)), static_cast<unsigned>(rows));
  return launch_maybe_programmatic(vec ? ops::swiglu_kernel<true> : ops::swiglu_kernel<false>, grid,
                                   dim3(ops::kEltThreads), stream, gate_up, out, inter);
}

cudaError_t rope_qk_bf16(__nv_bfloat16* qkv, const int32_t* positions, const float* inv_freq, int rows, int n_heads,
                         int n_kv_heads, int head_dim, cudaStream_t stream) {
  constexpr const char* op = "rope_qk_bf16";
  g_last_error.clear();
  if (!qkv || !positions || !inv_freq) return null_pointer(op, "qkv, positions and inv_freq");
  if (check_rows(op, rows) || check_range(op, "n_heads", n_heads, 1, kDecoderOpsMaxRows) ||
      check_range(op, "n_kv_heads", n_kv_heads, 1, kDecoderOpsMaxRows))
    return cudaErrorInvalidValue;
  if (head_dim < 2 || head_dim > kRopeMaxHeadDim || head_dim % 2 != 0)
    return reject(&g_last_error, std::string(op) + ": head_dim = " + to_string(head_dim) +
                                     ", expected an even value in 2.." + to_string(kRopeMaxHeadDim));
  const int rot_heads = n_heads + n_kv_heads;  // q heads then k heads, contiguous at the start of the row
  const int row_width = (n_heads + 2 * n_kv_heads) * head_dim;
  // 16-byte pair groups when every head's halves start on a 16-byte boundary (row_width is a multiple of head_dim).
  if (head_dim % (2 * ops::kVecElems) == 0 && aligned(qkv, 16)) {
    const int64_t units = int64_t{rot_heads} * (head_dim / 2 / ops::kVecElems);
    const dim3 grid(static_cast<unsigned>(ceil_div(units, ops::kRopeThreads)), static_cast<unsigned>(rows));
    return launch_maybe_programmatic(ops::rope_qk_vec_kernel, grid, dim3(ops::kRopeThreads), stream, qkv, positions,
                                     inv_freq, rot_heads, row_width, head_dim);
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(rot_heads, ops::kRopeHeadsPerCta)), static_cast<unsigned>(rows));
  return launch_maybe_programmatic(ops::rope_qk_kernel, grid, dim3(ops::kRopeThreads), stream, qkv, positions, inv_freq,
                                   rot_heads, row_width, head_dim);
}

cudaError_t rope_cos_sin_table(const int32_t* positions, const float* inv_freq, int rows, int head_dim, float* out,
                               cudaStream_t stream) {
  constexpr const char* op = "rope_cos_sin_table";
  g_last_error.clear();
  if (!positions || !inv_freq || !out) return null_pointer(op, "positions, inv_freq and out");
  if (check_rows(op, rows)) return cudaErrorInvalidValue;
  if (head_dim < 2 || head_dim > kRopeMaxHeadDim || head_dim % 2 != 0)
    return reject(&g_last_error, std::string(op) + ": head_dim = " + to_string(head_dim) +
                                     ", expected an even value in 2.." + to_string(kRopeMaxHeadDim));
  if (!aligned(out, 8)) return reject(&g_last_error, std::string(op) + ": out must be 8-byte aligned");
  const int half = head_dim / 2;
  const dim3 grid(static_cast<unsigned>(ceil_div(int64_t{rows} * half, ops::kRopeThreads)));
  return launch_maybe_programmatic(ops::rope_table_kernel, grid, dim3(ops::kRopeThreads), stream, positions, inv_freq,
                                   rows, half, reinterpret_cast<float2*>(out));
}

namespace {
// FT_ARGMAX_CLUSTER, for A/B runs: 0 or 1 — one CTA per row at every vocabulary size (the kernel before the cluster
// split); 2, 4 or 8 — clusters of that many CTAs from kArgmaxClusterMinVocab entries on. Unset or anything else: the
// library's rule (argmax_cluster_size). Read once per process.
int argmax_forced_cluster() {
  static const int forced = [] {
    const char* v = std::getenv("FT_ARGMAX_CLUSTER");
    if (v == nullptr || v[0] == '\0' || v[1] != '\0') return -1;
    switch (v[0]) {
      case '0':
      case '1': return 1;
      case '2': return 2;
      case '4': return 4;
      case '8': return 8;
      default: return -1;
    }
  }();
  return forced;
}

// One argmax launch over `rows` rows: grid (kCl, rows), a cluster of kCl CTAs along x when kCl > 1.
template <typename... Args>
cudaError_t launch_argmax(void (*kernel)(Args...), int cl, int rows, cudaStream_t stream,
                          std::type_identity_t<Args>... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(cl), static_cast<unsigned>(rows));
  cfg.blockDim = dim3(ops::kArgmaxThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  add_programmatic_attribute(&cfg, &attrs[0]);
  if (cl > 1) {  // 2, 4 or 8: portable sizes, every sm_90 device places them
    cudaLaunchAttribute& c = attrs[cfg.numAttrs];
    c.id = cudaLaunchAttributeClusterDimension;
    c.val.clusterDim.x = static_cast<unsigned>(cl);
    c.val.clusterDim.y = 1;
    c.val.clusterDim.z = 1;
    cfg.attrs = attrs;
    cfg.numAttrs += 1;
  }
  return launch_kernel_ex(&cfg, kernel, args...);
}

// CTAs per row: kArgmaxCluster from kArgmaxClusterMinVocab entries on, else one (or FT_ARGMAX_CLUSTER's size).
int argmax_cluster_size(int vocab) {
  if (vocab < ops::kArgmaxClusterMinVocab) return 1;
  const int forced = argmax_forced_cluster();
  return forced > 0 ? forced : ops::kArgmaxCluster;
}

// f(std::integral_constant<int, kCl>{}) for the run-time cluster size cl (1, 2, 4 or 8): the kernel instance's kCl.
template <class F>
cudaError_t with_cluster_size(int cl, F&& f) {
  switch (cl) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}
}  // namespace

cudaError_t argmax_rows_f32(const float* logits, int32_t* out, int rows, int vocab, cudaStream_t stream) {
  constexpr const char* op = "argmax_rows_f32";
  g_last_error.clear();
  if (!logits || !out) return null_pointer(op, "logits and out");
  if (check_rows(op, rows) || check_width(op, "vocab", vocab)) return cudaErrorInvalidValue;
  const bool vec = vocab % 4 == 0 && aligned(logits, 16);
  return with_cluster_size(argmax_cluster_size(vocab), [&](auto cl) {
    constexpr int kCl = decltype(cl)::value;
    return launch_argmax(vec ? ops::argmax_rows_kernel<true, kCl> : ops::argmax_rows_kernel<false, kCl>, kCl, rows,
                         stream, logits, out, vocab);
  });
}

cudaError_t widen_argmax_rows_bf16(const __nv_bfloat16* logits, int row_stride, float* widened, int32_t* out, int rows,
                                   int vocab, cudaStream_t stream) {
  constexpr const char* op = "widen_argmax_rows_bf16";
  g_last_error.clear();
  if (!logits || !widened || !out) return null_pointer(op, "logits, widened and out");
  if (check_rows(op, rows) || check_width(op, "vocab", vocab)) return cudaErrorInvalidValue;
  if (row_stride < vocab)
    return reject(&g_last_error, std::string(op) + ": row_stride = " + to_string(row_stride) +
                                     ", expected at least vocab = " + to_string(vocab));
  const bool vec = vocab % 8 == 0 && row_stride % 8 == 0 && aligned(logits, 16) && aligned(widened, 16);
  return with_cluster_size(argmax_cluster_size(vocab), [&](auto cl) {
    constexpr int kCl = decltype(cl)::value;
    return launch_argmax(vec ? ops::widen_argmax_rows_kernel<true, kCl> : ops::widen_argmax_rows_kernel<false, kCl>,
                         kCl, rows, stream, logits, row_stride, widened, out, vocab);
  });
}

const char* decoder_ops_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
