// Host side of the fused decoder ops: argument checks, instance choice, launch. Kernels: src/cuda/fused_ops.cuh.
// Nothing here queries the device or allocates, so every launcher can be captured in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/fused_ops.cuh"
#include "cuda/fused_ops_internal.h"
#include "cuda/launch_status.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fused_ops.h"
#include "futransformer/cuda/kv_append.h"
#include "futransformer/formats/hadamard.h"

namespace futransformer::cuda {
namespace {

using formats::KvFormat;
using std::to_string;

thread_local std::string g_last_error;

constexpr int kMaxGridY = 65535;

cudaError_t check_range(const char* op, const char* name, int64_t v, int64_t lo, int64_t hi, std::string* why) {
  if (v >= lo && v <= hi) return cudaSuccess;
  return reject(why, std::string(op) + ": " + name + " = " + to_string(v) + ", expected " + to_string(lo) + ".." +
                         to_string(hi));
}

// [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(b_bytes) && b0 < a0 + static_cast<uintptr_t>(a_bytes);
}

int head_dim_multiple(KvFormat f) {
  return f == KvFormat::BF16 ? 8 : f == KvFormat::FP8 ? 16 : static_cast<int>(formats::kKvInt4Group);
}

bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

template <KvFormat F>
auto qkv_kernel(bool rope) {
  return rope ? fused::qkv_rope_kv_append_kernel<F, true> : fused::qkv_rope_kv_append_kernel<F, false>;
}

QuadAppend g_quad_mode = QuadAppend::kDefault;

bool quad_enabled() {
  if (g_quad_mode != QuadAppend::kDefault) return g_quad_mode != QuadAppend::kOff;
  static const bool env = [] {
    const char* e = std::getenv("FT_QKV_QUAD");
    return e == nullptr || e[0] != '0';  // on unless FT_QKV_QUAD=0
  }();
  return env;
}

// The quad kernel's shape: INT4 caches at head_dim 128 (its 32 channels per lane), 16-byte loads and stores, rows
// of at least kQuadMinItems head items (a CTA's RoPE tables).
bool quad_applies(KvFormat format, int head_dim, int items, const void* qkv, const void* q_out) {
  return (format == KvFormat::INT4 || format == KvFormat::INT4_HADAMARD) && head_dim == fused::kQuadHeadDim &&
         items >= fused::kQuadMinItems && aligned(qkv, 16) && aligned(q_out, 16);
}

template <KvFormat F, int kL>
auto quad_kernel(bool rope) {
  return rope ? fused::kv_append_rotate_q_quad_kernel<F, true, false, kL>
              : fused::kv_append_rotate_q_quad_kernel<F, false, false, kL>;
}

// Lanes per head item of the quad-family kernel for a pass of `rows` rows: 8 (octets) up to octet_max_rows(), else
// 4. Decode steps wait for each lane's chain of dependent operations (RoPE, Hadamard, INT4 encode), which an octet
// halves; at prefill sizes its smaller register footprint keeps more loads in flight. FT_QKV_OCTET_MAX_ROWS
// overrides the threshold (0: always quads).
int octet_max_rows() {
  static const int v = [] {
    const char* e = std::getenv("FT_QKV_OCTET_MAX_ROWS");
    return e != nullptr ? std::atoi(e) : fused::kOctetMaxRows;
  }();
  return v;
}

// Shared by qkv_rope_kv_append (rope) and kv_append_rotate_q (!rope): checks, then the launch.
cudaError_t qkv_append(const char* op, bool rope, KvFormat format, __nv_bfloat16* qkv, int rows, int n_heads,
                       int n_kv_heads, int head_dim, const int32_t* positions, const float* inv_freq,
                       const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors,
                       const int32_t* row_anchor, uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out,
                       cudaStream_t stream) {
  g_last_error.clear();
  fused::QkvArgs a{};
  if (const cudaError_t e = fused::make_qkv_args(op, rope, format, qkv, rows, n_heads, n_kv_heads, head_dim, positions,
                                                 inv_freq, row_page, row_slot, key_anchors, row_anchor, kv_pool,
                                                 hadamard_block, q_out, &a, &g_last_error);
      e != cudaSuccess)
    return e;
  const int items = n_heads + 2 * n_kv_heads;
  if (quad_enabled() && quad_applies(format, head_dim, items, qkv, q_out)) {
    // make_qkv_args checked the blocks: q's a power of two dividing head_dim (or none), kv's the format's (128).
    const bool octet = g_quad_mode == QuadAppend::kOctet ||
                       (g_quad_mode == QuadAppend::kDefault && rows <= octet_max_rows());
    const int per_cta = octet ? fused::HeadLanes<8>::kItemsPerCta : fused::HeadLanes<4>::kItemsPerCta;
    const int64_t groups = static_cast<int64_t>(rows) * items;
    const dim3 grid(static_cast<unsigned>((groups + per_cta - 1) / per_cta));
    const dim3 block(fused::kQuadThreads);
    if (octet)
      return format == KvFormat::INT4
                 ? launch_maybe_programmatic(quad_kernel<KvFormat::INT4, 8>(rope), grid, block, stream, a, rows)
                 : launch_maybe_programmatic(quad_kernel<KvFormat::INT4_HADAMARD, 8>(rope), grid, block, stream, a,
                                             rows);
    return format == KvFormat::INT4
               ? launch_maybe_programmatic(quad_kernel<KvFormat::INT4, 4>(rope), grid, block, stream, a, rows)
               : launch_maybe_programmatic(quad_kernel<KvFormat::INT4_HADAMARD, 4>(rope), grid, block, stream, a,
                                           rows);
  }
  return fused::launch_qkv_kernel(a, format, rows, rope, stream);
}

}  // namespace

