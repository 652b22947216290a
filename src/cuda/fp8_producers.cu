// Host side of the FP8 prefill producers: argument checks, the vector/scalar instance choice and the launch
// configuration. Kernels: src/cuda/fp8_producers.cuh. Nothing here queries the device or allocates, so every
// launcher can be captured in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "cuda/decoder_ops.cuh"
#include "cuda/fp8_producers.cuh"
#include "cuda/launch_status.h"
#include "futransformer/cuda/fp8_producers.h"

namespace futransformer::cuda {
namespace {

using std::to_string;

thread_local std::string g_last_error;

static_assert(kFp8ProducersMaxRows <= 0x7fffffff, "rows go on grid.x");

// A byte range of one argument, for the overlap checks.
struct Extent {
  const char* name;
  const void* p;
  int64_t bytes;
};

bool overlap(const Extent& a, const Extent& b) {
  if (a.p == nullptr || b.p == nullptr || a.bytes == 0 || b.bytes == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.p), b0 = reinterpret_cast<uintptr_t>(b.p);
  return a0 < b0 + static_cast<uintptr_t>(b.bytes) && b0 < a0 + static_cast<uintptr_t>(a.bytes);
}

// A CTA may write its codes before another CTA has read the inputs they would overwrite, and pass 2 re-reads the
// row after other threads' pass-1 debug writes: every output must be disjoint from every input and other output.
cudaError_t check_disjoint(const char* op, std::initializer_list<Extent> inputs,
                           std::initializer_list<Extent> outputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (const Extent& i : inputs) {
      if (overlap(*o, i))
        return reject(&g_last_error,
                      std::string(op) + ": " + o->name + " overlaps " + i.name + "; expected separate buffers");
    }
    for (auto o2 = o + 1; o2 != outputs.end(); ++o2) {
      if (overlap(*o, *o2))
        return reject(&g_last_error,
                      std::string(op) + ": " + o->name + " overlaps " + o2->name + "; expected separate buffers");
    }
  }
  return cudaSuccess;
}

cudaError_t check_range(const char* op, const char* name, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return cudaSuccess;
  return reject(&g_last_error, std::string(op) + ": " + name + " = " + to_string(v) + ", expected " + to_string(lo) +
                                   ".." + to_string(hi));
}

cudaError_t check_rows(const char* op, int rows) { return check_range(op, "rows", rows, 1, kFp8ProducersMaxRows); }

cudaError_t check_width(const char* op, const char* name, int v) {
  return check_range(op, name, v, 1, kFp8ProducersMaxWidth);
}

cudaError_t null_pointer(const char* op, const char* names) {
  return reject(&g_last_error, std::string(op) + ": " + names + " must be non-null device pointers");
}

// One thread per unit (vector or element) of the row, whole warps, at most one full CTA.
int row_threads(int64_t units) {
  const int64_t threads = (units + fp8p::kWarp - 1) / fp8p::kWarp * fp8p::kWarp;
  return static_cast<int>(threads < fp8p::kMaxBlockThreads ? threads : fp8p::kMaxBlockThreads);
}

// The row-in-registers kernels: kRegUnits units per thread, whole warps (at most kRegMaxThreads by the callers'
// width check).
int reg_threads(int64_t units) {
  const int64_t per_thread = (units + fp8p::kRegUnits - 1) / fp8p::kRegUnits;
  return static_cast<int>((per_thread + fp8p::kWarp - 1) / fp8p::kWarp * fp8p::kWarp);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename... Args>
cudaError_t launch(void (*kernel)(Args...), int rows, int threads, cudaStream_t stream,
                   std::type_identity_t<Args>... args) {
  return launch_maybe_programmatic(kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(threads)),
                                   stream, args...);
}

}  // namespace

