#include "futransformer/cuda_engine.h"
#include "futransformer/error.h"

namespace futransformer {

CudaEngineOptions cuda_engine_options(const PrecisionRecipe& recipe, CudaEngineOptions base) {
  check(recipe.weights != WeightFormat::Fp8, "recipe ", recipe.name(), ": FP8 weights run only as the FP8 prefill ",
        "copy beside a decode recipe (make_cuda_engine(decode, prefill)), which the CLI does not offer yet; use full or ",
        "int4 weights on --device cuda");
  // The GPU's GEMMs exchange BF16: an fp32 recipe runs as act-bf16 there (the CPU measures what that costs).
  check(recipe.activations != ActivationFormat::Fp8PerToken && recipe.activations != ActivationFormat::Fp8OverBf16 &&
            recipe.activations != ActivationFormat::Fp8BlockOverBf16,
        "recipe ", recipe.name(), ": FP8 activations feed only the FP8 prefill GEMMs (make_cuda_engine with a prefill ",
        "model); the CUDA engine's decode path runs BF16 activations (act-bf16)");
  check(!recipe.kv || *recipe.kv != formats::KvFormat::FP8, "recipe ", recipe.name(), ": the GPU attention kernels ",
        "do not read an fp8 KV cache; use kv-bf16, kv-int4 or kv-int4-hadamard");
  check(recipe.weights == WeightFormat::Full || recipe.int4.symmetric, "recipe ", recipe.name(), ": the W4A16 GEMM ",
        "runs symmetric INT4 only");
  // No KV part means an fp32 cache on the reference engine; the GPU keeps BF16, its narrowest lossless-enough form.
  base.kv = recipe.kv.value_or(formats::KvFormat::BF16);
  base.synthetic_int4_head = recipe.head == HeadFormat::Int4;
  return base;
}

}  // namespace futransformer
