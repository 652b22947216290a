// One in-memory description of a Llama-family checkpoint, whatever file format it came from: the config and
// the named tensors. Tensor names and layouts are Hugging Face's (the canonical form of this project):
//   model.embed_tokens.weight                       [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight         [hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight [out, in]   (q/k rows in HF "rotate-half" RoPE order)
//   model.layers.{i}.post_attention_layernorm.weight [hidden]
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight  [out, in]
//   model.norm.weight                               [hidden]
//   lm_head.weight                                  [vocab, hidden]   (absent when tie_word_embeddings)
// Loaders of formats that store Q/K rows in Meta's interleaved RoPE order (GGUF, llama2.c) permute them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "futransformer/tensor.h"
#include "futransformer/tokenizer_data.h"

namespace futransformer {

struct RopeScaling {
  std::string type;               // "" (none) or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // Per-frequency divisors of the inverse RoPE frequencies (GGUF's rope_freqs tensor, llama.cpp semantics:
  // inv_freq[i] /= freq_divisors[i]); empty when absent. Applied after `type`'s scaling.
  std::vector<double> freq_divisors;
};

struct ModelConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;           // hidden_size / num_attention_heads unless the checkpoint says otherwise
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int32_t bos_token_id = -1;      // -1: unknown
  int32_t eos_token_id = -1;

  // Throws Error (prefixed with `source`) if any field is out of range or inconsistent
  // (e.g. heads not divisible by KV heads, non-positive sizes, odd head_dim).
  void validate(const std::string& source) const;
};

class Model {
 public:
  ModelConfig config;
  std::string source;             // path it was loaded from (for messages)
  std::string format;             // "hf", "gguf", "llama2c", "synthetic"
  std::map<std::string, Tensor> tensors;
  std::optional<TokenizerData> tokenizer;   // a tokenizer stored inside the checkpoint (GGUF)
  std::string tokenizer_path;               // a tokenizer file found next to the checkpoint (HF dir), or ""

  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  // The tensor `name`; throws Error naming the model source and tensor if it is missing.
  const Tensor& get(const std::string& name) const;
  // get(name) and check its shape; throws Error naming tensor, actual and expected shape.
  const Tensor& get(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // Checks that every tensor the config implies exists with the right shape (and that lm_head exists unless
  // tied). Loaders call it last.
  void validate() const;
  int64_t parameter_count() const;
};

// Loads a model from an HF directory, a .gguf file or a llama2.c .bin (by inspecting the path).
Model load_model(const std::string& path);

// Format-specific loaders (src/io). All throw Error with the file and field/tensor on any malformed input.
Model load_hf_model(const std::string& dir);
Model load_gguf_model(const std::string& path);
Model load_llama2c_model(const std::string& path);

}  // namespace futransformer
