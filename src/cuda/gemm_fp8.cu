// Host side of the FP8 GEMM: shape and pointer checks, the TMA tensor maps (cuTensorMapEncodeTiled, reached
// through the runtime's driver entry point so nothing links against libcuda), the tile choice and the launch.
#include "futransformer/cuda/gemm_fp8.h"
#include "futransformer/cuda/gemm_fp8_qkv.h"
#include "futransformer/cuda/gemm_fp8_swiglu.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "cuda/gemm_fp8.cuh"
#include "cuda/gemm_fp8_qkv.cuh"
#include "cuda/gemm_fp8_residual_ws.cuh"
#include "cuda/gemm_fp8_swiglu.cuh"
#include "cuda/gemm_fp8_heuristics.h"
#include "cuda/launch_status.h"
#include "futransformer/formats/hadamard.h"

namespace futransformer::cuda {
namespace {

using fp8::Config;
using fp8::DeviceLimits;

thread_local std::string g_last_error;
thread_local std::string g_swiglu_last_error;
thread_local std::string g_qkv_last_error;

// FT_FP8_GEMM_BLOCK_N=128|192 forces the tile width (for calibrating the heuristic with the bench).
int forced_block_n() {
  static const int v = [] {
    const char* e = std::getenv("FT_FP8_GEMM_BLOCK_N");
    return e != nullptr ? std::atoi(e) : 0;
  }();
  return v;
}


PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 2-D row-major tensor [rows, cols] of `elem` bytes per element, copied in boxes of box_rows x box_cols with
// the 128-byte swizzle (box_cols * elem must be 128: one swizzled row per box row).
bool make_map(CUtensorMap* map, CUtensorMapDataType type, size_t elem, const void* ptr, int rows, int cols,
              int box_rows, int box_cols, CUtensorMapL2promotion promotion, std::string* why, const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  if (encode == nullptr) {
    *why = "gemm_fp8: the driver does not provide cuTensorMapEncodeTiled (CUDA 12.0+ driver needed)";
    return false;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * elem};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    *why = std::string("gemm_fp8: cuTensorMapEncodeTiled failed for ") + what + " (CUresult " + std::to_string(r) +
           ", " + std::to_string(rows) + " x " + std::to_string(cols) + ")";
    return false;
  }
  return true;
}

cudaError_t device_limits(DeviceLimits* d, bool* hopper) {
  int dev = 0, sms = 0, per_block = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess) return e;
  d->sm_count = sms;
  d->smem_per_block = per_block;
  *hopper = major == 9 && minor == 0;
  return cudaSuccess;
}

// FT_FP8_PDL=1 launches the FP8 GEMMs with the programmatic attribute (when FT_PDL is not 0). Off by default: the
// whole 8B prefill of 2048 tokens measured 37.38 ms without and 38.01 ms with it in one call (ninth session,
// docs/results.md) — no gain, the kernels are long and each launch is already queued behind the previous one.
// The kernels' griddepcontrol instructions do nothing without the attribute. Read once per process.
bool fp8_pdl_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("FT_FP8_PDL");
    return e != nullptr && e[0] == '1';
  }();
  return v;
}

// One persistent launch: `grid` CTAs of `threads` with `smem` bytes of dynamic shared memory. The opt-in limit is set
// per function and device each time (cheap enough to repeat, and it keeps multi-device use correct).
template <typename... Params, typename... Args>
cudaError_t launch_persistent(void (*kernel)(Params...), int grid, int threads, uint32_t smem, cudaStream_t stream,
                              const Args&... args) {
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  // Programmatic dependent launch with FT_FP8_PDL=1 (the kernels wait first: fp8::pdl_wait_then_release).
  cudaLaunchAttribute attr;
  if (fp8_pdl_enabled()) add_programmatic_attribute(&cfg, &attr);
  return launch_kernel_ex(&cfg, kernel, args...);
}

