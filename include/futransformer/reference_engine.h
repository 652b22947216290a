// The CPU reference engine: the standard Llama forward pass in plain fp32 math, the oracle the GPU engine is
// checked against. Weights are converted to fp32 once at construction. Low-precision weights arrive already
// dequantised in the Model (quant/quantize_model.h); low-precision activations and KV caches are options here, and
// the engine rounds them exactly as formats/ defines.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "futransformer/engine.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "futransformer/recipe.h"

namespace futransformer {

struct ReferenceOptions {
  int64_t max_sequence_length = 0;  // 0: config.max_position_embeddings
  // Fp8PerToken: the input of every q/k/v/o/gate/up/down projection is quantised to FP8 E4M3 per token and
  // dequantised before the product (the LM head keeps fp32 inputs). Bf16: every projection's input and output,
  // q and k after RoPE and the LM head's input are rounded to BF16, as the CUDA engine's kernels exchange them.
  // Fp8OverBf16 (the CUDA engine's FP8 prefill): Bf16's output rounding, and every projection's input quantised to
  // FP8 per token as Fp8PerToken does — o_proj's after rounding the attention output to BF16. Fp8BlockOverBf16:
  // Fp8OverBf16, but down_proj's input (the SwiGLU output) has one FP8 scale per token per 128 channels
  // (formats::fp8_quantize_per_token_block), as a SwiGLU fused into the gate|up GEMM's epilogue writes it; the
  // engine refuses a model whose intermediate_size is not a multiple of 128.
  ActivationFormat activations = ActivationFormat::Fp32;
  // The KV-cache format (nullopt: fp32). Keys and values are stored as the canonical paged bytes and attention
  // reads their decoded values; for int4-hadamard queries are rotated and outputs un-rotated (formats/kv_cache.h).
  std::optional<formats::KvFormat> kv;
  // Int4 (recipe part head-int4): the model's lm_head.weight holds the dequantised INT4 head (quant::quantize_model
  // puts it there, for a tied model too) and the head reads it even when tie_word_embeddings says the embedding is
  // the head; under Bf16 / Fp8OverBf16 / Fp8BlockOverBf16 its logits are rounded to BF16, as the CUDA engine's
  // W4A16 GEMM writes them. The engine cannot tell dequantised values from full ones: run it on
  // quant::quantize_model's output (or a loaded quantised checkpoint) of a head-int4 recipe. A tied model without
  // lm_head.weight is an Error.
  HeadFormat head = HeadFormat::Full;
};

// Validates the model (Model::validate) and copies its weights as fp32; the engine does not keep `model`.
// Throws Error on an invalid model, a negative max_sequence_length, or a KV format that cannot hold the model's
// head_dim (e.g. int4 needs a multiple of 32).
std::unique_ptr<Engine> make_reference_engine(const Model& model, const ReferenceOptions& options = {});

// Two models over one KV cache per sequence — what the CUDA engine does with FP8 prefill (docs/design.md): every
// chunk of more than one token (a prompt, or a prompt's continuation) runs through `prefill_model` with
// `prefill_options`' activation format, every single-token chunk (a decode step; also a one-token prompt) through
// `decode_model` with `decode_options`', and both append to and attend over the same per-sequence caches. The
// routing is per chunk, so one batch may mix both kinds. Each model's own embedding, norms and LM head serve its
// chunks (quantisations of one checkpoint share them).
// With identical models and options it computes exactly what make_reference_engine does for the same batches.
// Throws Error (besides make_reference_engine's reasons) when the two configs differ in anything the forward pass
// reads (naming the field), the KV-cache formats or the LM-head formats differ, or the two options allow different
// sequence lengths.
std::unique_ptr<Engine> make_prefill_decode_reference_engine(const Model& prefill_model,
                                                             const ReferenceOptions& prefill_options,
                                                             const Model& decode_model,
                                                             const ReferenceOptions& decode_options);

}  // namespace futransformer
