#include "cuda/engine/device_linear.h"

#include <algorithm>
#include <cstdint>

#include "cuda/engine/engine_kernels.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/gemm_fp8.h"
#include "futransformer/cuda/gemm_fp8_swiglu.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/cuda/int4_dequant.h"
#include "futransformer/error.h"
#include "futransformer/formats/int4_mma.h"

namespace futransformer::cuda {
namespace {

void check_w4a16_shape(int64_t N, int64_t K, int64_t group, formats::ScaleType st, const std::string& name) {
  std::string why;
  check(N <= kW4A16MaxDim && K <= kW4A16MaxDim, name, ": ", N, " x ", K, " is larger than the W4A16 GEMM takes");
  if (gemm_w4a16_can_implement(1, static_cast<int>(N), static_cast<int>(K), static_cast<int>(group), st, &why) !=
      cudaSuccess)
    fail(name, ": the W4A16 GEMM cannot run this INT4 weight: ", why);
}

// The large-M paths of forward_residual / forward_swiglu write the GEMM output to a caller's BF16 temp first.
void check_tmp(const __nv_bfloat16* tmp, const void* out, int64_t tmp_elems, int64_t out_bytes, const std::string& name,
               const char* what) {
  const auto t0 = reinterpret_cast<uintptr_t>(tmp), o0 = reinterpret_cast<uintptr_t>(out);
  const uintptr_t t1 = t0 + static_cast<uintptr_t>(tmp_elems) * 2, o1 = o0 + static_cast<uintptr_t>(out_bytes);
  check(tmp != nullptr && t0 % 16 == 0 && !(t0 < o1 && o0 < t1), "CUDA engine: ", name, ": ", what,
        " at this M runs dequantise + cuBLAS and needs a 16-byte aligned BF16 temp that does not overlap the output");
}

}  // namespace

DeviceLinear DeviceLinear::from_int4(std::span<const formats::Int4Weight* const> parts, const std::string& name,
                                     formats::Int4MmaRows rows) {
  check(!parts.empty(), name, ": no weights");
  const bool swiglu = rows == formats::Int4MmaRows::swiglu_interleaved;
  check(!swiglu || (parts.size() == 2 && parts[0]->rows == parts[1]->rows), name,
        ": a SwiGLU-interleaved weight is two parts, gate and up, of equal row counts");
  const formats::Int4Weight& first = *parts[0];
  formats::Int4Weight fused;
  fused.cols = first.cols;
  fused.spec = first.spec;
  fused.group = first.group;
  for (const formats::Int4Weight* p : parts) {
    check(p->spec.symmetric, name, ": the W4A16 GEMM runs symmetric INT4 only (zero-point 8); this weight is "
          "asymmetric — quantise without -asym");
    check(p->cols == first.cols && p->group == first.group && p->spec.scale_type == first.spec.scale_type, name,
          ": fused parts differ in K, group size or scale type");
    fused.rows += p->rows;
    fused.qweight.insert(fused.qweight.end(), p->qweight.begin(), p->qweight.end());
    fused.scales.insert(fused.scales.end(), p->scales.begin(), p->scales.end());
  }
  check_w4a16_shape(fused.rows, fused.cols, fused.group, fused.spec.scale_type, name);
  formats::check_int4_mma_compatible(fused, name);
  DeviceLinear l;
  l.kind_ = Kind::Int4;
  l.name_ = name;
  l.N_ = fused.rows;
  l.K_ = fused.cols;
  l.group_ = fused.group;
  l.scale_type_ = fused.spec.scale_type;
  l.rows_ = rows;
  l.packed_.upload(formats::repack_int4_for_mma(fused, rows), name + " (packed INT4)");
  l.scales_.upload(formats::repack_int4_scales_for_mma(fused, rows), name + " (scales)");
  return l;
}

DeviceLinear DeviceLinear::from_bf16(const std::vector<uint16_t>& w, int64_t N, int64_t K, const std::string& name) {
  check(N > 0 && K > 0 && static_cast<int64_t>(w.size()) == N * K, name, ": expected ", N, " x ", K,
        " BF16 values, got ", w.size());
  DeviceLinear l;
  l.kind_ = Kind::Bf16;
  l.name_ = name;
  l.N_ = N;
  l.K_ = K;
  l.bf16_.upload(w, name + " (BF16)");
  l.bf16_ptr_ = l.bf16_.get();
  return l;
}

DeviceLinear DeviceLinear::borrow_bf16(const uint16_t* device_w, int64_t N, int64_t K, const std::string& name) {
  DeviceLinear l;
  l.kind_ = Kind::Bf16;
  l.name_ = name;
  l.N_ = N;
  l.K_ = K;
  l.bf16_ptr_ = device_w;
  return l;
}

DeviceLinear DeviceLinear::synthetic_int4(int64_t N, int64_t K, int64_t group, uint64_t seed, const std::string& name,
                                          formats::ScaleType scale_type, formats::Int4MmaRows rows) {
  check_w4a16_shape(N, K, group, scale_type, name);
  DeviceLinear l;
  l.kind_ = Kind::Int4;
  l.name_ = name;
  l.N_ = N;
  l.K_ = K;
  l.group_ = group;
  l.scale_type_ = scale_type;
  l.rows_ = rows;
  l.packed_.allocate(static_cast<size_t>(N * K / 8), name + " (packed INT4)");
  l.scales_.allocate(static_cast<size_t>(N * (K / group)), name + " (scales)");
  // Any nibbles are valid codes; scales near 1/(8·sqrt(K)) keep each output of unit-RMS inputs near unit size.
  const float s = 0.35f / static_cast<float>(__builtin_sqrt(static_cast<double>(K)));
  cuda_check(fill_random_u32(l.packed_.get(), l.packed_.size(), seed, nullptr), name + ": fill");
  cuda_check(fill_random_half_bits(l.scales_.get(), l.scales_.size(), 0.5f * s, 1.5f * s,
                                   scale_type == formats::ScaleType::BF16, seed + 1, nullptr),
             name + ": fill scales");
  return l;
}

DeviceLinear DeviceLinear::synthetic_bf16(int64_t N, int64_t K, uint64_t seed, const std::string& name) {
  DeviceLinear l;
  l.kind_ = Kind::Bf16;
  l.name_ = name;
  l.N_ = N;
  l.K_ = K;
  l.bf16_.allocate(static_cast<size_t>(N * K), name + " (BF16)");
  const float a = 1.7f / static_cast<float>(__builtin_sqrt(static_cast<double>(K)));
  cuda_check(fill_random_half_bits(l.bf16_.get(), l.bf16_.size(), -a, a, true, seed, nullptr), name + ": fill");
  l.bf16_ptr_ = l.bf16_.get();
  return l;
}

std::string DeviceLinear::fp8_shape_problem(int64_t N, int64_t K) {
  if (N > kFp8GemmMaxDim || K > kFp8GemmMaxDim)
    return "gemm_fp8: " + std::to_string(N) + " x " + std::to_string(K) + " is larger than the FP8 GEMM takes";
  std::string why;
  if (gemm_fp8_can_implement(1, static_cast<int>(N), static_cast<int>(K), &why) != cudaSuccess) return why;
  return {};
}

DeviceLinear DeviceLinear::from_fp8(std::span<const formats::Fp8Matrix* const> parts, const std::string& name,
                                    bool swiglu_pack) {
  check(!parts.empty(), name, ": no weights");
  const int64_t K = parts[0]->cols;
  int64_t N = 0;
  for (const formats::Fp8Matrix* p : parts) {
    check(p->cols == K, name, ": fused FP8 parts differ in K (", p->cols, " vs ", K, ")");
    check(p->block == p->cols && static_cast<int64_t>(p->scales.size()) == p->rows &&
              static_cast<int64_t>(p->codes.size()) == p->rows * p->cols,
          name, ": gemm_fp8 takes per-channel FP8 weights (one scale per output row); this part has blocks of ",
          p->block, " columns");
    N += p->rows;
  }
  const std::string why = fp8_shape_problem(N, K);
  check(why.empty(), name, ": the FP8 GEMM cannot run this ", N, " x ", K, " weight: ", why);
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  codes.reserve(static_cast<size_t>(N * K));
  scales.reserve(static_cast<size_t>(N));
  for (const formats::Fp8Matrix* p : parts) {
    codes.insert(codes.end(), p->codes.begin(), p->codes.end());
    scales.insert(scales.end(), p->scales.begin(), p->scales.end());
  }
  if (swiglu_pack) {
    check(N % 2 == 0, name, ": a gate|up weight has an even number of rows, this one ", N);
    std::string why;
    check(gemm_fp8_swiglu_can_implement(1, static_cast<int>(N / 2), static_cast<int>(K), &why) == cudaSuccess, name,
          ": cannot be packed for the FP8 SwiGLU epilogue: ", why);
    std::vector<uint8_t> packed(codes.size());
    std::vector<float> packed_scales(scales.size());
    for (int64_t p = 0; p < N; ++p) {
      const int64_t src = gemm_fp8_swiglu_packed_row_source(p, N / 2);
      std::copy_n(codes.begin() + src * K, K, packed.begin() + p * K);
      packed_scales[static_cast<size_t>(p)] = scales[static_cast<size_t>(src)];
    }
    codes.swap(packed);
    scales.swap(packed_scales);
  }
  DeviceLinear l;
  l.kind_ = Kind::Fp8;
  l.name_ = name;
  l.N_ = N;
  l.K_ = K;
  l.fp8_swiglu_packed_ = swiglu_pack;
  l.fp8_codes_.upload(codes, name + " (FP8 codes)");
  l.fp8_scales_.upload(scales, name + " (FP8 scales)");
  return l;
}

DeviceLinear DeviceLinear::synthetic_fp8(int64_t N, int64_t K, uint64_t seed, const std::string& name,
                                         bool swiglu_pack) {
  const std::string why = fp8_shape_problem(N, K);
  check(why.empty(), name, ": the FP8 GEMM cannot run this ", N, " x ", K, " weight: ", why);
  if (swiglu_pack) {
    std::string sw;
    check(N % 2 == 0 && gemm_fp8_swiglu_can_implement(1, static_cast<int>(N / 2), static_cast<int>(K), &sw) ==
                            cudaSuccess,
          name, ": cannot be packed for the FP8 SwiGLU epilogue: ", sw.empty() ? "odd row count" : sw);
  }
  DeviceLinear l;
  l.kind_ = Kind::Fp8;
  l.name_ = name;
  l.N_ = N;
  l.K_ = K;
  // Random codes: the packed order is just another random weight, so nothing is permuted.
  l.fp8_swiglu_packed_ = swiglu_pack;
  l.fp8_codes_.allocate(static_cast<size_t>(N * K), name + " (FP8 codes)");
  l.fp8_scales_.allocate(static_cast<size_t>(N), name + " (FP8 scales)");
  // Codes of magnitude <= 1.875 (RMS about 0.7); a scale of 1/sqrt(K) keeps outputs of unit-RMS inputs near unit.
  cuda_check(fill_random_fp8_e4m3(l.fp8_codes_.get(), l.fp8_codes_.size(), seed, nullptr), name + ": fill");
  cuda_check(fill_f32(l.fp8_scales_.get(), l.fp8_scales_.size(),
                      static_cast<float>(1.0 / __builtin_sqrt(static_cast<double>(K))), nullptr),
             name + ": fill scales");
  return l;
}

size_t DeviceLinear::workspace_bytes(int64_t max_rows) const {
  if (kind_ != Kind::Int4) return 0;
  size_t need = 0;
  for (int64_t m = 1; m <= std::min<int64_t>(max_rows, kW4A16MaxM); ++m)
    need = std::max(need, gemm_w4a16_workspace_bytes(static_cast<int>(m), static_cast<int>(N_), static_cast<int>(K_)));
  return need;
}

size_t DeviceLinear::dequant_scratch_bytes() const {
  return kind_ == Kind::Int4 ? static_cast<size_t>(N_ * K_) * sizeof(uint16_t) : 0;
}

bool DeviceLinear::dequant_path(int64_t M, const GemmContext& ctx) const {
  return kind_ == Kind::Int4 && ctx.int4_dequant_min_rows > 0 && M >= ctx.int4_dequant_min_rows;
}

void DeviceLinear::cublas_gemm(const uint16_t* w, const __nv_bfloat16* x, int64_t M, void* y, bool y_f32,
                               const GemmContext& ctx) const {
  // Row-major y[M, N] = x[M, K] · W[N, K]ᵀ is column-major yᵀ[N, M] = W[N, K] (= colmajor K×N, transposed) · xᵀ.
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasGemmEx(
      ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N_), static_cast<int>(M), static_cast<int>(K_), &alpha, w,
      CUDA_R_16BF, static_cast<int>(K_), x, CUDA_R_16BF, static_cast<int>(K_), &beta, y,
      y_f32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(N_), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) fail("CUDA engine: ", name_, ": cuBLAS BF16 GEMM (M ", M, "): status ", int(st));
}