template <int kBlockN, bool kResidual, bool kBlockScaledA, bool kOverlap = false, bool kRope = false>
cudaError_t launch(const CUtensorMap& ma, const CUtensorMap& mb, const CUtensorMap& md, const fp8::KernelParams& p,
                   const Config& c, cudaStream_t stream, const fp8::RopeParams& rope = {}) {
  constexpr int kStages = fp8::stages_for(kBlockN);
  constexpr uint32_t smem = fp8::smem_layout(kBlockN, kStages).alloc_bytes;
  return launch_persistent(fp8::gemm_fp8_kernel<kBlockN, kStages, kResidual, kBlockScaledA, kOverlap, kRope>, c.grid,
                           fp8::kThreads, smem, stream, ma, mb, md, p, rope);
}

// The per-token BF16-store GEMM at block_n 128 runs the two-accumulator main loop (kOverlap; same bits): measured
// 5-8 % faster on the 8B / 70B shapes at M >= 512 (docs/results.md, eighth session). FT_FP8_OVERLAP=0 turns it off
// (comparisons). Read once per process.
bool overlap_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("FT_FP8_OVERLAP");
    return !(e != nullptr && e[0] == '0');
  }();
  return v;
}

}  // namespace

cudaError_t gemm_fp8_can_implement(int M, int N, int K, std::string* why) {
  using std::to_string;
  if (M < 1 || M > kFp8GemmMaxDim)
    return reject(why, "gemm_fp8: M = " + to_string(M) + " rows, expected 1.." + to_string(kFp8GemmMaxDim));
  if (N < kFp8GemmNMultiple || N > kFp8GemmMaxDim || N % kFp8GemmNMultiple != 0)
    return reject(why, "gemm_fp8: N = " + to_string(N) + " output columns, expected a positive multiple of " +
                           to_string(kFp8GemmNMultiple) + " up to " + to_string(kFp8GemmMaxDim));
  if (K < kFp8GemmKMultiple || K > kFp8GemmMaxDim || K % kFp8GemmKMultiple != 0)
    return reject(why, "gemm_fp8: K = " + to_string(K) + " input columns, expected a positive multiple of " +
                           to_string(kFp8GemmKMultiple) + " up to " + to_string(kFp8GemmMaxDim));
  // Tile indices are int in the kernel, and a CTA steps past the last one by at most the grid.
  constexpr int kNarrowest = fp8::kBlockNs[0];
  const int64_t tiles = int64_t{(M + fp8::kBlockM - 1) / fp8::kBlockM} * ((N + kNarrowest - 1) / kNarrowest);
  if (tiles > (int64_t{1} << 30))
    return reject(why, "gemm_fp8: M = " + to_string(M) + " by N = " + to_string(N) + " makes " + to_string(tiles) +
                           " output tiles, more than 2^30");
  if (why) why->clear();
  return cudaSuccess;
}

const char* gemm_fp8_last_error() { return g_last_error.c_str(); }

namespace {

// FT_FP8_RESIDUAL_WS=0 keeps the per-token residual GEMM at block_n 128 on gemm_fp8_kernel's own epilogue instead of
// the warp-specialised one (gemm_fp8_residual_ws.cuh; same bits), for comparing the two.
bool residual_ws_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("FT_FP8_RESIDUAL_WS");
    return !(e != nullptr && e[0] == '0');
  }();
  return v;
}

// FT_FP8_RESIDUAL_OVERLAP=1: the warp-specialised residual GEMM with the overlapped main loop (registers moved from
// its epilogue warpgroup to the consumers; same bits, GPU-tested). Off: measured at the 8B shape, 2048 tokens, down
// + residual 209.0 -> 204.0 us and o + residual 69.3 -> 68.9 us, but the whole prefill did not move (38.28 vs
// 38.49 ms, within the call-to-call spread). Read once per process.
bool residual_overlap_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("FT_FP8_RESIDUAL_OVERLAP");
    return e != nullptr && e[0] == '1';
  }();
  return v;
}

