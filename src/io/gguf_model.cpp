// GGUF -> Model: llama.* metadata to ModelConfig, ggml tensor names to Hugging Face names, Q/K rows from Meta's
// interleaved RoPE order to HF's rotate-half order, quantised blocks to fp32, tokenizer.ggml.* to TokenizerData.
#include <cmath>
#include <cstring>

#include "futransformer/error.h"
#include "futransformer/io/gguf.h"
#include "futransformer/mapped_file.h"
#include "io/gguf_dequant.h"

namespace futransformer {

namespace {

using gguf_detail::kBlockElems;

class Meta {
 public:
  Meta(const GgufFile& f, const std::string& source) : f_(f), source_(source) {}

  const GgufValue* find(const std::string& key) const { return f_.find(key); }

  // Integer keys may be any integer type, or a per-layer array whose entries are all equal.
  std::optional<int64_t> opt_int(const std::string& key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (std::optional<int64_t> i = v->as_int()) return i;
    if (const GgufArray* a = v->as_array(); a != nullptr && !a->items.empty()) {
      const std::optional<int64_t> first = a->items[0].as_int();
      bool uniform = first.has_value();
      for (const GgufValue& item : a->items) uniform = uniform && item.as_int() == first;
      check(uniform, source_, ": GGUF key '", key, "' varies per layer, which is not supported");
      return first;
    }
    fail(source_, ": GGUF key '", key, "' has type ", gguf_type_name(v->type()),
         ", expected an integer (below 2^63)");
  }

  int64_t req_int(const std::string& key) const {
    const std::optional<int64_t> v = opt_int(key);
    check(v.has_value(), source_, ": missing GGUF key '", key, "'");
    return *v;
  }

  std::optional<double> opt_number(const std::string& key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return std::nullopt;
    const std::optional<double> d = v->as_number();
    check(d.has_value(), source_, ": GGUF key '", key, "' has type ", gguf_type_name(v->type()), ", expected a number");
    return d;
  }

  double req_number(const std::string& key) const {
    const std::optional<double> v = opt_number(key);
    check(v.has_value(), source_, ": missing GGUF key '", key, "'");
    return *v;
  }

  std::optional<std::string> opt_string(const std::string& key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return std::nullopt;
    const std::string* s = v->as_string();
    check(s != nullptr, source_, ": GGUF key '", key, "' has type ", gguf_type_name(v->type()), ", expected a string");
    return *s;
  }

  std::optional<bool> opt_bool(const std::string& key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return std::nullopt;
    const bool* b = std::get_if<bool>(&v->value);
    check(b != nullptr, source_, ": GGUF key '", key, "' has type ", gguf_type_name(v->type()), ", expected a bool");
    return *b;
  }

  // An array key whose elements all have type `elem` (nullptr when absent).
  const GgufArray* opt_array(const std::string& key, std::initializer_list<GgufType> elem) const {
    const GgufValue* v = find(key);
    if (v == nullptr) return nullptr;
    const GgufArray* a = v->as_array();
    check(a != nullptr, source_, ": GGUF key '", key, "' has type ", gguf_type_name(v->type()), ", expected an array");
    bool ok = false;
    for (GgufType t : elem) ok = ok || a->type == t;
    check(ok, source_, ": GGUF key '", key, "' is an array of ", gguf_type_name(a->type), ", expected an array of ",
          gguf_type_name(*elem.begin()));
    return a;
  }