void DeviceLinear::forward_dequant(const __nv_bfloat16* x, int64_t M, __nv_bfloat16* y, const GemmContext& ctx) const {
  check(ctx.dequant_scratch != nullptr && ctx.dequant_scratch_bytes >= dequant_scratch_bytes(), "CUDA engine: ", name_,
        ": the dequantise + cuBLAS path needs ", dequant_scratch_bytes(), " bytes of BF16 scratch, the context has ",
        ctx.dequant_scratch ? ctx.dequant_scratch_bytes : 0);
  auto* w = static_cast<__nv_bfloat16*>(ctx.dequant_scratch);
  const cudaError_t e = int4_dequant_bf16(packed_.get(), scales_.get(), w, static_cast<int>(N_), static_cast<int>(K_),
                                          static_cast<int>(group_), scale_type_, rows_, Int4DequantRows::canonical,
                                          ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": INT4 -> BF16 dequantisation: ",
                             e == cudaErrorInvalidValue ? int4_dequant_last_error() : cudaGetErrorString(e));
  cublas_gemm(reinterpret_cast<const uint16_t*>(w), x, M, y, false, ctx);
}

void DeviceLinear::forward_fp8(const uint8_t* a_codes, const float* a_scales, int64_t M, __nv_bfloat16* y,
                               const GemmContext& ctx) const {
  check(kind_ == Kind::Fp8, name_, ": forward_fp8 needs FP8 weights");
  check(!fp8_swiglu_packed_, name_, ": packed for the FP8 SwiGLU epilogue, so it runs through forward_fp8_swiglu only");
  const cudaError_t e = gemm_fp8(a_codes, fp8_codes_.get(), a_scales, fp8_scales_.get(), y, static_cast<int>(M),
                                 static_cast<int>(N_), static_cast<int>(K_), ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": FP8 GEMM (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_fp8_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_fp8_rope(const uint8_t* a_codes, const float* a_scales, int64_t M, __nv_bfloat16* y,
                                    const float* rope_cos_sin, int rope_heads, const GemmContext& ctx) const {
  check(kind_ == Kind::Fp8 && !fp8_swiglu_packed_, name_, ": forward_fp8_rope needs canonical FP8 weights");
  const cudaError_t e = gemm_fp8_rope(a_codes, fp8_codes_.get(), a_scales, fp8_scales_.get(), y, rope_cos_sin,
                                      rope_heads, static_cast<int>(M), static_cast<int>(N_), static_cast<int>(K_),
                                      ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": FP8 GEMM + RoPE (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_fp8_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_fp8_residual(const uint8_t* a_codes, const float* a_scales, int64_t M, float* residual,
                                        const GemmContext& ctx) const {
  check(kind_ == Kind::Fp8 && !fp8_swiglu_packed_, name_, ": forward_fp8_residual needs canonical FP8 weights");
  const cudaError_t e = gemm_fp8_residual(a_codes, fp8_codes_.get(), a_scales, fp8_scales_.get(), residual,
                                          static_cast<int>(M), static_cast<int>(N_), static_cast<int>(K_), ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": FP8 GEMM + residual (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_fp8_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_fp8_qkv(const uint8_t* a_codes, const float* a_scales, int64_t M,
                                   const cuda::GemmFp8QkvArgs& args, const GemmContext& ctx) const {
  check(kind_ == Kind::Fp8 && !fp8_swiglu_packed_, name_, ": forward_fp8_qkv needs canonical FP8 weights");
  check(N_ == int64_t{args.n_heads + 2 * args.n_kv_heads} * args.head_dim, name_, ": forward_fp8_qkv: ", N_,
        " output rows, expected (n_heads + 2 n_kv_heads) x head_dim");
  const cudaError_t e = cuda::gemm_fp8_qkv(a_codes, fp8_codes_.get(), a_scales, fp8_scales_.get(),
                                           static_cast<int>(M), static_cast<int>(K_), args, ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": FP8 QKV GEMM + attention prologue (M ", M, "): ",
                             e == cudaErrorInvalidValue ? cuda::gemm_fp8_qkv_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_fp8_block_a(const uint8_t* a_codes, const float* a_block_scales, int64_t M,
                                       __nv_bfloat16* y, const GemmContext& ctx) const {
  check(kind_ == Kind::Fp8 && !fp8_swiglu_packed_, name_, ": forward_fp8_block_a needs canonical FP8 weights");
  const cudaError_t e = gemm_fp8_block_a(a_codes, fp8_codes_.get(), a_block_scales, fp8_scales_.get(), y,
                                         static_cast<int>(M), static_cast<int>(N_), static_cast<int>(K_), ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": FP8 GEMM, block-scaled input (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_fp8_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_fp8_block_a_residual(const uint8_t* a_codes, const float* a_block_scales, int64_t M,
                                                float* residual, const GemmContext& ctx) const {
  check(kind_ == Kind::Fp8 && !fp8_swiglu_packed_, name_, ": forward_fp8_block_a_residual needs canonical FP8 weights");
  const cudaError_t e =
      gemm_fp8_block_a_residual(a_codes, fp8_codes_.get(), a_block_scales, fp8_scales_.get(), residual,
                                static_cast<int>(M), static_cast<int>(N_), static_cast<int>(K_), ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": FP8 GEMM, block-scaled input, + residual (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_fp8_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_fp8_swiglu(const uint8_t* a_codes, const float* a_scales, int64_t M, uint8_t* y_codes,
                                      float* y_scales, const GemmContext& ctx) const {
  check(fp8_swiglu_packed(), name_, ": forward_fp8_swiglu needs FP8 gate|up weights packed for it");
  const cudaError_t e = gemm_fp8_swiglu(a_codes, fp8_codes_.get(), a_scales, fp8_scales_.get(), y_codes, y_scales,
                                        static_cast<int>(M), static_cast<int>(N_ / 2), static_cast<int>(K_), ctx.stream);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": FP8 gate|up GEMM + SwiGLU (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_fp8_swiglu_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward(const __nv_bfloat16* x, int64_t M, void* y, bool y_f32, const GemmContext& ctx) const {
  check(kind_ != Kind::Fp8, name_, ": FP8 weights run through forward_fp8");
  if (kind_ == Kind::Int4) {
    check(!y_f32, name_, ": INT4 projections write BF16");
    check(!swiglu_packed(), name_, ": packed SwiGLU-interleaved, so it runs through forward_swiglu only");
    auto* out = static_cast<__nv_bfloat16*>(y);
    if (dequant_path(M, ctx)) {
      forward_dequant(x, M, out, ctx);
      return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += kW4A16MaxM) {
      const int mc = static_cast<int>(std::min<int64_t>(kW4A16MaxM, M - m0));
      const cudaError_t e =
          gemm_w4a16(x + m0 * K_, packed_.get(), scales_.get(), out + m0 * N_, mc, static_cast<int>(N_),
                     static_cast<int>(K_), static_cast<int>(group_), scale_type_, ctx.workspace, ctx.workspace_bytes,
                     ctx.stream);
      if (e != cudaSuccess) fail("CUDA engine: ", name_, ": W4A16 GEMM (M ", mc, "): ",
                                 e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
    }
    return;
  }
  cublas_gemm(bf16_ptr_, x, M, y, y_f32, ctx);
}


void DeviceLinear::forward_residual(const __nv_bfloat16* x, int64_t M, float* residual, __nv_bfloat16* tmp,
                                    const GemmContext& ctx, float* norm_partials) const {
  check(kind_ == Kind::Int4 && !swiglu_packed(), name_, ": forward_residual runs canonically packed INT4 weights");
  check(norm_partials == nullptr || !dequant_path(M, ctx), "CUDA engine: ", name_,
        ": norm partials at M = ", M, " would take the dequantise + cuBLAS path, which does not write them");
  if (dequant_path(M, ctx)) {
    check_tmp(tmp, residual, M * N_, M * N_ * static_cast<int64_t>(sizeof(float)), name_, "forward_residual");
    forward_dequant(x, M, tmp, ctx);
    const cudaError_t e = add_residual_bf16(residual, tmp, static_cast<int>(M), static_cast<int>(N_), ctx.stream);
    if (e != cudaSuccess) fail("CUDA engine: ", name_, ": residual add after the cuBLAS GEMM (M ", M, "): ",
                               e == cudaErrorInvalidValue ? decoder_ops_last_error() : cudaGetErrorString(e));
    return;
  }
  for (int64_t m0 = 0; m0 < M; m0 += kW4A16MaxM) {
    const int mc = static_cast<int>(std::min<int64_t>(kW4A16MaxM, M - m0));
    const cudaError_t e =
        norm_partials
            ? gemm_w4a16_residual_norm_partials(
                  x + m0 * K_, packed_.get(), scales_.get(), residual + m0 * N_,
                  norm_partials + m0 * gemm_w4a16_norm_partials_per_row(static_cast<int>(N_)), mc,
                  static_cast<int>(N_), static_cast<int>(K_), static_cast<int>(group_), scale_type_, ctx.workspace,
                  ctx.workspace_bytes, ctx.stream)
            : gemm_w4a16_residual(x + m0 * K_, packed_.get(), scales_.get(), residual + m0 * N_, mc,
                                  static_cast<int>(N_), static_cast<int>(K_), static_cast<int>(group_), scale_type_,
                                  ctx.workspace, ctx.workspace_bytes, ctx.stream);
    if (e != cudaSuccess) fail("CUDA engine: ", name_, ": W4A16 GEMM + residual (M ", mc, "): ",
                               e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
  }
}

void DeviceLinear::forward_residual_rmsnorm(const __nv_bfloat16* x, int64_t M, float* residual,
                                            const float* norm_weight, float eps, __nv_bfloat16* y,
                                            const GemmContext& ctx) const {
  check(kind_ == Kind::Int4 && !swiglu_packed() && !dequant_path(M, ctx), name_,
        ": forward_residual_rmsnorm runs canonically packed INT4 weights on the W4A16 path");
  for (int64_t m0 = 0; m0 < M; m0 += kW4A16MaxM) {
    const int mc = static_cast<int>(std::min<int64_t>(kW4A16MaxM, M - m0));
    const cudaError_t e = gemm_w4a16_residual_rmsnorm(
        x + m0 * K_, packed_.get(), scales_.get(), residual + m0 * N_, mc, static_cast<int>(N_), static_cast<int>(K_),
        static_cast<int>(group_), scale_type_, norm_weight, eps, y + m0 * N_, ctx.workspace, ctx.workspace_bytes,
        ctx.stream);
    if (e != cudaSuccess) fail("CUDA engine: ", name_, ": W4A16 GEMM + residual + RMSNorm (M ", mc, "): ",
                               e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
  }
}

void DeviceLinear::forward_swiglu(const __nv_bfloat16* x, int64_t M, __nv_bfloat16* h, __nv_bfloat16* tmp,
                                  const GemmContext& ctx) const {
  check(swiglu_packed(), name_, ": forward_swiglu needs INT4 gate|up weights packed SwiGLU-interleaved");
  if (dequant_path(M, ctx)) {
    // Dequantised in canonical row order, so the GEMM writes [gate | up] rows as swiglu_bf16 reads them.
    check_tmp(tmp, h, M * N_, M * (N_ / 2) * 2, name_, "forward_swiglu");
    forward_dequant(x, M, tmp, ctx);
    const cudaError_t e = swiglu_bf16(tmp, h, static_cast<int>(M), static_cast<int>(N_ / 2), ctx.stream);
    if (e != cudaSuccess) fail("CUDA engine: ", name_, ": SwiGLU after the cuBLAS GEMM (M ", M, "): ",
                               e == cudaErrorInvalidValue ? decoder_ops_last_error() : cudaGetErrorString(e));
    return;
  }
  for (int64_t m0 = 0; m0 < M; m0 += kW4A16MaxM) {
    const int mc = static_cast<int>(std::min<int64_t>(kW4A16MaxM, M - m0));
    const cudaError_t e = gemm_w4a16_swiglu(x + m0 * K_, packed_.get(), scales_.get(), h + m0 * (N_ / 2), mc,
                                            static_cast<int>(N_), static_cast<int>(K_), static_cast<int>(group_),
                                            scale_type_, ctx.workspace, ctx.workspace_bytes, ctx.stream);
    if (e != cudaSuccess) fail("CUDA engine: ", name_, ": W4A16 GEMM + SwiGLU (M ", mc, "): ",
                               e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
  }
}

void DeviceLinear::forward_qkv_rope_append(const __nv_bfloat16* x, int64_t M, __nv_bfloat16* qkv,
                                           const QkvRopeAppend& p, const GemmContext& ctx) const {
  check(kind_ == Kind::Int4 && !swiglu_packed(), name_,
        ": forward_qkv_rope_append runs canonically packed INT4 weights");
  check(!dequant_path(M, ctx), "CUDA engine: ", name_, ": forward_qkv_rope_append at M = ", M,
        " would take the dequantise + cuBLAS path, which has no fused prologue; use forward + qkv_rope_kv_append");
  const int64_t q_width = int64_t{p.n_heads} * p.head_dim;
  for (int64_t m0 = 0; m0 < M; m0 += kW4A16MaxM) {
    const int mc = static_cast<int>(std::min<int64_t>(kW4A16MaxM, M - m0));
    const cudaError_t e = gemm_w4a16_qkv_rope_append(
        x + m0 * K_, packed_.get(), scales_.get(), mc, static_cast<int>(K_), static_cast<int>(group_), scale_type_,
        ctx.workspace, ctx.workspace_bytes, p.format, qkv + m0 * N_, p.n_heads, p.n_kv_heads, p.head_dim,
        p.positions + m0, p.inv_freq, p.row_page + m0, p.row_slot + m0, p.key_anchors,
        p.row_anchor ? p.row_anchor + m0 : nullptr, p.kv_pool, p.hadamard_block, p.q_out + m0 * q_width, ctx.stream,
        p.head_counters);
    if (e != cudaSuccess) fail("CUDA engine: ", name_, ": W4A16 GEMM + RoPE + KV append (M ", mc, "): ",
                               e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
  }
}

bool DeviceLinear::every_launch_splits_k(int64_t M, const GemmContext& ctx) const {
  if (kind_ != Kind::Int4 || swiglu_packed() || dequant_path(M, ctx)) return false;
  for (int64_t m0 = 0; m0 < M; m0 += kW4A16MaxM) {
    const int mc = static_cast<int>(std::min<int64_t>(kW4A16MaxM, M - m0));
    if (!gemm_w4a16_splits_k(mc, static_cast<int>(N_), static_cast<int>(K_), static_cast<int>(group_))) return false;
  }
  return true;
}

bool DeviceLinear::qkv_prologue_in_reduce(int64_t M, const GemmContext& ctx) const {
  return every_launch_splits_k(M, ctx);
}

bool DeviceLinear::qkv_prologue_in_tail(int64_t M, const GemmContext& ctx, formats::KvFormat format, int n_heads,
                                        int n_kv_heads, int head_dim) const {
  if (kind_ != Kind::Int4 || swiglu_packed() || dequant_path(M, ctx) || M < 1 || M > kW4A16MaxM) return false;
  return gemm_w4a16_qkv_prologue_in_tail(static_cast<int>(M), static_cast<int>(K_), static_cast<int>(group_),
                                         scale_type_, format, n_heads, n_kv_heads, head_dim);
}

bool DeviceLinear::residual_norm_in_reduce(int64_t M, const GemmContext& ctx) const {
  return N_ <= kW4A16ResidualNormMaxN && every_launch_splits_k(M, ctx);
}

bool DeviceLinear::norm_prologue(int64_t M, const GemmContext& ctx) const {
  if (kind_ != Kind::Int4 || dequant_path(M, ctx) || M < 1 || M > kW4A16NormMaxM) return false;
  return gemm_w4a16_rmsnorm_can_implement(static_cast<int>(M), static_cast<int>(N_), static_cast<int>(K_),
                                          static_cast<int>(group_), scale_type_, nullptr) == cudaSuccess;
}

void DeviceLinear::forward_rmsnorm(const float* x, const float* norm_weight, float eps, int64_t M, __nv_bfloat16* y,
                                   const GemmContext& ctx, const float* norm_partials) const {
  check(!swiglu_packed(), name_, ": packed SwiGLU-interleaved, so it runs through forward_swiglu_rmsnorm only");
  check(norm_prologue(M, ctx), "CUDA engine: ", name_, ": no RMSNorm prologue GEMM for M = ", M);
  const cudaError_t e = gemm_w4a16_rmsnorm(x, norm_weight, eps, packed_.get(), scales_.get(), y, static_cast<int>(M),
                                           static_cast<int>(N_), static_cast<int>(K_), static_cast<int>(group_),
                                           scale_type_, ctx.workspace, ctx.workspace_bytes, ctx.stream, norm_partials);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": RMSNorm + W4A16 GEMM (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_swiglu_rmsnorm(const float* x, const float* norm_weight, float eps, int64_t M,
                                          __nv_bfloat16* h, const GemmContext& ctx, const float* norm_partials) const {
  check(swiglu_packed(), name_, ": forward_swiglu_rmsnorm needs INT4 gate|up weights packed SwiGLU-interleaved");
  check(norm_prologue(M, ctx), "CUDA engine: ", name_, ": no RMSNorm prologue GEMM for M = ", M);
  const cudaError_t e = gemm_w4a16_rmsnorm_swiglu(x, norm_weight, eps, packed_.get(), scales_.get(), h,
                                                  static_cast<int>(M), static_cast<int>(N_), static_cast<int>(K_),
                                                  static_cast<int>(group_), scale_type_, ctx.workspace,
                                                  ctx.workspace_bytes, ctx.stream, norm_partials);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": RMSNorm + W4A16 GEMM + SwiGLU (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
}

void DeviceLinear::forward_qkv_rope_append_rmsnorm(const float* x, const float* norm_weight, float eps, int64_t M,
                                                   __nv_bfloat16* qkv, const QkvRopeAppend& p, const GemmContext& ctx,
                                                   const float* norm_partials) const {
  check(!swiglu_packed(), name_, ": forward_qkv_rope_append_rmsnorm runs canonically packed INT4 weights");
  check(norm_prologue(M, ctx), "CUDA engine: ", name_, ": no RMSNorm prologue GEMM for M = ", M);
  const cudaError_t e = gemm_w4a16_rmsnorm_qkv_rope_append(
      x, norm_weight, eps, packed_.get(), scales_.get(), static_cast<int>(M), static_cast<int>(K_),
      static_cast<int>(group_), scale_type_, ctx.workspace, ctx.workspace_bytes, p.format, qkv, p.n_heads,
      p.n_kv_heads, p.head_dim, p.positions, p.inv_freq, p.row_page, p.row_slot, p.key_anchors, p.row_anchor,
      p.kv_pool, p.hadamard_block, p.q_out, ctx.stream, norm_partials);
  if (e != cudaSuccess) fail("CUDA engine: ", name_, ": RMSNorm + W4A16 GEMM + RoPE + KV append (M ", M, "): ",
                             e == cudaErrorInvalidValue ? gemm_w4a16_last_error() : cudaGetErrorString(e));
}

}  // namespace futransformer::cuda