template <bool kResidual, bool kBlockScaledA>
cudaError_t dispatch(const CUtensorMap& ma, const CUtensorMap& mb, const CUtensorMap& md, const fp8::KernelParams& p,
                     const Config& c, cudaStream_t stream) {
  switch (c.block_n) {
    case 192: return launch<192, kResidual, kBlockScaledA>(ma, mb, md, p, c, stream);
    default:
      if constexpr (!kResidual && !kBlockScaledA) {
        if (overlap_enabled()) return launch<128, false, false, true>(ma, mb, md, p, c, stream);
      }
      return launch<128, kResidual, kBlockScaledA>(ma, mb, md, p, c, stream);
  }
}

// Every entry point: D (BF16 store) or, with `residual_mode`, residual (fp32 in-place add); a_scale per row or,
// with `block_a`, per row per 128-deep K block. Shapes are checked before pointers, so a bad shape is named whatever
// the pointers are.
// `rope` (gemm_fp8_rope, BF16 store only): RoPE on columns [0, rope.cols) in the epilogue, at 128-column tiles.
cudaError_t run_gemm_fp8(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale,
                         __nv_bfloat16* D, float* residual, bool residual_mode, bool block_a, int M, int N, int K,
                         cudaStream_t stream, const fp8::RopeParams& rope = {}) {
  g_last_error.clear();
  if (gemm_fp8_can_implement(M, N, K, &g_last_error) != cudaSuccess) return cudaErrorInvalidValue;
  const bool rope_mode = rope.cs != nullptr;  // gemm_fp8_rope checked its own arguments
  if (!A || !B || !a_scale || !b_scale || !aligned(A, 16) || !aligned(B, 16) || !aligned(a_scale, 4) ||
      !aligned(b_scale, 4)) {
    return reject(&g_last_error,
                  "gemm_fp8: A and B must be non-null and 16-byte aligned, a_scale and b_scale non-null and 4-byte "
                  "aligned");
  }
  if (!residual_mode && (!D || !aligned(D, 16)))
    return reject(&g_last_error, "gemm_fp8: D must be non-null and 16-byte aligned");
  if (residual_mode && (!residual || !aligned(residual, 8)))
    return reject(&g_last_error, "gemm_fp8_residual: residual must be non-null and 8-byte aligned");
  DeviceLimits d;
  bool hopper = false;
  if (const cudaError_t e = device_limits(&d, &hopper); e != cudaSuccess) return e;
  if (!hopper) {
    return reject(&g_last_error, "gemm_fp8: the kernel is built for sm_90a (H100/H200) only");
  }
  const Config c = fp8::choose_config(M, N, K, d, rope_mode ? fp8::kRopeHeadDim : forced_block_n());
  if (print_heuristics()) std::fprintf(stderr, "%s\n", fp8::describe_config(c, M, N, K, d).c_str());
  if (static_cast<int64_t>(fp8::smem_layout(c.block_n, c.stages).alloc_bytes) > d.smem_per_block) {
    return reject(&g_last_error, "gemm_fp8: the tile needs " +
                                     std::to_string(fp8::smem_layout(c.block_n, c.stages).alloc_bytes) +
                                     " bytes of shared memory, the device allows " + std::to_string(d.smem_per_block));
  }

  CUtensorMap ma, mb, md{};  // md stays unused (and unencoded) for the residual epilogue
  if (!make_map(&ma, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, A, M, K, fp8::kBlockM, fp8::kBlockK,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, &g_last_error, "A") ||
      !make_map(&mb, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, B, N, K, c.block_n, fp8::kBlockK,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, &g_last_error, "B") ||
      (!residual_mode && !make_map(&md, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, D, M, N, fp8::kWgmmaM,
                                        fp8::kDBoxCols, CU_TENSOR_MAP_L2_PROMOTION_NONE, &g_last_error, "D")))
    return cudaErrorInvalidValue;

  const int a_kblocks = (K + fp8::kBlockK - 1) / fp8::kBlockK;
  const fp8::KernelParams p{a_scale, b_scale, M, N, K, c.m_blocks, c.n_blocks, c.group_m, residual, a_kblocks};
  if (rope_mode) {
    if (c.block_n != fp8::kRopeHeadDim)
      return reject(&g_last_error, "gemm_fp8_rope: the tile heuristic did not take 128-column tiles");
    return overlap_enabled() ? launch<128, false, false, true, true>(ma, mb, md, p, c, stream, rope)
                             : launch<128, false, false, false, true>(ma, mb, md, p, c, stream, rope);
  }
  if (block_a) {
    return residual_mode ? dispatch<true, true>(ma, mb, md, p, c, stream) : dispatch<false, true>(ma, mb, md, p, c, stream);
  }
  // Per-token residual at block_n 128 with a 16-byte aligned residual: the warp-specialised epilogue (same bits).
  if (residual_mode && c.block_n == fp8rw::kBlockN && aligned(residual, 16) && residual_ws_enabled() &&
      static_cast<int64_t>(fp8rw::smem_layout().alloc_bytes) <= d.smem_per_block)
    return launch_persistent(residual_overlap_enabled() ? fp8rw::gemm_fp8_residual_ws_kernel<true>
                                                        : fp8rw::gemm_fp8_residual_ws_kernel<false>,
                             c.grid, fp8rw::kThreads,
                             fp8rw::smem_layout().alloc_bytes, stream, ma, mb, p);
  return residual_mode ? dispatch<true, false>(ma, mb, md, p, c, stream) : dispatch<false, false>(ma, mb, md, p, c, stream);
}

}  // namespace

