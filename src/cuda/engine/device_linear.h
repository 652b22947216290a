// One projection (or several fused along N) held on the GPU in the layout its GEMM reads: INT4 repacked for the
// W4A16 kernel, or BF16 row-major [N, K] for cuBLAS — y[M, N] = x[M, K] · Wᵀ with BF16 x (forward) — or FP8 E4M3
// codes [N, K] with one fp32 scale per output channel for gemm_fp8, whose input is per-token FP8 (forward_fp8).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda/engine/device_memory.h"
#include "futransformer/cuda/gemm_fp8_qkv.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/int4.h"
#include "futransformer/formats/int4_mma.h"
#include "futransformer/formats/kv_cache.h"

struct __nv_bfloat16;

namespace futransformer::cuda {

struct GemmContext {
  cublasHandle_t cublas = nullptr;  // bound to `stream`, with its own workspace set
  void* workspace = nullptr;        // W4A16 split-K scratch
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  // INT4 weights at M >= int4_dequant_min_rows (0: never) run as int4_dequant_bf16 into dequant_scratch (16-byte
  // aligned, at least the weight's dequant_scratch_bytes()) followed by the cuBLAS BF16 GEMM.
  int64_t int4_dequant_min_rows = 0;
  void* dequant_scratch = nullptr;
  size_t dequant_scratch_bytes = 0;
};

// The qkv_rope_kv_append arguments of DeviceLinear::forward_qkv_rope_append (futransformer/cuda/fused_ops.h), for
// all M rows: positions, row_page, row_slot, row_anchor and q_out start at row 0.
struct QkvRopeAppend {
  formats::KvFormat format = formats::KvFormat::BF16;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  const int32_t* row_page = nullptr;
  const int32_t* row_slot = nullptr;
  const uint16_t* key_anchors = nullptr;  // int4-hadamard only
  const int32_t* row_anchor = nullptr;    // int4-hadamard only
  uint8_t* kv_pool = nullptr;
  int hadamard_block = 0;
  __nv_bfloat16* q_out = nullptr;  // [M, n_heads, head_dim]
  // Zeroed counters for the prologue in the unsplit GEMM's tail (gemm_w4a16_qkv_rope_append's head_counters), or
  // nullptr for the kernel after the GEMM.
  uint32_t* head_counters = nullptr;
};

class DeviceLinear {
 public:
  enum class Kind { Int4, Bf16, Fp8 };

  DeviceLinear() = default;
  // The parts' rows concatenated in order (same K, group and scale type; symmetric). Throws Error naming `name`
  // when the W4A16 kernel cannot run the fused shape. rows = swiglu_interleaved: the parts are gate and up (equal
  // row counts), packed for forward_swiglu, which is then the only way to run this weight.
  static DeviceLinear from_int4(std::span<const formats::Int4Weight* const> parts, const std::string& name,
                                formats::Int4MmaRows rows = formats::Int4MmaRows::canonical);
  // BF16 bit patterns, row-major [N, K].
  static DeviceLinear from_bf16(const std::vector<uint16_t>& w, int64_t N, int64_t K, const std::string& name);
  // Another linear's BF16 storage (the tied LM head reads the embedding); `source` must outlive this.
  static DeviceLinear borrow_bf16(const uint16_t* device_w, int64_t N, int64_t K, const std::string& name);
  // Per-channel FP8 weights (formats::fp8_quantize_weight: block == cols), the parts' rows concatenated in order
  // (same K). Throws Error naming `name` when a part is not per-channel or gemm_fp8 cannot run the fused shape
  // (K % 128, N % 8).
  // swiglu_pack: a [gate; up] weight stored in gemm_fp8_swiglu's packed row order (futransformer/cuda/
  // gemm_fp8_swiglu.h) for forward_fp8_swiglu, which then is its only forward; the intermediate size (N / 2) must be a
  // multiple of 128 (Error naming `name` otherwise).
  static DeviceLinear from_fp8(std::span<const formats::Fp8Matrix* const> parts, const std::string& name,
                               bool swiglu_pack = false);
  // Random weights generated on the device (INT4: F16 scales unless scale_type says BF16; rows as from_int4's, which
  // for random values only decides which forward runs the weight).
  static DeviceLinear synthetic_int4(int64_t N, int64_t K, int64_t group, uint64_t seed, const std::string& name,
                                     formats::ScaleType scale_type = formats::ScaleType::F16,
                                     formats::Int4MmaRows rows = formats::Int4MmaRows::canonical);
  static DeviceLinear synthetic_bf16(int64_t N, int64_t K, uint64_t seed, const std::string& name);
  static DeviceLinear synthetic_fp8(int64_t N, int64_t K, uint64_t seed, const std::string& name,
                                    bool swiglu_pack = false);
  // Empty reason when gemm_fp8 runs an [N, K] weight (any M), else the sentence saying why. Needs no device.
  static std::string fp8_shape_problem(int64_t N, int64_t K);

