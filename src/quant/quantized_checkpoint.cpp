// Quantised checkpoint directories: config.json, model.safetensors (packed projections + the other tensors as
// stored), quantization.json (the recipe JSON), and the tokenizer. docs/formats.md "Quantised checkpoint".
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "futransformer/error.h"
#include "futransformer/io/hf.h"
#include "futransformer/io/safetensors.h"
#include "futransformer/mapped_file.h"
#include "futransformer/quant/quantize_model.h"
#include "ref/ref_model.h"

namespace futransformer::quant {
namespace {

using nlohmann::json;

constexpr const char* kQuantFile = "quantization.json";
constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kTokenizerDataFile = "tokenizer_data.json";
constexpr const char* kFormatTag = "futransformer-quantized";
constexpr int kVersion = 1;
// The recipe JSON is small; a vocabulary (tokenizer_data.json) is a few MB.
constexpr size_t kMaxJsonBytes = size_t{256} << 20;

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// "model.layers.0.self_attn.q_proj.weight" -> "model.layers.0.self_attn.q_proj": packed parts hang off the module.
std::string module_of(const std::string& weight_name) { return weight_name.substr(0, weight_name.size() - 7); }

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    check(out.good(), tmp, ": cannot create file (", std::strerror(errno), ")");
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    check(out.good(), tmp, ": write failed (disk full?)");
  }
  check(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": cannot move ", tmp, " into place (",
        std::strerror(errno), ")");
}

void copy_file(const std::string& from, const std::string& to) {
  const std::shared_ptr<MappedFile> f = MappedFile::open(from);
  write_text(to, std::string(reinterpret_cast<const char*>(f->data()), f->size()));
}

bool looks_like_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), path, ": cannot open tokenizer file");
  char c = 0;
  while (in.get(c))
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return c == '{';
  return false;
}

json tokenizer_data_to_json(const TokenizerData& t) {
  return {{"model", t.model},   {"pre", t.pre},         {"tokens", t.tokens}, {"scores", t.scores},
          {"token_types", t.token_types}, {"merges", t.merges}, {"bos_id", t.bos_id}, {"eos_id", t.eos_id},
          {"unk_id", t.unk_id}, {"pad_id", t.pad_id},   {"add_bos", t.add_bos}};
}

json read_json_file(const std::string& path) {
  const std::shared_ptr<MappedFile> f = MappedFile::open(path);
  check(f->size() <= kMaxJsonBytes, path, ": ", f->size(), " bytes is too large for this JSON file");
  try {
    return json::parse(f->data(), f->data() + f->size());
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON: ", std::string(e.what()).substr(0, 300));
  }
}

template <typename T>
T field(const json& j, const char* key, const std::string& file) {
  const auto it = j.find(key);
  check(it != j.end(), file, ": field '", key, "' is missing");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(file, ": field '", key, "' is a JSON ", it->type_name(), " of the wrong type");
  }
}

TokenizerData tokenizer_data_from_json(const json& j, const std::string& file) {
  check(j.is_object(), file, ": is a JSON ", j.type_name(), ", expected an object");
  TokenizerData t;
  t.model = field<std::string>(j, "model", file);
  t.pre = field<std::string>(j, "pre", file);
  t.tokens = field<std::vector<std::string>>(j, "tokens", file);
  t.scores = field<std::vector<float>>(j, "scores", file);
  t.token_types = field<std::vector<int32_t>>(j, "token_types", file);
  t.merges = field<std::vector<std::string>>(j, "merges", file);
  t.bos_id = field<int32_t>(j, "bos_id", file);
  t.eos_id = field<int32_t>(j, "eos_id", file);
  t.unk_id = field<int32_t>(j, "unk_id", file);
  t.pad_id = field<int32_t>(j, "pad_id", file);
  t.add_bos = field<bool>(j, "add_bos", file);
  return t;
}

// The tokenizer next to the weights: returns the name recorded in quantization.json.
std::string write_tokenizer(const Model& m, const std::string& dir, const std::string& tokenizer_file) {
  std::string from = m.tokenizer_path;
  if (from.empty() && !m.tokenizer) from = tokenizer_file;
  if (!from.empty()) {
    const std::string name = looks_like_json(from) ? "tokenizer.json" : "tokenizer.model";
    copy_file(from, dir + "/" + name);
    return name;
  }
  if (m.tokenizer) {
    write_text(dir + "/" + kTokenizerDataFile, tokenizer_data_to_json(*m.tokenizer).dump());
    return kTokenizerDataFile;
  }
  return "";
}

