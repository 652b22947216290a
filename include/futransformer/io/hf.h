// Hugging Face checkpoint directories: config.json <-> ModelConfig. (load_hf_model is declared in model.h.)
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "futransformer/model.h"

namespace futransformer {

// Reads a Llama config.json already parsed as JSON. Missing optional fields take Hugging Face's LlamaConfig
// defaults (num_key_value_heads = heads, head_dim = hidden / heads, rope_theta 10000, rms_norm_eps 1e-6,
// untied embeddings). Throws Error naming `source` and the field on a missing field, a wrong JSON type, an
// unsupported architecture or rope scaling, or values that fail ModelConfig::validate.
ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& source);

// Same from the text of config.json; JSON syntax errors become Error naming `source`.
ModelConfig parse_hf_config_text(std::string_view text, const std::string& source);

// The config.json (Hugging Face field names, LlamaForCausalLM) describing `config`; parse_hf_config inverts it.
nlohmann::json hf_config_to_json(const ModelConfig& config);

}  // namespace futransformer