cudaError_t gemm_fp8(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale, __nv_bfloat16* D,
                     int M, int N, int K, cudaStream_t stream) {
  return run_gemm_fp8(A, B, a_scale, b_scale, D, nullptr, false, false, M, N, K, stream);
}

cudaError_t gemm_fp8_rope(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale,
                          __nv_bfloat16* D, const float* rope_cos_sin, int rope_heads, int M, int N, int K,
                          cudaStream_t stream) {
  g_last_error.clear();
  if (gemm_fp8_can_implement(M, N, K, &g_last_error) != cudaSuccess) return cudaErrorInvalidValue;
  constexpr int kHd = fp8::kRopeHeadDim;
  if (N % kHd != 0 || rope_heads < 1 || rope_heads > N / kHd)
    return reject(&g_last_error, "gemm_fp8_rope: rope_heads = " + std::to_string(rope_heads) + " with N = " +
                                     std::to_string(N) + ", expected N a multiple of " + std::to_string(kHd) +
                                     " (head_dim) and 1 .. N / " + std::to_string(kHd) + " heads");
  if (!rope_cos_sin || !aligned(rope_cos_sin, 16))
    return reject(&g_last_error, "gemm_fp8_rope: rope_cos_sin must be non-null and 16-byte aligned");
  const fp8::RopeParams rope{reinterpret_cast<const float2*>(rope_cos_sin), rope_heads * kHd};
  return run_gemm_fp8(A, B, a_scale, b_scale, D, nullptr, false, false, M, N, K, stream, rope);
}

cudaError_t gemm_fp8_residual(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale,
                              float* residual, int M, int N, int K, cudaStream_t stream) {
  return run_gemm_fp8(A, B, a_scale, b_scale, nullptr, residual, true, false, M, N, K, stream);
}

cudaError_t gemm_fp8_block_a(const uint8_t* A, const uint8_t* B, const float* a_scale_blocks, const float* b_scale,
                             __nv_bfloat16* D, int M, int N, int K, cudaStream_t stream) {
  return run_gemm_fp8(A, B, a_scale_blocks, b_scale, D, nullptr, false, true, M, N, K, stream);
}