void set_kv_append_rotate_q_quad(QuadAppend mode) { g_quad_mode = mode; }

bool qkv_append_uses_quad(KvFormat format, int n_heads, int n_kv_heads, int head_dim, const void* qkv,
                          const void* q_out) {
  return quad_enabled() && quad_applies(format, head_dim, n_heads + 2 * n_kv_heads, qkv, q_out);
}

namespace fused {

cudaError_t make_qkv_args(const char* op, bool rope, KvFormat format, __nv_bfloat16* qkv, int rows, int n_heads,
                          int n_kv_heads, int head_dim, const int32_t* positions, const float* inv_freq,
                          const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors,
                          const int32_t* row_anchor, uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out,
                          QkvArgs* args, std::string* why, bool needs_q_out) {
  std::string shape_why;
  if (qkv_rope_kv_append_can_implement(format, rows, n_heads, n_kv_heads, head_dim, hadamard_block, &shape_why) !=
      cudaSuccess)
    return reject(why, std::string(op) + shape_why.substr(shape_why.find(':')));
  if (!qkv || !row_page || !row_slot || !kv_pool || (needs_q_out && !q_out) || !aligned(qkv, 2) || !aligned(q_out, 2) ||
      !aligned(row_page, 4) || !aligned(row_slot, 4) || !aligned(kv_pool, 16))
    return reject(why, std::string(op) +
                           ": qkv, row_page, row_slot, kv_pool and q_out must be non-null; qkv and q_out "
                           "2-byte aligned, row_page and row_slot 4-byte aligned, kv_pool 16-byte aligned");
  if (rope && (!positions || !inv_freq || !aligned(positions, 4) || !aligned(inv_freq, 4)))
    return reject(why, std::string(op) + ": positions and inv_freq must be non-null and 4-byte aligned");
  const bool hadamard = format == KvFormat::INT4_HADAMARD;
  if (hadamard && (!key_anchors || !row_anchor || !aligned(key_anchors, 2) || !aligned(row_anchor, 4)))
    return reject(why, std::string(op) +
                           ": int4-hadamard needs key_anchors (non-null, 2-byte aligned) and row_anchor "
                           "(non-null, 4-byte aligned)");
  const int items = n_heads + 2 * n_kv_heads;
  const int row_width = items * head_dim;  // <= 3 * 65535 * 256: fits int32
  // Warps write q_out while others still read qkv: the buffers must be distinct.
  if (q_out && overlap(qkv, int64_t{rows} * row_width * 2, q_out, int64_t{rows} * n_heads * head_dim * 2))
    return reject(why, std::string(op) + ": q_out overlaps qkv; expected separate buffers");

  QkvArgs a{};
  a.qkv = qkv;
  a.row_width = row_width;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.positions = rope ? positions : nullptr;
  a.inv_freq = rope ? inv_freq : nullptr;
  a.row_page = row_page;
  a.row_slot = row_slot;
  a.key_anchors = hadamard ? key_anchors : nullptr;
  a.row_anchor = hadamard ? row_anchor : nullptr;
  a.pool = kv_pool;
  a.geo = kv::page_geometry(format, head_dim);
  if (hadamard) {
    // The host's own function supplies the constant, so the device multiplies by exactly the CPU's value.
    a.kv_hadamard_block = static_cast<int32_t>(formats::kv_hadamard_block(format, head_dim));
    a.kv_hadamard_scale = formats::hadamard_scale(a.kv_hadamard_block);
  }
  // rotate_heads_bf16's scale is static_cast<float>(1.0 / sqrt(double(block))): formats::hadamard_scale's formula.
  a.q_hadamard_block = hadamard_block > 1 ? hadamard_block : 1;
  a.q_hadamard_scale = hadamard_block > 1 ? formats::hadamard_scale(hadamard_block) : 1.0f;
  a.q_out = q_out;
  *args = a;
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t launch_qkv_kernel(const QkvArgs& a, KvFormat format, int rows, bool rope, cudaStream_t stream) {
  const int items = a.n_heads + 2 * a.n_kv_heads;
  const dim3 grid(static_cast<unsigned>((items + kQkvWarps - 1) / kQkvWarps), static_cast<unsigned>(rows));
  const dim3 block(kQkvWarps * kWarp);
  switch (format) {
    case KvFormat::BF16: return launch_maybe_programmatic(qkv_kernel<KvFormat::BF16>(rope), grid, block, stream, a);
    case KvFormat::FP8: return launch_maybe_programmatic(qkv_kernel<KvFormat::FP8>(rope), grid, block, stream, a);
    case KvFormat::INT4: return launch_maybe_programmatic(qkv_kernel<KvFormat::INT4>(rope), grid, block, stream, a);
    case KvFormat::INT4_HADAMARD:
      return launch_maybe_programmatic(qkv_kernel<KvFormat::INT4_HADAMARD>(rope), grid, block, stream, a);
  }
  return cudaErrorInvalidValue;  // unreachable: make_qkv_args checked the format
}

}  // namespace fused


cudaError_t add_residual_rmsnorm_bf16(float* x, const __nv_bfloat16* delta, const float* weight, __nv_bfloat16* y,
                                      int rows, int hidden, float eps, cudaStream_t stream) {
  constexpr const char* op = "add_residual_rmsnorm_bf16";
  g_last_error.clear();
  if (!x || !delta || !weight || !y)
    return reject(&g_last_error, std::string(op) + ": x, delta, weight and y must be non-null device pointers");
  if (check_range(op, "rows", rows, 1, kDecoderOpsMaxRows, &g_last_error) ||
      check_range(op, "hidden", hidden, 1, kDecoderOpsMaxWidth, &g_last_error))
    return cudaErrorInvalidValue;
  if (!std::isfinite(eps) || eps < 0.0f)
    return reject(&g_last_error, std::string(op) + ": eps = " + to_string(eps) + ", expected a finite value >= 0");
  // One CTA's stores of x and y could otherwise land in another CTA's x or delta before that CTA has read them.
  const int64_t n = int64_t{rows} * hidden;
  if (overlap(x, n * 4, delta, n * 2) || overlap(x, n * 4, y, n * 2) || overlap(delta, n * 2, y, n * 2))
    return reject(&g_last_error, std::string(op) + ": x, delta and y overlap; expected separate buffers");
  // rmsnorm_bf16's own choice of instance and block size, so the sum of squares runs in its order.
  const bool vec = ops::rmsnorm_vec(x, weight, y, hidden);
  const int threads = ops::rmsnorm_threads(hidden, vec);
  const bool delta_vec = aligned(delta, 8);
  auto kernel = !vec        ? fused::add_residual_rmsnorm_kernel<false, false>
                : delta_vec ? fused::add_residual_rmsnorm_kernel<true, true>
                            : fused::add_residual_rmsnorm_kernel<true, false>;
  return launch_maybe_programmatic(kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(threads)),
                                   stream, x, delta, weight, y, hidden, eps);
}