 private:
  const GgufFile& f_;
  const std::string& source_;
};

ModelConfig read_config(const Meta& m, const GgufFile& f, const std::string& source) {
  const std::optional<std::string> arch = m.opt_string("general.architecture");
  check(arch.has_value(), source, ": missing GGUF key 'general.architecture'");
  check(*arch == "llama", source, ": GGUF key 'general.architecture' is '", *arch,
        "'; only 'llama' models are supported");
  check(m.opt_int("llama.expert_count").value_or(0) == 0, source,
        ": GGUF key 'llama.expert_count' is set; mixture-of-experts models are not supported");

  ModelConfig c;
  c.hidden_size = m.req_int("llama.embedding_length");
  c.num_hidden_layers = m.req_int("llama.block_count");
  c.intermediate_size = m.req_int("llama.feed_forward_length");
  c.num_attention_heads = m.req_int("llama.attention.head_count");
  c.num_key_value_heads = m.opt_int("llama.attention.head_count_kv").value_or(c.num_attention_heads);
  c.max_position_embeddings = m.req_int("llama.context_length");
  c.rms_norm_eps = m.req_number("llama.attention.layer_norm_rms_epsilon");
  c.rope_theta = m.opt_number("llama.rope.freq_base").value_or(10000.0);
  if (const std::optional<int64_t> kl = m.opt_int("llama.attention.key_length")) {
    c.head_dim = *kl;
  } else {
    check(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0, source,
          ": GGUF key 'llama.embedding_length' (", c.hidden_size, ") is not a multiple of 'llama.attention.head_count' (",
          c.num_attention_heads, ") and 'llama.attention.key_length' is absent");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (const std::optional<int64_t> vl = m.opt_int("llama.attention.value_length"))
    check(*vl == c.head_dim, source, ": GGUF key 'llama.attention.value_length' (", *vl,
          ") differs from the key length (", c.head_dim, "), which is not supported");
  if (const std::optional<int64_t> rd = m.opt_int("llama.rope.dimension_count"))
    check(*rd == c.head_dim, source, ": GGUF key 'llama.rope.dimension_count' (", *rd, ") differs from head_dim (",
          c.head_dim, "); partial rotary embeddings are not supported");

  const std::string scaling = m.opt_string("llama.rope.scaling.type").value_or("none");
  if (scaling == "llama3") {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = m.req_number("llama.rope.scaling.factor");
    c.rope_scaling.low_freq_factor = m.opt_number("llama.rope.scaling.low_freq_factor").value_or(1.0);
    c.rope_scaling.high_freq_factor = m.opt_number("llama.rope.scaling.high_freq_factor").value_or(4.0);
    c.rope_scaling.original_max_position_embeddings =
        m.opt_int("llama.rope.scaling.original_context_length").value_or(8192);
  } else {
    check(scaling == "none", source, ": GGUF key 'llama.rope.scaling.type' is '", scaling,
          "'; only 'none' and 'llama3' are supported");
    const double linear = m.opt_number("llama.rope.scale_linear").value_or(1.0);
    check(linear == 1.0, source, ": GGUF key 'llama.rope.scale_linear' = ", linear,
          "; linear RoPE scaling is not supported");
  }

  if (const std::optional<int64_t> v = m.opt_int("llama.vocab_size")) {
    c.vocab_size = *v;
  } else if (const GgufArray* tokens = m.opt_array("tokenizer.ggml.tokens", {GgufType::STRING})) {
    c.vocab_size = static_cast<int64_t>(tokens->items.size());
  } else {
    const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    check(embd != nullptr && embd->dims.size() == 2, source,
          ": cannot tell the vocabulary size: no 'llama.vocab_size', no 'tokenizer.ggml.tokens' and no 2-D ",
          "tensor 'token_embd.weight'");
    c.vocab_size = embd->dims[1];
  }
  return c;
}

std::optional<TokenizerData> read_tokenizer(const Meta& m, const ModelConfig& c, const std::string& source) {
  const GgufArray* tokens = m.opt_array("tokenizer.ggml.tokens", {GgufType::STRING});
  if (tokens == nullptr) return std::nullopt;
  TokenizerData t;
  const std::optional<std::string> model = m.opt_string("tokenizer.ggml.model");
  check(model.has_value(), source, ": missing GGUF key 'tokenizer.ggml.model' (the file has tokenizer.ggml.tokens)");
  t.model = *model;
  t.pre = m.opt_string("tokenizer.ggml.pre").value_or("");
  const size_t n = tokens->items.size();
  check(static_cast<int64_t>(n) <= c.vocab_size, source, ": GGUF key 'tokenizer.ggml.tokens' has ", n,
        " tokens, more than the model's vocabulary size ", c.vocab_size);
  t.tokens.reserve(n);
  for (const GgufValue& v : tokens->items) t.tokens.push_back(*v.as_string());

  if (const GgufArray* scores = m.opt_array("tokenizer.ggml.scores", {GgufType::FLOAT32, GgufType::FLOAT64})) {
    check(scores->items.size() == n, source, ": GGUF key 'tokenizer.ggml.scores' has ", scores->items.size(),
          " entries, expected one per token (", n, ")");
    t.scores.reserve(n);
    for (const GgufValue& v : scores->items) t.scores.push_back(static_cast<float>(*v.as_number()));
  }
  if (const GgufArray* types = m.opt_array("tokenizer.ggml.token_type",
                                           {GgufType::INT32, GgufType::UINT32, GgufType::INT8, GgufType::UINT8,
                                            GgufType::INT16, GgufType::UINT16, GgufType::INT64, GgufType::UINT64})) {
    check(types->items.size() == n, source, ": GGUF key 'tokenizer.ggml.token_type' has ", types->items.size(),
          " entries, expected one per token (", n, ")");
    t.token_types.reserve(n);
    for (const GgufValue& v : types->items) {
      const std::optional<int64_t> x = v.as_int();
      check(x.has_value() && *x >= 0 && *x <= 6, source, ": GGUF key 'tokenizer.ggml.token_type' has an entry ",
            "outside 0..6");
      t.token_types.push_back(static_cast<int32_t>(*x));
    }
  }
  if (const GgufArray* merges = m.opt_array("tokenizer.ggml.merges", {GgufType::STRING})) {
    t.merges.reserve(merges->items.size());
    for (const GgufValue& v : merges->items) t.merges.push_back(*v.as_string());
  }
  auto id = [&](const char* key) -> int32_t {
    const std::optional<int64_t> v = m.opt_int(key);
    if (!v.has_value()) return -1;
    check(*v >= 0 && *v < static_cast<int64_t>(n), source, ": GGUF key '", key, "' = ", *v,
          " is not a token id (the vocabulary has ", n, " tokens)");
    return static_cast<int32_t>(*v);
  };
  t.bos_id = id("tokenizer.ggml.bos_token_id");
  t.eos_id = id("tokenizer.ggml.eos_token_id");
  t.unk_id = id("tokenizer.ggml.unknown_token_id");
  t.pad_id = id("tokenizer.ggml.padding_token_id");
  // llama.cpp's default when the key is absent: SentencePiece vocabularies start prompts with BOS, BPE ones don't.
  t.add_bos = m.opt_bool("tokenizer.ggml.add_bos_token").value_or(t.model == "llama");
  return t;
}

enum class RopeRows { kNone, kQ, kK };

struct Target {
  std::string name;
  RopeRows rope = RopeRows::kNone;
};

// The HF name of a GGUF tensor, or nullopt for tensors a Llama model does not use (rope_freqs, ...).
std::optional<Target> hf_target(const std::string& g, int64_t n_layers, const std::string& source) {
  if (g == "token_embd.weight") return Target{"model.embed_tokens.weight"};
  if (g == "output_norm.weight") return Target{"model.norm.weight"};
  if (g == "output.weight") return Target{"lm_head.weight"};
  if (g.rfind("blk.", 0) != 0) return std::nullopt;
  const size_t dot = g.find('.', 4);
  // Layer numbers are plain decimals ("blk.7.", never "blk.07."), at most 9 digits.
  if (dot == std::string::npos || dot == 4 || dot - 4 > 9 || (g[4] == '0' && dot > 5)) return std::nullopt;
  int64_t layer = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (g[i] < '0' || g[i] > '9') return std::nullopt;
    layer = layer * 10 + (g[i] - '0');
  }
  static const std::pair<const char*, const char*> kLayerNames[] = {
      {"attn_norm", "input_layernorm"},   {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},     {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},      {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"}};
  const std::string rest = g.substr(dot + 1);
  for (const auto& [gguf_part, hf_part] : kLayerNames) {
    const std::string base = gguf_part;
    if (rest == base + ".bias")
      fail(source, ": tensor '", g, "' is a bias; Llama models with biases are not supported");
    if (rest != base + ".weight") continue;
    check(layer < n_layers, source, ": tensor '", g, "' belongs to layer ", layer, " but 'llama.block_count' is ",
          n_layers);
    Target t{"model.layers." + std::to_string(layer) + "." + hf_part + ".weight"};
    if (base == "attn_q") t.rope = RopeRows::kQ;
    if (base == "attn_k") t.rope = RopeRows::kK;
    return t;
  }
  return std::nullopt;
}

// Storage for `nbytes`, aligned for floats (make_shared of a byte array only guarantees byte alignment).
std::shared_ptr<float[]> alloc_bytes(size_t nbytes) { return std::make_shared_for_overwrite<float[]>((nbytes + 3) / 4); }

Tensor convert_tensor(const GgufTensorInfo& g, const Target& target, const ModelConfig& c,
                      const std::shared_ptr<const void>& file_owner, const std::string& source) {
  Tensor t;
  t.name = target.name;
  t.shape.assign(g.dims.rbegin(), g.dims.rend());
  const bool quantised = g.type == GgmlType::Q4_0 || g.type == GgmlType::Q4_1 || g.type == GgmlType::Q8_0;
  t.dtype = g.type == GgmlType::F16 ? DType::F16 : g.type == GgmlType::BF16 ? DType::BF16 : DType::F32;
  const size_t elem = dtype_size(t.dtype);
  const int64_t ne0 = g.dims[0];
  const int64_t rows = ne0 == 0 ? 0 : g.numel() / ne0;
  const size_t src_row_bytes = rows == 0 ? 0 : g.nbytes / static_cast<size_t>(rows);
  const size_t dst_row_bytes = static_cast<size_t>(ne0) * elem;

  std::vector<int64_t> dst_row;  // GGUF row -> row in the result; empty: identity
  if (target.rope != RopeRows::kNone) {
    const int64_t heads = target.rope == RopeRows::kQ ? c.num_attention_heads : c.num_key_value_heads;
    const int64_t hd = c.head_dim;
    check(g.dims.size() == 2 && heads > 0 && hd > 0 && hd % 2 == 0 && rows == heads * hd, source, ": tensor '",
          g.name, "' has ", rows, " rows (", g.dims.size(), " dims), expected ", heads, " heads x head_dim ", hd,
          " (an even head_dim) for the RoPE row permutation");
    // GGUF row 2i+p of a head holds HF row p*(hd/2)+i (llama.cpp's converter interleaves the two halves).
    dst_row.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = r / hd, within = r % hd;
      dst_row[static_cast<size_t>(r)] = h * hd + (within % 2) * (hd / 2) + within / 2;
    }
  }

  // With general.alignment < 4 a view could be misaligned for its element type; such tensors are copied.
  const bool aligned = reinterpret_cast<uintptr_t>(g.data) % elem == 0;
  if (!quantised && dst_row.empty() && aligned) {
    t.data = g.data;
    t.owner = file_owner;
    return t;
  }
  const size_t total = static_cast<size_t>(rows) * dst_row_bytes;
  std::shared_ptr<float[]> buf = alloc_bytes(total);
  auto* out = reinterpret_cast<uint8_t*>(buf.get());
  const size_t blocks_per_row = static_cast<size_t>(ne0 / kBlockElems);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = g.data + static_cast<size_t>(r) * src_row_bytes;
    uint8_t* dst = out + static_cast<size_t>(dst_row.empty() ? r : dst_row[static_cast<size_t>(r)]) * dst_row_bytes;
    auto* dst_f = reinterpret_cast<float*>(dst);
    switch (g.type) {
      case GgmlType::Q4_0: gguf_detail::dequantize_q4_0(src, dst_f, blocks_per_row); break;
      case GgmlType::Q4_1: gguf_detail::dequantize_q4_1(src, dst_f, blocks_per_row); break;
      case GgmlType::Q8_0: gguf_detail::dequantize_q8_0(src, dst_f, blocks_per_row); break;
      case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: std::memcpy(dst, src, dst_row_bytes); break;
    }
  }
  t.data = out;
  t.owner = std::move(buf);
  return t;
}

}  // namespace

// Llama-3.1 GGUFs store their llama3 RoPE frequency scaling as this F32 tensor of per-frequency divisors
// (llama.cpp divides each inverse frequency by its entry) instead of rope_scaling metadata.
std::vector<double> read_rope_freq_divisors(const GgufTensorInfo& g, const ModelConfig& c, const std::string& source) {
  check(g.type == GgmlType::F32 && g.dims.size() == 1 && static_cast<int64_t>(g.dims[0]) == c.head_dim / 2, source,
        ": tensor 'rope_freqs.weight' must be F32 with head_dim / 2 = ", c.head_dim / 2, " entries");
  std::vector<double> out(static_cast<size_t>(g.dims[0]));
  for (size_t i = 0; i < out.size(); ++i) {
    float v;
    std::memcpy(&v, g.data + 4 * i, 4);
    check(std::isfinite(v) && v > 0, source, ": tensor 'rope_freqs.weight' entry ", i, " is ", v,
          ", expected a positive divisor");
    out[i] = v;
  }
  return out;
}

Model gguf_to_model(const GgufFile& file, const std::string& source) {
  const Meta meta(file, source);
  Model model;
  model.source = source;
  model.format = "gguf";
  model.config = read_config(meta, file, source);
  model.tokenizer = read_tokenizer(meta, model.config, source);
  if (model.tokenizer) {
    model.config.bos_token_id = model.tokenizer->bos_id;
    model.config.eos_token_id = model.tokenizer->eos_id;
  }
  // Checked before tensors are converted so that row permutations see sane head counts.
  model.config.validate(source);
  for (const GgufTensorInfo& g : file.tensors) {
    if (g.name == "rope_freqs.weight") {
      model.config.rope_scaling.freq_divisors = read_rope_freq_divisors(g, model.config, source);
      continue;
    }
    const std::optional<Target> target = hf_target(g.name, model.config.num_hidden_layers, source);
    if (!target) continue;
    const bool fresh =
        model.tensors.emplace(target->name, convert_tensor(g, *target, model.config, file.owner, source)).second;
    check(fresh, source, ": tensor '", g.name, "' maps to '", target->name, "', which another tensor already filled");
  }
  model.config.tie_word_embeddings = !model.has("lm_head.weight");
  model.validate();
  return model;
}

Model load_gguf_model(const std::string& path) {
  const std::shared_ptr<MappedFile> mapped = MappedFile::open(path);
  const GgufFile file = parse_gguf(mapped, mapped->data(), mapped->size(), path);
  return gguf_to_model(file, path);
}

}  // namespace futransformer
