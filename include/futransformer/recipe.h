// A precision recipe: which low-precision format each part of the model runs in. The reference engine runs any
// combination (it stores quantised weights dequantised, rounds activations and encodes/decodes the KV cache exactly
// as the formats define), so each recipe's quality cost can be measured on the CPU.
//
// Text form (CLI `--configs`, report rows, JSON), parts joined by '+', in any order on input:
//   weights:      full | fp8 | int4-rtn-g<G> | int4-gptq-g<G>       (G: 32, 64, 128 or "ch" for per-channel;
//                 optional suffixes "-asym" (asymmetric groups) then "-bf16" (BF16 scales); default symmetric F16)
//                                                                    (optional; "full" otherwise)
//   activations:  act-fp8 | act-bf16 | act-fp8-bf16 | act-fp8-block-bf16   (optional; fp32 otherwise)
//                 act-fp8: every projection's input quantised to FP8 per token (the FP8 prefill GEMMs' operand).
//                 act-bf16: every projection's input and output, q and k after RoPE, and the LM head's input rounded
//                 to BF16 — what the CUDA engine's kernels exchange (its residual stream stays fp32), so the CPU
//                 reference can run exactly the GPU's recipe and measure what BF16 activations cost.
//                 act-fp8-bf16: act-bf16's rounding points, but every projection's input is quantised to FP8 per token
//                 instead (of its fp32 value; o_proj's of the BF16-rounded attention output) — exactly what the CUDA
//                 engine's FP8 prefill passes compute (docs/design.md "FP8 prefill").
//                 act-fp8-block-bf16: act-fp8-bf16, except that the down projection's input (the SwiGLU output) is
//                 quantised with one FP8 scale per token per 128 channels (fp8_quantize_per_token_block) — what a
//                 SwiGLU fused into the gate|up GEMM's epilogue can emit, as a tile sees 128 channels of a row, not
//                 the whole row. Needs an intermediate size that is a multiple of 128 (the engine refuses others).
//   KV cache:     kv-bf16 | kv-fp8 | kv-int4 | kv-int4-hadamard      (optional; fp32 otherwise)
//   LM head:      head-int4                                           (optional; the checkpoint's precision otherwise)
//                 head-int4: the LM head weight is INT4 round-to-nearest, symmetric, BF16 scales, group
//                 head_int4_spec(hidden_size) — the projections' Int4Weight format, run by the W4A16 GEMM on the GPU
//                 (which writes BF16 logits). A tied head gets its own quantised copy; the embedding lookup stays
//                 full precision.
// e.g. "full", "fp8+act-fp8", "int4-gptq-g128+kv-int4-hadamard", "int4-gptq-g128+head-int4+act-bf16". name() writes
// weights, head, activations, KV in this order and always names the weights. Parse errors name the part and list
// the choices.
// Rejected combinations (each with the reason): two parts of one kind (two weight formats, act-fp8 twice, two KV
// formats); a group size or option on fp8 ("fp8-g128"); int4 without quantiser or group ("int4", "int4-rtn").
// Every combination of one weight format, one activation format and one KV format runs on the reference engine.
// On the GPU, FP8 activations feed only the FP8 x FP8 prefill GEMMs, so act-fp8 with full or INT4 weights is a
// what-if of the activation rounding alone (the CPU measures it; no GPU path runs it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "futransformer/formats/int4.h"
#include "futransformer/formats/kv_cache.h"

namespace futransformer {

enum class WeightFormat : uint8_t { Full, Fp8, Int4Rtn, Int4Gptq };
enum class ActivationFormat : uint8_t { Fp32, Fp8PerToken, Bf16, Fp8OverBf16, Fp8BlockOverBf16 };
enum class HeadFormat : uint8_t { Full, Int4 };

struct PrecisionRecipe {
  WeightFormat weights = WeightFormat::Full;
  formats::Int4Spec int4;                       // used by the INT4 weight formats (symmetric, F16 scales by default)
  ActivationFormat activations = ActivationFormat::Fp32;
  std::optional<formats::KvFormat> kv;          // nullopt: fp32 cache
  HeadFormat head = HeadFormat::Full;           // Int4: "head-int4" (INT4 RTN LM head, head_int4_spec)

  std::string name() const;                     // canonical text form (round-trips through parse)
  static PrecisionRecipe parse(std::string_view text);
  bool is_full_precision() const {
    return weights == WeightFormat::Full && activations == ActivationFormat::Fp32 && !kv && head == HeadFormat::Full;
  }
  // True when quantising the model changes a weight: the projections' format is not full, or the head is INT4.
  bool quantises_weights() const { return weights != WeightFormat::Full || head != HeadFormat::Full; }
};

// The tensor name of the LM head ([vocab, hidden]); a head-int4 quantisation of a tied model adds it.
inline constexpr const char* kLmHeadTensor = "lm_head.weight";

// The INT4 format of a head-int4 LM head whose input size is hidden_size: symmetric, BF16 scales (fp32's exponent
// range, so no head row's scale underflows or overflows whatever the checkpoint's magnitudes), group the largest of
// 128, 64, 32 that divides hidden_size — the groups the W4A16 GEMM runs. The head is always quantised round-to-
// nearest (also under int4-gptq weights). Throws Error naming `what` when no group divides hidden_size.
formats::Int4Spec head_int4_spec(int64_t hidden_size, const std::string& what);

// Which projections a recipe's weight format quantises: every q/k/v/o/gate/up/down projection of every layer.
// Embeddings and norms stay in the checkpoint's precision; the LM head too unless the recipe has head-int4 (see
// docs/formats.md).
bool is_quantised_projection(const std::string& tensor_name);

}  // namespace futransformer