cudaError_t gemm_fp8_block_a_residual(const uint8_t* A, const uint8_t* B, const float* a_scale_blocks,
                                      const float* b_scale, float* residual, int M, int N, int K,
                                      cudaStream_t stream) {
  return run_gemm_fp8(A, B, a_scale_blocks, b_scale, nullptr, residual, true, true, M, N, K, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// gate|up GEMM + SwiGLU → FP8 blocks (gemm_fp8_swiglu.cuh)

int64_t gemm_fp8_swiglu_packed_row_source(int64_t packed_row, int64_t inter) {
  return fp8sw::packed_row_source(packed_row, inter);
}

cudaError_t gemm_fp8_swiglu_can_implement(int M, int inter, int K, std::string* why) {
  using std::to_string;
  if (M < 1 || M > kFp8GemmMaxDim)
    return reject(why, "gemm_fp8_swiglu: M = " + to_string(M) + " rows, expected 1.." + to_string(kFp8GemmMaxDim));
  if (inter < kFp8SwigluChannelMultiple || inter % kFp8SwigluChannelMultiple != 0 || inter > kFp8GemmMaxDim / 2)
    return reject(why, "gemm_fp8_swiglu: inter = " + to_string(inter) + " SwiGLU channels, expected a positive " +
                           "multiple of " + to_string(kFp8SwigluChannelMultiple) + " (one FP8 block per tile) up to " +
                           to_string(kFp8GemmMaxDim / 2));
  if (K < kFp8GemmKMultiple || K > kFp8GemmMaxDim || K % kFp8GemmKMultiple != 0)
    return reject(why, "gemm_fp8_swiglu: K = " + to_string(K) + " input columns, expected a positive multiple of " +
                           to_string(kFp8GemmKMultiple) + " up to " + to_string(kFp8GemmMaxDim));
  const int64_t tiles = int64_t{(M + fp8sw::kBlockM - 1) / fp8sw::kBlockM} * (inter / fp8sw::kChannelsPerTile);
  if (tiles > (int64_t{1} << 30))
    return reject(why, "gemm_fp8_swiglu: M = " + to_string(M) + " by inter = " + to_string(inter) + " makes " +
                           to_string(tiles) + " tiles, more than 2^30");
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t gemm_fp8_swiglu(const uint8_t* A, const uint8_t* B_packed, const float* a_scale,
                            const float* b_scale_packed, uint8_t* codes, float* y_scales, int M, int inter, int K,
                            cudaStream_t stream) {
  std::string& err = g_swiglu_last_error;
  err.clear();
  if (gemm_fp8_swiglu_can_implement(M, inter, K, &err) != cudaSuccess) return cudaErrorInvalidValue;
  if (!A || !B_packed || !a_scale || !b_scale_packed || !codes || !y_scales || !aligned(A, 16) ||
      !aligned(B_packed, 16) || !aligned(a_scale, 4) || !aligned(b_scale_packed, 4) || !aligned(codes, 16) ||
      !aligned(y_scales, 4)) {
    return reject(&err, "gemm_fp8_swiglu: A, B_packed and codes must be non-null and 16-byte aligned, "
                        "a_scale, b_scale_packed and y_scales non-null and 4-byte aligned");
  }
  DeviceLimits d;
  bool hopper = false;
  if (const cudaError_t e = device_limits(&d, &hopper); e != cudaSuccess) return e;
  if (!hopper) return reject(&err, "gemm_fp8_swiglu: the kernel is built for sm_90a (H100/H200) only");
  constexpr uint32_t smem = fp8sw::smem_layout().alloc_bytes;
  if (static_cast<int64_t>(smem) > d.smem_per_block) {
    return reject(&err, "gemm_fp8_swiglu: the tile needs " + std::to_string(smem) +
                            " bytes of shared memory, the device allows " + std::to_string(d.smem_per_block));
  }
  CUtensorMap ma, mb;
  if (!make_map(&ma, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, A, M, K, fp8sw::kBlockM, fp8::kBlockK,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, &err, "A") ||
      !make_map(&mb, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, B_packed, 2 * inter, K, fp8sw::kBlockN, fp8::kBlockK,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, &err, "B_packed"))
    return cudaErrorInvalidValue;
  fp8sw::KernelParams p{};
  p.a_scale = a_scale;
  p.b_scale = b_scale_packed;
  p.codes = codes;
  p.y_scales = y_scales;
  p.M = M;
  p.inter = inter;
  p.K = K;
  p.m_blocks = (M + fp8sw::kBlockM - 1) / fp8sw::kBlockM;
  p.n_blocks = inter / fp8sw::kChannelsPerTile;
  p.group_m = fp8sw::kGroupM;
  const int64_t tiles = int64_t{p.m_blocks} * p.n_blocks;
  const int grid = static_cast<int>(tiles < d.sm_count ? tiles : d.sm_count);
  if (print_heuristics()) {
    std::fprintf(stderr, "gemm_fp8_swiglu M=%d inter=%d K=%d: tile %dx%dx%d stages=%d tiles=%lld grid=%d smem=%u B\n",
                 M, inter, K, fp8sw::kBlockM, fp8sw::kBlockN, fp8::kBlockK, fp8sw::kStages,
                 static_cast<long long>(tiles), grid, smem);
  }
  return launch_persistent(fp8sw::gemm_fp8_swiglu_kernel, grid, fp8sw::kThreads, smem, stream, ma, mb, p);
}

const char* gemm_fp8_swiglu_last_error() { return g_swiglu_last_error.c_str(); }

// ---------------------------------------------------------------------------------------------------------------
// QKV GEMM + RoPE, Hadamard, INT4 cache placement and q rotation (gemm_fp8_qkv.cuh)

cudaError_t gemm_fp8_qkv_can_implement(formats::KvFormat format, int M, int n_heads, int n_kv_heads, int head_dim,
                                       int K, int hadamard_block, std::string* why) {
  using std::to_string;
  constexpr const char* op = "gemm_fp8_qkv";
  if (format != formats::KvFormat::INT4 && format != formats::KvFormat::INT4_HADAMARD)
    return reject(why, std::string(op) + ": KV format " + formats::kv_format_name(format) +
                           ", expected int4 or int4-hadamard (other caches take gemm_fp8 + qkv_rope_kv_append)");
  if (head_dim != kFp8QkvHeadDim)
    return reject(why, std::string(op) + ": head_dim = " + to_string(head_dim) + ", expected " +
                           to_string(kFp8QkvHeadDim) + " (one 128-column tile per head)");
  if (n_heads < 1 || n_kv_heads < 1 || n_heads > (1 << 16) || n_kv_heads > (1 << 16))
    return reject(why, std::string(op) + ": n_heads = " + to_string(n_heads) + ", n_kv_heads = " +
                           to_string(n_kv_heads) + ", expected 1..65536 each");
  if (hadamard_block < 0 || hadamard_block > kFp8QkvHeadDim ||
      (hadamard_block > 1 && (hadamard_block & (hadamard_block - 1)) != 0))
    return reject(why, std::string(op) + ": hadamard_block = " + to_string(hadamard_block) +
                           ", expected 0, 1 or a power of two up to 128");
  const int N = (n_heads + 2 * n_kv_heads) * head_dim;
  std::string g;
  if (gemm_fp8_can_implement(M, N, K, &g) != cudaSuccess) return reject(why, std::string(op) + g.substr(g.find(':')));
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t gemm_fp8_qkv(const uint8_t* A, const uint8_t* B, const float* a_scale, const float* b_scale, int M, int K,
                         const GemmFp8QkvArgs& args, cudaStream_t stream) {
  std::string& err = g_qkv_last_error;
  err.clear();
  if (gemm_fp8_qkv_can_implement(args.format, M, args.n_heads, args.n_kv_heads, args.head_dim, K,
                                 args.hadamard_block, &err) != cudaSuccess)
    return cudaErrorInvalidValue;
  const bool hadamard = args.format == formats::KvFormat::INT4_HADAMARD;
  if (!A || !B || !a_scale || !b_scale || !aligned(A, 16) || !aligned(B, 16) || !aligned(a_scale, 4) ||
      !aligned(b_scale, 4))
    return reject(&err, "gemm_fp8_qkv: A and B must be non-null and 16-byte aligned, a_scale and b_scale non-null "
                        "and 4-byte aligned");
  if (!args.rope_cos_sin || !args.row_page || !args.row_slot || !args.kv_pool || !args.q_out ||
      !aligned(args.rope_cos_sin, 8) || !aligned(args.row_page, 4) || !aligned(args.row_slot, 4) ||
      !aligned(args.kv_pool, 16) || !aligned(args.q_out, 16) || !aligned(args.qkv_keys, 16))
    return reject(&err, "gemm_fp8_qkv: rope_cos_sin (8-byte aligned), row_page, row_slot (4-byte aligned), kv_pool and "
                        "q_out (16-byte aligned) must be non-null; qkv_keys, when given, 16-byte aligned");
  if (hadamard && (!args.key_anchors || !args.row_anchor || !aligned(args.key_anchors, 2) ||
                   !aligned(args.row_anchor, 4)))
    return reject(&err, "gemm_fp8_qkv: int4-hadamard needs key_anchors (non-null, 2-byte aligned) and row_anchor "
                        "(non-null, 4-byte aligned)");
  const int items = args.n_heads + 2 * args.n_kv_heads;
  const int N = items * args.head_dim;
  DeviceLimits d;
  bool hopper = false;
  if (const cudaError_t e = device_limits(&d, &hopper); e != cudaSuccess) return e;
  if (!hopper) return reject(&err, "gemm_fp8_qkv: the kernel is built for sm_90a (H100/H200) only");
  constexpr uint32_t smem = fp8rw::smem_layout().alloc_bytes;
  if (static_cast<int64_t>(smem) > d.smem_per_block)
    return reject(&err, "gemm_fp8_qkv: the tile needs " + std::to_string(smem) +
                            " bytes of shared memory, the device allows " + std::to_string(d.smem_per_block));
  const Config c = fp8::choose_config(M, N, K, d, fp8qkv::kBlockN);
  if (print_heuristics()) std::fprintf(stderr, "gemm_fp8_qkv: %s\n", fp8::describe_config(c, M, N, K, d).c_str());
  CUtensorMap ma, mb;
  if (!make_map(&ma, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, A, M, K, fp8::kBlockM, fp8::kBlockK,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, &err, "A") ||
      !make_map(&mb, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, B, N, K, fp8qkv::kBlockN, fp8::kBlockK,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, &err, "B"))
    return cudaErrorInvalidValue;
  const fp8::KernelParams p{a_scale, b_scale, M, N, K, c.m_blocks, c.n_blocks, c.group_m, nullptr, 0};
  fp8qkv::EpilogueParams e{};
  fused::QkvArgs& a = e.a;
  a.qkv = args.qkv_keys;
  a.row_width = N;
  a.n_heads = args.n_heads;
  a.n_kv_heads = args.n_kv_heads;
  a.head_dim = args.head_dim;
  a.row_page = args.row_page;
  a.row_slot = args.row_slot;
  a.key_anchors = hadamard ? args.key_anchors : nullptr;
  a.row_anchor = hadamard ? args.row_anchor : nullptr;
  a.pool = args.kv_pool;
  a.geo = kv::page_geometry(args.format, args.head_dim);
  if (hadamard) {
    // The host's own functions supply the constants, as in fused::make_qkv_args.
    a.kv_hadamard_block = static_cast<int32_t>(formats::kv_hadamard_block(args.format, args.head_dim));
    a.kv_hadamard_scale = formats::hadamard_scale(a.kv_hadamard_block);
  }
  a.q_hadamard_block = args.hadamard_block > 1 ? args.hadamard_block : 1;
  a.q_hadamard_scale = args.hadamard_block > 1 ? formats::hadamard_scale(args.hadamard_block) : 1.0f;
  a.q_out = args.q_out;
  e.rope_cs = reinterpret_cast<const float2*>(args.rope_cos_sin);
  e.keys_to_qkv = args.qkv_keys != nullptr ? 1 : 0;
  return hadamard ? launch_persistent(fp8qkv::gemm_fp8_qkv_kernel<formats::KvFormat::INT4_HADAMARD>, c.grid,
                                      fp8qkv::kThreads, smem, stream, ma, mb, p, e)
                  : launch_persistent(fp8qkv::gemm_fp8_qkv_kernel<formats::KvFormat::INT4>, c.grid, fp8qkv::kThreads,
                                      smem, stream, ma, mb, p, e);
}

const char* gemm_fp8_qkv_last_error() { return g_qkv_last_error.c_str(); }

}  // namespace futransformer::cuda