// Owned tensors of the file, in name order.
std::vector<Tensor> tensors_to_write(const QuantizedModel& q) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : q.model.tensors) {
    if (const auto it = q.int4.find(name); it != q.int4.end()) {
      const formats::Int4Weight& w = it->second;
      const std::string mod = module_of(name);
      const int64_t groups = w.groups_per_row();
      out.push_back(Tensor::from_bytes(mod + ".qweight", DType::U8, {w.rows, w.cols / 2}, w.qweight));
      std::vector<uint8_t> scale_bytes(w.scales.size() * 2);
      std::memcpy(scale_bytes.data(), w.scales.data(), scale_bytes.size());
      out.push_back(Tensor::from_bytes(mod + ".scales",
                                       w.spec.scale_type == formats::ScaleType::F16 ? DType::F16 : DType::BF16,
                                       {w.rows, groups}, std::move(scale_bytes)));
      if (!w.spec.symmetric) out.push_back(Tensor::from_bytes(mod + ".zeros", DType::U8, {w.rows, groups}, w.zeros));
      continue;
    }
    if (const auto it = q.fp8.find(name); it != q.fp8.end()) {
      const formats::Fp8Matrix& m = it->second;
      check(m.block == m.cols, name, ": only per-output-channel FP8 weights are stored in checkpoints");
      const std::string mod = module_of(name);
      out.push_back(Tensor::from_bytes(mod + ".fp8", DType::U8, {m.rows, m.cols}, m.codes));
      out.push_back(Tensor::from_f32(mod + ".fp8_scale", {m.rows}, m.scales));
      continue;
    }
    check(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16, q.model.source, ": tensor '",
          name, "' has dtype ", dtype_name(t.dtype), "; a checkpoint stores F32, F16 or BF16 tensors");
    check(!is_quantised_projection(name) || q.recipe.weights == WeightFormat::Full, q.model.source,
          ": projection '", name, "' has no packed form for recipe ", q.recipe.name());
    check(name != kLmHeadTensor || q.recipe.head == HeadFormat::Full, q.model.source, ": '", name,
          "' has no packed INT4 form for recipe ", q.recipe.name());
    out.push_back(t);  // shares the source's bytes
  }
  return out;
}

// --- Loading ---