cudaError_t qkv_rope_kv_append_can_implement(KvFormat format, int rows, int n_heads, int n_kv_heads, int head_dim,
                                             int hadamard_block, std::string* why) {
  constexpr const char* op = "qkv_rope_kv_append";
  if (format > KvFormat::INT4_HADAMARD)
    return reject(why, std::string(op) + ": unknown KV format " + to_string(static_cast<int>(format)) +
                           " (expected bf16, fp8, int4 or int4-hadamard)");
  if (check_range(op, "rows", rows, 1, kMaxGridY, why) || check_range(op, "n_heads", n_heads, 1, kMaxGridY, why) ||
      check_range(op, "n_kv_heads", n_kv_heads, 1, kMaxGridY, why))
    return cudaErrorInvalidValue;
  const int multiple = head_dim_multiple(format);
  if (head_dim < multiple || head_dim > kKvAppendMaxHeadDim || head_dim % multiple != 0)
    return reject(why, std::string(op) + ": head_dim = " + to_string(head_dim) + " is not supported for " +
                           formats::kv_format_name(format) + " (expected a positive multiple of " +
                           to_string(multiple) + ", at most " + to_string(kKvAppendMaxHeadDim) + ")");
  // The q rotation runs kv_append's warp butterfly: lanes for strides < 32, registers for 32..128.
  if (hadamard_block < 0 || (hadamard_block > 1 && (!is_pow2(hadamard_block) || head_dim % hadamard_block != 0)))
    return reject(why, std::string(op) + ": hadamard_block = " + to_string(hadamard_block) +
                           ", expected 0, 1 or a power of two dividing head_dim = " + to_string(head_dim));
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t qkv_rope_kv_append(KvFormat format, __nv_bfloat16* qkv, int rows, int n_heads, int n_kv_heads,
                               int head_dim, const int32_t* positions, const float* inv_freq,
                               const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors,
                               const int32_t* row_anchor, uint8_t* kv_pool, int hadamard_block,
                               __nv_bfloat16* q_out, cudaStream_t stream) {
  return qkv_append("qkv_rope_kv_append", true, format, qkv, rows, n_heads, n_kv_heads, head_dim, positions,
                    inv_freq, row_page, row_slot, key_anchors, row_anchor, kv_pool, hadamard_block, q_out, stream);
}

cudaError_t kv_append_rotate_q(KvFormat format, const __nv_bfloat16* qkv, int rows, int n_heads, int n_kv_heads,
                               int head_dim, const int32_t* row_page, const int32_t* row_slot,
                               const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool,
                               int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream) {
  // The !rope kernel never writes qkv.
  return qkv_append("kv_append_rotate_q", false, format, const_cast<__nv_bfloat16*>(qkv), rows, n_heads, n_kv_heads,
                    head_dim, nullptr, nullptr, row_page, row_slot, key_anchors, row_anchor, kv_pool, hadamard_block,
                    q_out, stream);
}

cudaError_t kv_append_keys(KvFormat format, const __nv_bfloat16* qkv, int rows, int n_heads, int n_kv_heads,
                           int head_dim, const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors,
                           const int32_t* row_anchor, uint8_t* kv_pool, cudaStream_t stream) {
  constexpr const char* op = "kv_append_keys";
  g_last_error.clear();
  if ((format != KvFormat::INT4 && format != KvFormat::INT4_HADAMARD) || head_dim != fused::kQuadHeadDim)
    return reject(&g_last_error, std::string(op) + ": " + formats::kv_format_name(format) + " cache at head_dim " +
                                     to_string(head_dim) + ", expected an int4 or int4-hadamard cache at head_dim " +
                                     to_string(fused::kQuadHeadDim));
  fused::QkvArgs a{};
  if (const cudaError_t e = fused::make_qkv_args(op, false, format, const_cast<__nv_bfloat16*>(qkv), rows, n_heads,
                                                 n_kv_heads, head_dim, nullptr, nullptr, row_page, row_slot,
                                                 key_anchors, row_anchor, kv_pool, 0, nullptr, &a, &g_last_error,
                                                 /*needs_q_out=*/false);
      e != cudaSuccess)
    return e;
  if (!aligned(qkv, 16)) return reject(&g_last_error, std::string(op) + ": qkv must be 16-byte aligned");
  const int64_t quads = static_cast<int64_t>(rows) * n_kv_heads;
  const dim3 grid(static_cast<unsigned>((quads + fused::kQuadItemsPerCta - 1) / fused::kQuadItemsPerCta));
  const dim3 block(fused::kQuadThreads);
  return format == KvFormat::INT4
             ? launch_maybe_programmatic(fused::kv_append_rotate_q_quad_kernel<KvFormat::INT4, false, true>, grid,
                                         block, stream, a, rows)
             : launch_maybe_programmatic(fused::kv_append_rotate_q_quad_kernel<KvFormat::INT4_HADAMARD, false, true>,
                                         grid, block, stream, a, rows);
}

const char* fused_ops_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