cudaError_t rmsnorm_fp8(const float* x, const float* weight, uint8_t* codes, float* scales, int rows, int hidden,
                        float eps, cudaStream_t stream, float* y_debug) {
  constexpr const char* op = "rmsnorm_fp8";
  g_last_error.clear();
  if (!x || !weight || !codes || !scales) return null_pointer(op, "x, weight, codes and scales");
  if (check_rows(op, rows) || check_width(op, "hidden", hidden)) return cudaErrorInvalidValue;
  if (!std::isfinite(eps) || eps < 0.0f)
    return reject(&g_last_error, std::string(op) + ": eps = " + to_string(eps) + ", expected a finite value >= 0");
  const int64_t n = int64_t{rows} * hidden;
  if (check_disjoint(op, {{"x", x, n * 4}, {"weight", weight, int64_t{hidden} * 4}},
                     {{"codes", codes, n}, {"scales", scales, int64_t{rows} * 4}, {"y_debug", y_debug, n * 4}}))
    return cudaErrorInvalidValue;
  // rmsnorm_bf16's choice for the same x and weight (its y alignment becomes the codes' 4-byte one), so both sum
  // the squares in the same order.
  const bool vec = hidden % fp8p::kRmsnormVec == 0 && aligned(x, 16) && aligned(weight, 16) && aligned(codes, 4);
  const int threads = ops::rmsnorm_threads(hidden, vec);
  if (vec) {
    // The row-in-registers kernel plays the same `threads`-thread block with threads / K real threads (K virtual
    // warps per real warp), each virtual thread's kIter units in registers; wider rows keep the two-pass kernel.
    const int virtual_warps = threads / fp8p::kWarp;
    const int k = virtual_warps % 4 == 0 ? 4 : virtual_warps % 2 == 0 ? 2 : 1;
    const int64_t iters = ceil_div(hidden / fp8p::kRmsnormVec, threads);
    // More than one unit per virtual thread only happens with the full 1024-thread block (32 virtual warps: K = 4).
    if (iters <= 2) {
      auto kernel = k == 4   ? (iters == 1 ? fp8p::rmsnorm_fp8_reg_kernel<4, 1> : fp8p::rmsnorm_fp8_reg_kernel<4, 2>)
                    : k == 2 ? fp8p::rmsnorm_fp8_reg_kernel<2, 1>
                             : fp8p::rmsnorm_fp8_reg_kernel<1, 1>;
      return launch(kernel, rows, threads / k, stream, x, weight, codes, scales, y_debug, hidden, eps);
    }
  }
  return launch(vec ? fp8p::rmsnorm_fp8_kernel<true> : fp8p::rmsnorm_fp8_kernel<false>, rows, threads, stream, x,
                weight, codes, scales, y_debug, hidden, eps);
}

cudaError_t quantize_rows_fp8(const __nv_bfloat16* x, int row_stride, uint8_t* codes, float* scales, int rows, int cols,
                              cudaStream_t stream) {
  constexpr const char* op = "quantize_rows_fp8";
  g_last_error.clear();
  if (!x || !codes || !scales) return null_pointer(op, "x, codes and scales");
  if (check_rows(op, rows) || check_width(op, "cols", cols)) return cudaErrorInvalidValue;
  if (row_stride < cols)
    return reject(&g_last_error, std::string(op) + ": row_stride = " + to_string(row_stride) +
                                     ", expected at least cols = " + to_string(cols));
  const int64_t in_elems = int64_t{rows - 1} * row_stride + cols;
  if (check_disjoint(op, {{"x", x, in_elems * 2}},
                     {{"codes", codes, int64_t{rows} * cols}, {"scales", scales, int64_t{rows} * 4}}))
    return cudaErrorInvalidValue;
  const bool vec =
      cols % fp8p::kBf16Vec == 0 && row_stride % fp8p::kBf16Vec == 0 && aligned(x, 16) && aligned(codes, 8);
  if (vec && cols / fp8p::kBf16Vec <= fp8p::kRegUnits * fp8p::kRegMaxThreads)
    return launch(fp8p::quantize_rows_fp8_reg_kernel, rows, reg_threads(cols / fp8p::kBf16Vec), stream, x,
                  int64_t{row_stride}, codes, scales, cols);
  const int threads = row_threads(vec ? cols / fp8p::kBf16Vec : cols);
  return launch(vec ? fp8p::quantize_rows_fp8_kernel<true> : fp8p::quantize_rows_fp8_kernel<false>, rows, threads,
                stream, x, int64_t{row_stride}, codes, scales, cols);
}

