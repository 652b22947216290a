// `futransformer info`: what a checkpoint is (config, parameter count, tensor summary).
#include <cstdio>
#include <map>
#include <optional>
#include <memory>
#include <regex>
#include <string>

#include "cli/commands.h"
#include "futransformer/error.h"
#include "futransformer/eval/report.h"
#include "futransformer/recipe.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/tokenizer.h"

namespace futransformer::cli {
namespace {

struct InfoArgs {
  std::string model;
  std::string tokenizer;
  bool all_tensors = false;
};

// Per-layer tensors differ only in the layer index: show each distinct (name pattern, dtype, shape) once.
void print_tensor_summary(const Model& model, bool all) {
  struct Row {
    std::string dtype, shape;
    int64_t count = 0, numel = 0;
  };
  std::map<std::string, Row> rows;
  const std::regex layer_index(R"(^model\.layers\.\d+\.)");
  for (const auto& [name, t] : model.tensors) {
    const std::string key = all ? name : std::regex_replace(name, layer_index, "model.layers.{i}.");
    Row& r = rows[key + "|" + dtype_name(t.dtype) + "|" + t.shape_str()];
    r.dtype = dtype_name(t.dtype);
    r.shape = t.shape_str();
    r.count += 1;
    r.numel += t.numel();
  }
  std::printf("%-48s %-5s %-16s %6s %12s\n", "tensor", "dtype", "shape", "count", "parameters");
  for (const auto& [key, r] : rows) {
    const std::string name = key.substr(0, key.find('|'));
    std::printf("%-48s %-5s %-16s %6lld %12lld\n", name.c_str(), r.dtype.c_str(), r.shape.c_str(),
                static_cast<long long>(r.count), static_cast<long long>(r.numel));
  }
}

void print_quantization(const quant::QuantizedModel& q) {
  const nlohmann::json& j = q.recipe_json;
  std::printf("recipe:                   %s\n", q.recipe.name().c_str());
  if (j.contains("weights")) std::printf("weights:                  %s\n", j["weights"].dump().c_str());
  std::printf("activations / KV cache:   %s / %s\n",
              q.recipe.activations == ActivationFormat::Fp8PerToken ? "fp8 per token"
              : q.recipe.activations == ActivationFormat::Bf16     ? "bf16"
              : q.recipe.activations == ActivationFormat::Fp8OverBf16 ? "fp8 per token over bf16"
              : q.recipe.activations == ActivationFormat::Fp8BlockOverBf16
                  ? "fp8 per token (down: per token per 128 channels) over bf16"
                                                                   : "fp32",
              q.recipe.kv ? formats::kv_format_name(*q.recipe.kv) : "fp32");
  if (q.recipe.head == HeadFormat::Int4) {
    const auto it = q.int4.find(kLmHeadTensor);
    std::printf("LM head:                  INT4 RTN, symmetric, BF16 scales, group %lld\n",
                static_cast<long long>(it == q.int4.end() ? 0 : it->second.group));
  }
  const auto gptq = j.find("gptq");
  if (gptq != j.end() && gptq->is_object()) {
    const nlohmann::json g = *gptq;
    nlohmann::json settings = g;
    settings.erase("layers");
    std::printf("gptq:                     %s\n", settings.dump().c_str());
  }
}

// What the CUDA engine would hold on the GPU for one sequence at its default context (eval::estimate_gpu_memory, the
// arithmetic the report's fit check uses), and the extra FP8 weight copy that FP8 prefill keeps beside the INT4 one.
void print_cuda_memory(const ModelConfig& c) {
  const int64_t ctx = std::min<int64_t>(c.max_position_embeddings, 4096);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::printf("CUDA engine GPU memory (1 sequence of %lld tokens; weights + KV cache + buffers):\n",
              static_cast<long long>(ctx));
  const int64_t group = eval::int4_group_for(c);
  std::vector<std::string> recipes = {"full+kv-bf16"};
  if (group > 0) {
    recipes.push_back("int4-gptq-g" + std::to_string(group) + "+kv-int4-hadamard");
    recipes.push_back("int4-gptq-g" + std::to_string(group) + "+head-int4+kv-int4-hadamard");
  }
  for (const std::string& name : recipes) {
    const PrecisionRecipe r = PrecisionRecipe::parse(name);
    const std::string why = eval::recipe_model_mismatch(c, r);
    if (!why.empty()) {
      std::printf("  %-36s n/a: %s\n", name.c_str(), why.c_str());
      continue;
    }
    const eval::GpuMemoryEstimate m = eval::estimate_gpu_memory(c, r, 1, ctx);
    std::printf("  %-36s %.2f GiB (weights %.2f, KV %.2f", name.c_str(), m.total() / gib, m.weights / gib,
                m.kv_cache / gib);
    // Passes of >= FT_INT4_DEQUANT_MIN_ROWS (default 192) rows dequantise each INT4 projection into one BF16 buffer.
    if (m.int4_dequant_scratch > 0) std::printf(", INT4 prefill dequant scratch %.2f", m.int4_dequant_scratch / gib);
    std::printf(")\n");
  }
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t fp8_bytes = eval::fp8_prefill_copy_bytes(c);
  // gemm_fp8's shape rule (cuda/gemm_fp8.h, not included here so that info builds without CUDA): every K a
  // multiple of 16 (TMA row strides), every N a multiple of 8.
  const bool fp8_ok = h % 16 == 0 && q % 16 == 0 && c.intermediate_size % 16 == 0 && (q + 2 * kv) % 8 == 0 &&
                      h % 8 == 0 && (2 * c.intermediate_size) % 8 == 0;
  std::printf("  %-36s %.2f GiB%s\n", "+ FP8 prefill weight copy", fp8_bytes / gib,
              fp8_ok ? "" : " (the FP8 GEMM needs every K a multiple of 16 and N of 8: this model would prefill on INT4)");
}

int run_info(const InfoArgs& a) {
  std::optional<quant::QuantizedModel> quantized;
  if (quant::is_quantized_checkpoint(a.model)) quantized = quant::load_quantized_checkpoint(a.model);
  const Model model = quantized ? quantized->model : load_model(a.model);
  const ModelConfig& c = model.config;
  std::printf("model:                    %s\n", model.source.c_str());
  std::printf("format:                   %s\n", model.format.c_str());
  if (quantized) print_quantization(*quantized);
  std::printf("hidden_size:              %lld\n", static_cast<long long>(c.hidden_size));
  std::printf("intermediate_size:        %lld\n", static_cast<long long>(c.intermediate_size));
  std::printf("num_hidden_layers:        %lld\n", static_cast<long long>(c.num_hidden_layers));
  std::printf("num_attention_heads:      %lld\n", static_cast<long long>(c.num_attention_heads));
  std::printf("num_key_value_heads:      %lld\n", static_cast<long long>(c.num_key_value_heads));
  std::printf("head_dim:                 %lld\n", static_cast<long long>(c.head_dim));
  std::printf("vocab_size:               %lld\n", static_cast<long long>(c.vocab_size));
  std::printf("max_position_embeddings:  %lld\n", static_cast<long long>(c.max_position_embeddings));
  std::printf("rope_theta:               %g\n", c.rope_theta);
  if (c.rope_scaling.type.empty()) {
    std::printf("rope_scaling:             none\n");
  } else {
    std::printf("rope_scaling:             %s (factor %g, low_freq_factor %g, high_freq_factor %g, original %lld)\n",
                c.rope_scaling.type.c_str(), c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
                c.rope_scaling.high_freq_factor, static_cast<long long>(c.rope_scaling.original_max_position_embeddings));
  }
  std::printf("rms_norm_eps:             %g\n", c.rms_norm_eps);
  std::printf("tie_word_embeddings:      %s\n", c.tie_word_embeddings ? "true" : "false");
  std::printf("bos / eos token ids:      %d / %d\n", c.bos_token_id, c.eos_token_id);
  const int64_t params = model.parameter_count();
  std::printf("parameters:               %lld (%.1f M)\n", static_cast<long long>(params), params / 1e6);
  std::printf("fp32 reference engine:    %.1f MiB of weights\n", params * 4.0 / (1 << 20));
  const int64_t kv_bytes_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4;
  std::printf("fp32 KV cache:            %.1f KiB per token\n", kv_bytes_per_token / 1024.0);
  print_cuda_memory(c);
  try {
    const std::unique_ptr<Tokenizer> tok = load_tokenizer_for_model(model, a.tokenizer);
    std::printf("tokenizer:                %d tokens, bos %d, eos %d\n", tok->vocab_size(), tok->bos_id(),
                tok->eos_id());
  } catch (const Error& e) {
    std::printf("tokenizer:                none (%s)\n", e.what());
  }
  std::printf("\n");
  print_tensor_summary(model, a.all_tensors);
  return 0;
}

}  // namespace

Command add_info_command(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* sub = app.add_subcommand("info", "Print a model's config, parameter count and tensors");
  sub->add_option("-m,--model", args->model, "HF directory, .gguf file, or llama2.c .bin")->required();
  sub->add_option("--tokenizer", args->tokenizer, "Tokenizer file, if the model has none of its own");
  sub->add_flag("--all-tensors", args->all_tensors, "List every tensor instead of one row per layer pattern");
  return {sub, [args] { return run_info(*args); }};
}

}  // namespace futransformer::cli
