#include <limits>

#include "futransformer/error.h"
#include "futransformer/io/hf.h"

namespace futransformer {
namespace {

using nlohmann::json;

// Typed access to the fields of one JSON object; every message names the source and the dotted field path.
class Fields {
 public:
  Fields(const json& object, const std::string& source, std::string prefix)
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  // The field's value, or nullptr when it is absent or null (both mean "use the default" in HF configs).
  const json* find(const char* field) const {
    const auto it = object_.find(field);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  [[noreturn]] void wrong_type(const char* field, const json& v, const char* expected) const {
    fail(source_, ": config field '", prefix_, field, "' is a JSON ", v.type_name(), ", expected ", expected);
  }

  const json& required(const char* field) const {
    const json* v = find(field);
    if (!v) fail(source_, ": config field '", prefix_, field, "' is missing");
    return *v;
  }

  int64_t to_integer(const char* field, const json& v) const {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      check(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), source_, ": config field '", prefix_,
            field, "' = ", u, " is too large");
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    wrong_type(field, v, "an integer");
  }

  int64_t integer(const char* field) const { return to_integer(field, required(field)); }
  int64_t integer(const char* field, int64_t fallback) const {
    const json* v = find(field);
    return v ? to_integer(field, *v) : fallback;
  }

  double number(const char* field) const {
    const json& v = required(field);
    if (!v.is_number()) wrong_type(field, v, "a number");
    return v.get<double>();
  }
  double number(const char* field, double fallback) const { return find(field) ? number(field) : fallback; }

  bool boolean(const char* field, bool fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_boolean()) wrong_type(field, *v, "true or false");
    return v->get<bool>();
  }

  const std::string* string(const char* field) const {
    const json* v = find(field);
    if (v && !v->is_string()) wrong_type(field, *v, "a string");
    return v ? &v->get_ref<const std::string&>() : nullptr;
  }

  // bos/eos ids: an integer, a list of integers (generation stops at any; we keep the first) or null (-1).
  int32_t token_id(const char* field) const {
    const json* v = find(field);
    if (!v) return -1;
    if (v->is_array()) {
      check(!v->empty(), source_, ": config field '", prefix_, field, "' is an empty list, expected token ids");
      v = &(*v)[0];
    }
    const int64_t id = to_integer(field, *v);
    check(id >= 0 && id <= std::numeric_limits<int32_t>::max(), source_, ": config field '", prefix_, field,
          "' = ", id, " is not a valid token id");
    return static_cast<int32_t>(id);
  }

 private:
  const json& object_;
  const std::string& source_;
  std::string prefix_;
};

void check_architecture(const Fields& f, const std::string& source) {
  if (const std::string* type = f.string("model_type")) {
    check(*type == "llama", source, ": config field 'model_type' is '", *type, "', expected 'llama'");
  }
  if (const json* archs = f.find("architectures")) {
    if (!archs->is_array()) f.wrong_type("architectures", *archs, "a list of strings");
    for (const json& a : *archs) {
      check(a.is_string() && a.get_ref<const std::string&>() == "LlamaForCausalLM", source,
            ": config field 'architectures' lists ", a.is_string() ? "'" + a.get<std::string>() + "'" : "a non-string",
            ", expected 'LlamaForCausalLM'");
    }
  }
  if (const std::string* act = f.string("hidden_act")) {
    check(*act == "silu", source, ": config field 'hidden_act' is '", *act, "', expected 'silu' (SwiGLU MLP)");
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    check(!f.boolean(bias, false), source, ": config field '", bias, "' is true; projection biases are not supported");
  }
}

RopeScaling parse_rope_scaling(const json& v, const std::string& source) {
  RopeScaling r;
  if (!v.is_object()) Fields(json::object(), source, "").wrong_type("rope_scaling", v, "an object or null");
  const Fields f(v, source, "rope_scaling.");
  const std::string* type = f.string("rope_type");
  if (!type) type = f.string("type");
  if (!type) fail(source, ": config field 'rope_scaling.rope_type' is missing");
  if (*type == "default") return r;  // transformers' name for plain RoPE
  check(*type == "llama3", source, ": config field 'rope_scaling.rope_type' is '", *type,
        "', which is not supported (expected 'llama3' or null)");
  r.type = "llama3";
  r.factor = f.number("factor");
  r.low_freq_factor = f.number("low_freq_factor");
  r.high_freq_factor = f.number("high_freq_factor");
  r.original_max_position_embeddings = f.integer("original_max_position_embeddings");
  return r;
}

}  // namespace

ModelConfig parse_hf_config(const json& j, const std::string& source) {
  check(j.is_object(), source, ": config is a JSON ", j.type_name(), ", expected an object");
  const Fields f(j, source, "");
  check_architecture(f, source);
  ModelConfig c;
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.num_key_value_heads = f.integer("num_key_value_heads", c.num_attention_heads);
  if (f.find("head_dim")) {
    c.head_dim = f.integer("head_dim");
  } else if (c.num_attention_heads > 0) {
    check(c.hidden_size % c.num_attention_heads == 0, source, ": hidden_size ", c.hidden_size,
          " is not a multiple of num_attention_heads ", c.num_attention_heads, " and head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.vocab_size = f.integer("vocab_size");
  c.max_position_embeddings = f.integer("max_position_embeddings", 2048);
  c.rope_theta = f.number("rope_theta", 10000.0);
  if (const json* rs = f.find("rope_scaling")) c.rope_scaling = parse_rope_scaling(*rs, source);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.bos_token_id = f.token_id("bos_token_id");
  c.eos_token_id = f.token_id("eos_token_id");
  c.validate(source);
  return c;
}

ModelConfig parse_hf_config_text(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    fail(source, ": not valid JSON: ", what);
  }
  return parse_hf_config(j, source);
}

json hf_config_to_json(const ModelConfig& c) {
  json j = {
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
  };
  j["rope_scaling"] = nullptr;
  if (!c.rope_scaling.type.empty()) {
    j["rope_scaling"] = {{"rope_type", c.rope_scaling.type},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  j["eos_token_id"] = c.eos_token_id >= 0 ? json(c.eos_token_id) : json(nullptr);
  return j;
}

}  // namespace futransformer