class PackedTensors {
 public:
  PackedTensors(std::vector<Tensor> tensors, std::string file) : file_(std::move(file)) {
    for (Tensor& t : tensors) by_name_.emplace(t.name, std::move(t));
  }
  // The tensor `name` with the given dtype and shape, marked as used.
  const Tensor& take(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
    const auto it = by_name_.find(name);
    check(it != by_name_.end(), file_, ": tensor '", name, "' is missing");
    const Tensor& t = it->second;
    Tensor want;
    want.shape = shape;
    check(t.dtype == dtype && t.shape == shape, file_, ": tensor '", name, "' is ", dtype_name(t.dtype), " ",
          t.shape_str(), ", expected ", dtype_name(dtype), " ", want.shape_str());
    used_.insert(name);
    return t;
  }
  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  // The tensors not taken: the model's plain tensors.
  std::map<std::string, Tensor> rest() {
    std::map<std::string, Tensor> out;
    for (auto& [name, t] : by_name_)
      if (!used_.count(name)) out.emplace(name, std::move(t));
    return out;
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::map<std::string, Tensor> by_name_;
  std::set<std::string> used_;
};

template <typename T>
std::vector<T> copy_as(const Tensor& t) {
  std::vector<T> v(t.nbytes() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

formats::Int4Weight load_int4(PackedTensors& f, const std::string& name, int64_t n, int64_t k,
                              const formats::Int4Spec& spec) {
  const std::string mod = module_of(name);
  formats::Int4Weight w;
  w.rows = n;
  w.cols = k;
  w.spec = spec;
  w.group = spec.resolved_group(k, f.file() + ": tensor '" + name + "'");
  const int64_t groups = k / w.group;
  w.qweight = copy_as<uint8_t>(f.take(mod + ".qweight", DType::U8, {n, k / 2}));
  const DType st = spec.scale_type == formats::ScaleType::F16 ? DType::F16 : DType::BF16;
  w.scales = copy_as<uint16_t>(f.take(mod + ".scales", st, {n, groups}));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups; ++g)
      check(std::isfinite(w.scale(r, g)), f.file(), ": tensor '", mod, ".scales' holds a non-finite scale at [", r,
            ", ", g, "]");
  if (!spec.symmetric) {
    w.zeros = copy_as<uint8_t>(f.take(mod + ".zeros", DType::U8, {n, groups}));
    for (size_t i = 0; i < w.zeros.size(); ++i)
      check(w.zeros[i] <= 15, f.file(), ": tensor '", mod, ".zeros' holds zero-point ", int(w.zeros[i]),
            " at flat index ", i, ", expected 0..15");
  } else {
    check(!f.has(mod + ".zeros"), f.file(), ": tensor '", mod, ".zeros' is present but the recipe's INT4 groups ",
          "are symmetric");
  }
  return w;
}

formats::Fp8Matrix load_fp8(PackedTensors& f, const std::string& name, int64_t n, int64_t k) {
  const std::string mod = module_of(name);
  formats::Fp8Matrix m;
  m.rows = n;
  m.cols = k;
  m.block = k;
  m.codes = copy_as<uint8_t>(f.take(mod + ".fp8", DType::U8, {n, k}));
  for (size_t i = 0; i < m.codes.size(); ++i)
    check((m.codes[i] & 0x7f) != formats::kFp8E4M3NaN, f.file(), ": tensor '", mod, ".fp8' holds the NaN code at ",
          "flat index ", i);
  m.scales = copy_as<float>(f.take(mod + ".fp8_scale", DType::F32, {n}));
  for (size_t i = 0; i < m.scales.size(); ++i)
    check(std::isfinite(m.scales[i]) && m.scales[i] > 0, f.file(), ": tensor '", mod, ".fp8_scale' holds ",
          m.scales[i], " at row ", i, ", expected a positive finite scale");
  return m;
}

}  // namespace

void write_quantized_checkpoint(const QuantizedModel& q, const std::string& dir, const std::string& tokenizer_file) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    check(S_ISDIR(st.st_mode), dir, ": exists and is not a directory");
  } else {
    check(::mkdir(dir.c_str(), 0755) == 0, dir, ": cannot create directory (", std::strerror(errno), ")");
  }
  const std::vector<Tensor> tensors = tensors_to_write(q);
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : tensors) ptrs.push_back(&t);
  write_safetensors(dir + "/" + kWeightsFile, ptrs, {{"format", "pt"}, {"quantization", q.recipe.name()}});
  write_text(dir + "/config.json", hf_config_to_json(q.model.config).dump(2) + "\n");
  json meta = q.recipe_json;
  // config.json has no field for GGUF's per-frequency RoPE divisors (Llama-3.1 rope_freqs); they travel here.
  const std::vector<double>& divisors = q.model.config.rope_scaling.freq_divisors;
  meta["rope_freq_divisors"] = divisors.empty() ? json(nullptr) : json(divisors);
  const std::string tok = write_tokenizer(q.model, dir, tokenizer_file);
  meta["tokenizer"] = tok.empty() ? json(nullptr) : json(tok);
  write_text(dir + "/" + kQuantFile, meta.dump(2) + "\n");
}

bool is_quantized_checkpoint(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && is_file(path + "/" + kQuantFile);
}