cudaError_t unrotate_rows_fp8_can_implement(int rows, int n_heads, int head_dim, int hadamard_block, int row_stride,
                                            std::string* why) {
  constexpr const char* op = "unrotate_rows_fp8";
  constexpr int kVec = hadamard::kLaneChannels;
  const auto fail = [&](const std::string& m) { return reject(why, std::string(op) + ": " + m); };
  if (rows < 1 || rows > kFp8ProducersMaxRows)
    return fail("rows = " + to_string(rows) + ", expected 1.." + to_string(kFp8ProducersMaxRows));
  if (n_heads < 1 || n_heads > kFp8ProducersMaxWidth)
    return fail("n_heads = " + to_string(n_heads) + ", expected 1.." + to_string(kFp8ProducersMaxWidth));
  const int lanes = head_dim / kVec;
  if (head_dim % kVec != 0 || lanes < 1 || lanes > fp8p::kWarp || (lanes & (lanes - 1)) != 0)
    return fail("head_dim = " + to_string(head_dim) + ", expected 16, 32, 64, 128, 256 or 512");
  if (hadamard_block < 2 || hadamard_block > head_dim || (hadamard_block & (hadamard_block - 1)) != 0)
    return fail("hadamard_block = " + to_string(hadamard_block) + ", expected a power of two in 2.." +
                to_string(head_dim));
  const int64_t cols = int64_t{n_heads} * head_dim;
  if (cols / kVec > fp8p::kMaxBlockThreads)
    return fail("n_heads x head_dim = " + to_string(cols) + ", expected at most " +
                to_string(kVec * fp8p::kMaxBlockThreads) + " (one thread per 16 channels)");
  if (row_stride < cols || row_stride % fp8p::kBf16Vec != 0)
    return fail("row_stride = " + to_string(row_stride) +
                ", expected a multiple of 8 and at least n_heads x head_dim = " + to_string(cols));
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t unrotate_rows_fp8(const __nv_bfloat16* x, int row_stride, uint8_t* codes, float* scales, int rows,
                              int n_heads, int head_dim, int hadamard_block, cudaStream_t stream) {
  constexpr const char* op = "unrotate_rows_fp8";
  constexpr int kVec = hadamard::kLaneChannels;
  g_last_error.clear();
  if (!x || !codes || !scales) return null_pointer(op, "x, codes and scales");
  if (unrotate_rows_fp8_can_implement(rows, n_heads, head_dim, hadamard_block, row_stride, &g_last_error) !=
      cudaSuccess)
    return cudaErrorInvalidValue;
  const int lanes = head_dim / kVec;
  const int64_t cols = int64_t{n_heads} * head_dim;
  if (!aligned(x, 16) || !aligned(codes, 8))
    return reject(&g_last_error, std::string(op) + ": x must be 16-byte and codes 8-byte aligned");
  const int64_t in_elems = int64_t{rows - 1} * row_stride + cols;
  if (check_disjoint(op, {{"x", x, in_elems * 2}},
                     {{"codes", codes, rows * cols}, {"scales", scales, int64_t{rows} * 4}}))
    return cudaErrorInvalidValue;
  // rotate_heads_bf16's scale: formats::hadamard_scale's formula.
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hadamard_block)));
  const int threads = row_threads(cols / kVec);
  const int c = static_cast<int>(cols);
  const auto go = [&](void (*kernel)(const __nv_bfloat16*, int64_t, uint8_t*, float*, int, int, float)) {
    return launch(kernel, rows, threads, stream, x, int64_t{row_stride}, codes, scales, c, hadamard_block, scale);
  };
  switch (lanes) {
    case 1: return go(fp8p::unrotate_rows_fp8_kernel<1>);
    case 2: return go(fp8p::unrotate_rows_fp8_kernel<2>);
    case 4: return go(fp8p::unrotate_rows_fp8_kernel<4>);
    case 8: return go(fp8p::unrotate_rows_fp8_kernel<8>);
    case 16: return go(fp8p::unrotate_rows_fp8_kernel<16>);
    default: return go(fp8p::unrotate_rows_fp8_kernel<32>);
  }
}

