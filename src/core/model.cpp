#include "futransformer/model.h"

#include <sys/stat.h>

#include <cmath>

#include "futransformer/error.h"
#include "futransformer/quant/quantize_model.h"

namespace futransformer {

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* field) {
    check(v > 0 && v < (int64_t{1} << 31), source, ": config field '", field, "' = ", v,
          ", expected a positive value below 2^31");
  };
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  check(num_attention_heads % num_key_value_heads == 0, source, ": num_attention_heads (", num_attention_heads,
        ") is not a multiple of num_key_value_heads (", num_key_value_heads, ")");
  check(head_dim % 2 == 0, source, ": head_dim ", head_dim, " is odd; RoPE needs pairs");
  check(rope_theta > 0, source, ": rope_theta ", rope_theta, " must be positive");
  check(rms_norm_eps > 0 && rms_norm_eps < 1, source, ": rms_norm_eps ", rms_norm_eps, " outside (0, 1)");
  if (!rope_scaling.type.empty()) {
    check(rope_scaling.type == "llama3", source, ": rope_scaling type '", rope_scaling.type,
          "' is not supported (expected 'llama3')");
    check(rope_scaling.factor >= 1 && rope_scaling.low_freq_factor > 0 &&
              rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
              rope_scaling.original_max_position_embeddings > 0,
          source, ": rope_scaling llama3 parameters out of range (factor >= 1, 0 < low_freq_factor < ",
          "high_freq_factor, original_max_position_embeddings > 0)");
  }
  if (!rope_scaling.freq_divisors.empty()) {
    check(static_cast<int64_t>(rope_scaling.freq_divisors.size()) == head_dim / 2, source, ": ",
          rope_scaling.freq_divisors.size(), " RoPE frequency divisors for head_dim ", head_dim, ", expected ",
          head_dim / 2);
    for (double d : rope_scaling.freq_divisors)
      check(d > 0 && std::isfinite(d), source, ": RoPE frequency divisor ", d, " is not positive");
  }
  check(bos_token_id < vocab_size && eos_token_id < vocab_size, source, ": bos/eos token id outside the vocabulary");
}

const Tensor& Model::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail(source, ": missing tensor '", name, "'");
  return it->second;
}

const Tensor& Model::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const Tensor& t = get(name);
  if (t.shape != expected_shape) {
    Tensor want;
    want.shape = expected_shape;
    fail(source, ": tensor '", name, "' has shape ", t.shape_str(), ", expected ", want.shape_str());
  }
  return t;
}

void Model::validate() const {
  const ModelConfig& c = config;
  c.validate(source);
  const int64_t h = c.hidden_size, hd = c.head_dim;
  get("model.embed_tokens.weight", {c.vocab_size, h});
  get("model.norm.weight", {h});
  if (c.tie_word_embeddings) {
    check(!has("lm_head.weight") || get("lm_head.weight").shape == std::vector<int64_t>{c.vocab_size, h}, source,
          ": tied embeddings but lm_head.weight has a wrong shape");
  } else {
    get("lm_head.weight", {c.vocab_size, h});
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    get(p + "input_layernorm.weight", {h});
    get(p + "post_attention_layernorm.weight", {h});
    get(p + "self_attn.q_proj.weight", {c.num_attention_heads * hd, h});
    get(p + "self_attn.k_proj.weight", {c.num_key_value_heads * hd, h});
    get(p + "self_attn.v_proj.weight", {c.num_key_value_heads * hd, h});
    get(p + "self_attn.o_proj.weight", {h, c.num_attention_heads * hd});
    get(p + "mlp.gate_proj.weight", {c.intermediate_size, h});
    get(p + "mlp.up_proj.weight", {c.intermediate_size, h});
    get(p + "mlp.down_proj.weight", {h, c.intermediate_size});
  }
  for (const auto& [name, t] : tensors) {
    check(t.data != nullptr || t.numel() == 0, source, ": tensor '", name, "' has no data");
  }
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.numel();
  return n;
}

Model load_model(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": no such file or directory");
  if (S_ISDIR(st.st_mode)) {
    // A quantised checkpoint is an HF directory plus quantization.json; its packed projections load dequantised.
    if (quant::is_quantized_checkpoint(path)) return quant::load_quantized_checkpoint(path).model;
    return load_hf_model(path);
  }
  auto ends_with = [&](const std::string& suffix) {
    return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".gguf")) return load_gguf_model(path);
  if (ends_with(".bin")) return load_llama2c_model(path);
  fail(path, ": unknown model format (expected a Hugging Face directory, a .gguf file or a llama2.c .bin file)");
}

}  // namespace futransformer