  Kind kind() const { return kind_; }
  // INT4 weights packed for forward_swiglu (gate|up rows interleaved).
  bool swiglu_packed() const { return kind_ == Kind::Int4 && rows_ == formats::Int4MmaRows::swiglu_interleaved; }
  // FP8 [gate; up] weights in gemm_fp8_swiglu's packed row order (from_fp8 / synthetic_fp8 with swiglu_pack).
  bool fp8_swiglu_packed() const { return kind_ == Kind::Fp8 && fp8_swiglu_packed_; }
  // The packed INT4 weight (null unless INT4) and its bytes: what the W4A16 GEMM streams, for l2_prefetch_stripes.
  const void* int4_packed() const { return kind_ == Kind::Int4 ? packed_.get() : nullptr; }
  int64_t int4_packed_bytes() const { return kind_ == Kind::Int4 ? static_cast<int64_t>(packed_.bytes()) : 0; }
  int64_t out_features() const { return N_; }
  int64_t in_features() const { return K_; }
  int64_t device_bytes() const {
    return static_cast<int64_t>(packed_.bytes() + scales_.bytes() + bf16_.bytes() + fp8_codes_.bytes() +
                                fp8_scales_.bytes());
  }
  // Split-K scratch the forward needs for any M up to max_rows.
  size_t workspace_bytes(int64_t max_rows) const;
  // Bytes of the BF16 [N, K] copy the large-M INT4 path dequantises into (GemmContext::dequant_scratch); 0 unless INT4.
  size_t dequant_scratch_bytes() const;
  // Whether M rows run as dequantise + cuBLAS under ctx (INT4 weights, M >= ctx.int4_dequant_min_rows > 0). That
  // path rounds every weight to BF16 once (relative error <= 2^-9; docs/kernels.md "INT4 → BF16 dequantisation")
  // where the W4A16 GEMM multiplies the exact (u - 8) * s, so its outputs differ from the decode path's by that much.
  bool dequant_path(int64_t M, const GemmContext& ctx) const;
  // y: BF16 [M, N], or fp32 when y_f32 (BF16 weights only). M >= 1; any M (INT4 runs 64 rows per W4A16 launch, or
  // one dequantise + cuBLAS GEMM when dequant_path).
  void forward(const __nv_bfloat16* x, int64_t M, void* y, bool y_f32, const GemmContext& ctx) const;
  // INT4 weights with the W4A16 GEMM's fused epilogues (cuda/gemm_w4a16.h), bit for bit forward + the separate op:
  // residual[M, N] (fp32, 16-byte aligned) += float(bf16(y)) (any canonical INT4 weight), and
  // h[M, N / 2] = bf16(silu(gate) * up) for a gate|up weight packed swiglu_interleaved (h 8-byte aligned).
  // When dequant_path(M, ctx) there is no fused epilogue: the GEMM writes BF16 [M, N] into tmp (16-byte aligned, not
  // overlapping the output; unused otherwise and then may be null) — gate|up dequantised in canonical [gate | up] row
  // order — and add_residual_bf16 / swiglu_bf16 follow: again forward + the separate op, bit for bit.
  // norm_partials (not on the dequantise path, which throws Error then): the updated rows' RMSNorm partials as well,
  // [M, gemm_w4a16_norm_partials_per_row(N)] fp32 (gemm_w4a16_residual_norm_partials), for a norm-prologue GEMM next.
  void forward_residual(const __nv_bfloat16* x, int64_t M, float* residual, __nv_bfloat16* tmp,
                        const GemmContext& ctx, float* norm_partials = nullptr) const;
  // forward_residual, then y = rmsnorm_bf16(residual, norm_weight, eps) of the M rows (BF16 [M, N]): through
  // gemm_w4a16_residual_rmsnorm (the split-K reduce, the residual add and the norm in one kernel where K is split;
  // same bits). Not on the dequantise path (Error: the caller keeps its two ops there).
  void forward_residual_rmsnorm(const __nv_bfloat16* x, int64_t M, float* residual, const float* norm_weight,
                                float eps, __nv_bfloat16* y, const GemmContext& ctx) const;
  void forward_swiglu(const __nv_bfloat16* x, int64_t M, __nv_bfloat16* h, __nv_bfloat16* tmp,
                      const GemmContext& ctx) const;
  // Canonically packed INT4 [q | k | v] weights (N = (n_heads + 2 n_kv_heads) * head_dim): forward into qkv (BF16
  // [M, N]) followed by qkv_rope_kv_append with p, one gemm_w4a16_qkv_rope_append per 64 rows — bit for bit
  // forward + qkv_rope_kv_append, qkv included. Not on the dequantise + cuBLAS path (dequant_path(M, ctx)): Error.
  void forward_qkv_rope_append(const __nv_bfloat16* x, int64_t M, __nv_bfloat16* qkv, const QkvRopeAppend& p,
                               const GemmContext& ctx) const;
  // Whether forward_qkv_rope_append runs the prologue inside the GEMM's split-K reduce for every one of its 64-row
  // launches (gemm_w4a16_splits_k), i.e. saves a kernel per launch over forward + qkv_rope_kv_append.
  bool qkv_prologue_in_reduce(int64_t M, const GemmContext& ctx) const;
  // Whether forward_qkv_rope_append with p.head_counters runs the prologue in the unsplit GEMM's own tail
  // (gemm_w4a16_qkv_prologue_in_tail: M <= 8, INT4 / int4-hadamard cache at head_dim 128): no kernel after the GEMM.
  bool qkv_prologue_in_tail(int64_t M, const GemmContext& ctx, formats::KvFormat format, int n_heads, int n_kv_heads,
                            int head_dim) const;
  // Whether forward_residual_rmsnorm runs the norm inside the split-K reduce for every one of its launches: INT4 on
  // the W4A16 path, canonically packed, N <= kW4A16ResidualNormMaxN, and every launch splits K.
  bool residual_norm_in_reduce(int64_t M, const GemmContext& ctx) const;
  // The RMSNorm before this projection run inside its W4A16 GEMM (gemm_w4a16_rmsnorm*, futransformer/cuda/
  // gemm_w4a16.h): x is fp32 [M, K] (the residual stream), norm_weight fp32 [K], both 16-byte aligned. Bit for bit
  // rmsnorm_bf16(x, norm_weight, ·, M, K, eps) followed by forward / forward_swiglu / forward_qkv_rope_append on its
  // output. Only where norm_prologue(M, ctx) holds; otherwise Error. norm_partials: x's partials from the
  // forward_residual that wrote it (same bits, no row sums in the GEMM), or nullptr.
  // Whether these can run M rows: INT4, not the dequantise + cuBLAS path, M <= 8 and gemm_w4a16_rmsnorm_can_implement.
  bool norm_prologue(int64_t M, const GemmContext& ctx) const;
  void forward_rmsnorm(const float* x, const float* norm_weight, float eps, int64_t M, __nv_bfloat16* y,
                       const GemmContext& ctx, const float* norm_partials = nullptr) const;
  void forward_swiglu_rmsnorm(const float* x, const float* norm_weight, float eps, int64_t M, __nv_bfloat16* h,
                              const GemmContext& ctx, const float* norm_partials = nullptr) const;
  void forward_qkv_rope_append_rmsnorm(const float* x, const float* norm_weight, float eps, int64_t M,
                                       __nv_bfloat16* qkv, const QkvRopeAppend& p, const GemmContext& ctx,
                                       const float* norm_partials = nullptr) const;
  // FP8 weights only: y BF16 [M, N] = (a_codes[M, K] · codesᵀ) · a_scales[m] · scales[n] (gemm_fp8), where a_codes /
  // a_scales are per-token FP8 (cuda/fp8_producers.h). Throws Error naming the projection when the GEMM refuses.
  void forward_fp8(const uint8_t* a_codes, const float* a_scales, int64_t M, __nv_bfloat16* y,
                   const GemmContext& ctx) const;
  // FP8 qkv weights at head_dim 128: forward_fp8 with RoPE on the first rope_heads heads of y in the GEMM's epilogue
  // (gemm_fp8_rope; bit for bit forward_fp8 + rope_qk_bf16), rope_cos_sin the pass's table (rope_cos_sin_table).
  void forward_fp8_rope(const uint8_t* a_codes, const float* a_scales, int64_t M, __nv_bfloat16* y,
                        const float* rope_cos_sin, int rope_heads, const GemmContext& ctx) const;
  // FP8 weights only: residual fp32 [M, N] += the BF16-rounded forward_fp8 result, in the GEMM's epilogue
  // (gemm_fp8_residual; bit-identical to forward_fp8 + add_residual_bf16).
  void forward_fp8_residual(const uint8_t* a_codes, const float* a_scales, int64_t M, float* residual,
                            const GemmContext& ctx) const;
  // FP8 weights, A scaled per token per 128-deep K block (a_block_scales [M, ceil(K / 128)], the output of
  // swiglu_fp8_block / forward_fp8_swiglu): gemm_fp8_block_a into BF16 y, or into the residual stream
  // (gemm_fp8_block_a_residual, bit-identical to the BF16 store + add_residual_bf16).
  void forward_fp8_block_a(const uint8_t* a_codes, const float* a_block_scales, int64_t M, __nv_bfloat16* y,
                           const GemmContext& ctx) const;
  void forward_fp8_block_a_residual(const uint8_t* a_codes, const float* a_block_scales, int64_t M, float* residual,
                                    const GemmContext& ctx) const;
  // FP8 qkv weights (N = (n_heads + 2 n_kv_heads) · 128): the GEMM with the attention prologue in its epilogue
  // (gemm_fp8_qkv: RoPE, q rotation into args.q_out, INT4 cache placement of v and of k or the RoPE'd BF16 keys into
  // args.qkv_keys; bit for bit forward_fp8 + rope_qk_bf16 + kv_append_rotate_q). Throws Error naming the projection
  // when the GEMM refuses.
  void forward_fp8_qkv(const uint8_t* a_codes, const float* a_scales, int64_t M, const cuda::GemmFp8QkvArgs& args,
                       const GemmContext& ctx) const;
  // A gate|up weight packed for it (fp8_swiglu_packed): y = silu(gate) · up of the BF16 GEMM outputs, quantised per
  // token per 128 channels into y_codes [M, N / 2] and y_scales [M, N / 256] (gemm_fp8_swiglu; bit for bit
  // forward_fp8 on the canonical weight + swiglu_fp8_block). y_codes must not overlap a_codes.
  void forward_fp8_swiglu(const uint8_t* a_codes, const float* a_scales, int64_t M, uint8_t* y_codes, float* y_scales,
                          const GemmContext& ctx) const;