cudaError_t swiglu_fp8(const __nv_bfloat16* gate_up, uint8_t* codes, float* scales, int rows, int inter,
                       cudaStream_t stream, float* y_debug) {
  constexpr const char* op = "swiglu_fp8";
  g_last_error.clear();
  if (!gate_up || !codes || !scales) return null_pointer(op, "gate_up, codes and scales");
  if (check_rows(op, rows) || check_width(op, "inter", inter)) return cudaErrorInvalidValue;
  const int64_t n = int64_t{rows} * inter;
  if (check_disjoint(op, {{"gate_up", gate_up, 2 * n * 2}},
                     {{"codes", codes, n}, {"scales", scales, int64_t{rows} * 4}, {"y_debug", y_debug, n * 4}}))
    return cudaErrorInvalidValue;
  const bool vec = inter % fp8p::kBf16Vec == 0 && aligned(gate_up, 16) && aligned(codes, 8);
  if (vec && inter / fp8p::kBf16Vec <= fp8p::kRegUnits * fp8p::kRegMaxThreads)
    return launch(fp8p::swiglu_fp8_reg_kernel, rows, reg_threads(inter / fp8p::kBf16Vec), stream, gate_up, codes,
                  scales, y_debug, inter);
  const int threads = row_threads(vec ? inter / fp8p::kBf16Vec : inter);
  return launch(vec ? fp8p::swiglu_fp8_kernel<true> : fp8p::swiglu_fp8_kernel<false>, rows, threads, stream, gate_up,
                codes, scales, y_debug, inter);
}

cudaError_t swiglu_fp8_block(const __nv_bfloat16* gate_up, uint8_t* codes, float* scales, int rows, int inter,
                             cudaStream_t stream) {
  constexpr const char* op = "swiglu_fp8_block";
  g_last_error.clear();
  if (!gate_up || !codes || !scales) return null_pointer(op, "gate_up, codes and scales");
  if (check_rows(op, rows) || check_width(op, "inter", inter)) return cudaErrorInvalidValue;
  if (inter % fp8blk::kBlockCols != 0) {
    return reject(&g_last_error, std::string(op) + ": inter = " + std::to_string(inter) +
                                     ", expected a multiple of 128 (one scale per 128 channels)");
  }
  if (!aligned(gate_up, 8) || !aligned(codes, 4) || !aligned(scales, 4))
    return reject(&g_last_error, std::string(op) + ": gate_up must be 8-byte aligned, codes and scales 4-byte aligned");
  const int64_t n = int64_t{rows} * inter;
  const int64_t items = n / fp8blk::kBlockCols;
  if (check_disjoint(op, {{"gate_up", gate_up, 2 * n * 2}}, {{"codes", codes, n}, {"scales", scales, items * 4}}))
    return cudaErrorInvalidValue;
  const int64_t ctas = ceil_div(items, fp8p::kBlockWarpsPerCta);
  if (ctas > 0x7fffffff) return check_range(op, "rows * inter / 1024", ctas, 1, 0x7fffffff);
  return launch(fp8p::swiglu_fp8_block_kernel, static_cast<int>(ctas), fp8p::kBlockWarpsPerCta * fp8p::kWarp, stream,
                gate_up, codes, scales, rows, inter);
}

const char* fp8_producers_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