QuantizedModel load_quantized_checkpoint(const std::string& dir) {
  const std::string qpath = dir + "/" + kQuantFile;
  check(is_file(qpath), dir, ": not a quantised checkpoint (", qpath, " not found)");
  QuantizedModel q;
  q.recipe_json = read_json_file(qpath);
  const json& j = q.recipe_json;
  check(j.is_object(), qpath, ": is a JSON ", j.type_name(), ", expected an object");
  check(field<std::string>(j, "format", qpath) == kFormatTag, qpath, ": field 'format' is not '", kFormatTag, "'");
  const int version = field<int>(j, "version", qpath);
  check(version == kVersion, qpath, ": version ", version, " is not supported (expected ", kVersion, ")");
  try {
    q.recipe = PrecisionRecipe::parse(field<std::string>(j, "recipe", qpath));
  } catch (const Error& e) {
    fail(qpath, ": field 'recipe': ", e.what());
  }

  const std::string config_path = dir + "/config.json";
  check(is_file(config_path), dir, ": ", config_path, " not found");
  {
    const std::shared_ptr<MappedFile> f = MappedFile::open(config_path);
    q.model.config = parse_hf_config_text(std::string_view(reinterpret_cast<const char*>(f->data()), f->size()),
                                          config_path);
  }
  const auto divisors = j.find("rope_freq_divisors");
  if (divisors != j.end() && !divisors->is_null()) {
    q.model.config.rope_scaling.freq_divisors = field<std::vector<double>>(j, "rope_freq_divisors", qpath);
    q.model.config.validate(qpath);
  }
  q.model.source = dir;
  q.model.format = "quantized";
  const ModelConfig& c = q.model.config;

  const std::string wpath = dir + "/" + kWeightsFile;
  check(is_file(wpath), dir, ": ", wpath, " not found");
  PackedTensors file(load_safetensors(wpath), wpath);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    for (int p = 0; p < ref::kNumProjections; ++p) {
      const std::string name = ref::projection_tensor_name(i, static_cast<ref::Projection>(p));
      const int64_t hd = c.head_dim;
      int64_t n = 0, k = 0;
      switch (static_cast<ref::Projection>(p)) {
        case ref::Projection::Q: n = c.num_attention_heads * hd, k = c.hidden_size; break;
        case ref::Projection::K:
        case ref::Projection::V: n = c.num_key_value_heads * hd, k = c.hidden_size; break;
        case ref::Projection::O: n = c.hidden_size, k = c.num_attention_heads * hd; break;
        case ref::Projection::Gate:
        case ref::Projection::Up: n = c.intermediate_size, k = c.hidden_size; break;
        case ref::Projection::Down: n = c.hidden_size, k = c.intermediate_size; break;
      }
      if (q.recipe.weights == WeightFormat::Full) continue;
      check(!file.has(name), wpath, ": tensor '", name, "' is stored unquantised but the recipe is ", q.recipe.name());
      std::vector<float> deq;
      if (q.recipe.weights == WeightFormat::Fp8) {
        formats::Fp8Matrix m = load_fp8(file, name, n, k);
        deq = formats::fp8_dequantize(m);
        q.fp8.emplace(name, std::move(m));
      } else {
        formats::Int4Weight w = load_int4(file, name, n, k, q.recipe.int4);
        deq = formats::int4_dequantize(w);
        q.int4.emplace(name, std::move(w));
      }
      q.model.tensors[name] = Tensor::from_f32(name, {n, k}, std::move(deq));
    }
  }
  if (q.recipe.head == HeadFormat::Int4) {
    check(!file.has(kLmHeadTensor), wpath, ": tensor '", kLmHeadTensor, "' is stored unquantised but the recipe is ",
          q.recipe.name());
    const formats::Int4Spec spec = head_int4_spec(c.hidden_size, wpath + ": tensor '" + kLmHeadTensor + "'");
    formats::Int4Weight w = load_int4(file, kLmHeadTensor, c.vocab_size, c.hidden_size, spec);
    q.model.tensors[kLmHeadTensor] = Tensor::from_f32(kLmHeadTensor, {c.vocab_size, c.hidden_size},
                                                      formats::int4_dequantize(w));
    q.int4.emplace(kLmHeadTensor, std::move(w));
  }
  for (auto& [name, t] : file.rest()) {
    check(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16, wpath, ": tensor '", name,
          "' has dtype ", dtype_name(t.dtype), " and is not a packed part of this recipe (", q.recipe.name(), ")");
    q.model.tensors.emplace(name, std::move(t));
  }

  const auto tok = j.find("tokenizer");
  if (tok != j.end() && !tok->is_null()) {
    check(tok->is_string(), qpath, ": field 'tokenizer' is a JSON ", tok->type_name(), ", expected a file name");
    const std::string& name = tok->get_ref<const std::string&>();
    check(name == "tokenizer.json" || name == "tokenizer.model" || name == kTokenizerDataFile, qpath,
          ": field 'tokenizer' is '", name, "', expected tokenizer.json, tokenizer.model or ", kTokenizerDataFile);
    const std::string path = dir + "/" + name;
    check(is_file(path), qpath, ": the tokenizer file ", path, " does not exist");
    if (name == kTokenizerDataFile) {
      q.model.tokenizer = tokenizer_data_from_json(read_json_file(path), path);
    } else {
      q.model.tokenizer_path = path;
    }
  }
  q.model.validate();
  return q;
}

}  // namespace futransformer::quant