 private:
  // Canonically packed INT4 on the W4A16 path, and every one of the kW4A16MaxM-row launches of M rows splits K
  // (gemm_w4a16_splits_k): where a split-K reduce kernel runs and can take an epilogue.
  bool every_launch_splits_k(int64_t M, const GemmContext& ctx) const;
  // y[M, N] (BF16) = x · bf16(W)ᵀ through int4_dequant_bf16 and cuBLAS; columns in canonical row order (gate|up
  // packed interleaved gives [gate | up], as swiglu_bf16 reads them).
  void forward_dequant(const __nv_bfloat16* x, int64_t M, __nv_bfloat16* y, const GemmContext& ctx) const;
  // cuBLAS BF16 GEMM y[M, N] = x[M, K] · w[N, K]ᵀ, fp32 accumulation.
  void cublas_gemm(const uint16_t* w, const __nv_bfloat16* x, int64_t M, void* y, bool y_f32,
                   const GemmContext& ctx) const;

  Kind kind_ = Kind::Bf16;
  std::string name_;
  int64_t N_ = 0, K_ = 0, group_ = 0;
  formats::ScaleType scale_type_ = formats::ScaleType::F16;
  formats::Int4MmaRows rows_ = formats::Int4MmaRows::canonical;
  DeviceArray<uint32_t> packed_;
  DeviceArray<uint16_t> scales_;
  DeviceArray<uint16_t> bf16_;
  DeviceArray<uint8_t> fp8_codes_;  // E4M3 [N, K]
  DeviceArray<float> fp8_scales_;   // [N]
  bool fp8_swiglu_packed_ = false;  // fp8 rows in gemm_fp8_swiglu's packed order
  const uint16_t* bf16_ptr_ = nullptr;  // bf16_ or a borrowed buffer
};

}  // namespace futransformer::cuda
