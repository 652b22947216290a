// Synthetic checkpoints. Weights are a pure function of (seed, tensor name, element index) through a
// counter-based generator, so any chunk of any tensor can be produced independently: the writer streams
// multi-gigabyte tensors in small chunks, in parallel, and synthetic_tensor() reproduces them exactly.
#include "futransformer/io/synthetic.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "futransformer/error.h"
#include "futransformer/io/hf.h"
#include "futransformer/io/safetensors.h"

namespace futransformer {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr float kLinearStd = 0.02f;      // initializer_range of Llama configs; trained weights are similar
constexpr float kEmbeddingStd = 0.02f;
constexpr float kNormJitterStd = 0.1f;   // trained RMSNorm weights scatter around 1
constexpr float kOutlierScaleMin = 20.0f, kOutlierScaleMax = 50.0f;
constexpr size_t kChunkElements = size_t{1} << 20;

// splitmix64's output function: a bijective mix good enough for weights, ~1 ns per value.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Unit-variance, bell-shaped value from one 64-bit draw: the sum of its four 16-bit fields (Irwin-Hall, n=4,
// variance 4/12) rescaled. Bounded at +-2*sqrt(3), which keeps BF16 weights free of accidental outliers.
inline float unit_normalish(uint64_t r) {
  const uint32_t sum = static_cast<uint32_t>(r & 0xffff) + static_cast<uint32_t>((r >> 16) & 0xffff) +
                       static_cast<uint32_t>((r >> 32) & 0xffff) + static_cast<uint32_t>(r >> 48);
  constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(3) / 2^16
  return (static_cast<float>(sum) + 2.0f - 2.0f * 65536.0f) * kScale;
}

// f32_to_bf16 (round to nearest even) for finite values, which ours always are; inline because it runs for
// each of billions of weights.
inline uint16_t finite_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

enum class Kind { Linear, Embedding, Norm, OutlierNorm };

struct PlannedTensor {
  SafetensorsEntry entry;
  Kind kind;
  uint64_t key;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Outlier rule: n distinct hidden channels are drawn by a partial Fisher-Yates shuffle of [0, hidden) driven
// by mix64(seed-derived counter), each with a scale in [20, 50]. Every layer's input_layernorm and
// post_attention_layernorm weight is multiplied by that scale at those channels, so the normalised activations
// entering q/k/v_proj and gate/up_proj carry 20-50x larger values in a few fixed channels, as in real Llama
// models (the property activation-aware quantisers must cope with). Embeddings and model.norm are not scaled.
class Generator {
 public:
  Generator(const ModelConfig& c, int outlier_channels, uint64_t seed)
      : seed_(seed), outliers_(synthetic_outlier_channels(c.hidden_size, outlier_channels, seed)) {
    norm_scale_.assign(static_cast<size_t>(c.hidden_size), 1.0f);
    for (size_t i = 0; i < outliers_.channels.size(); ++i) {
      norm_scale_[static_cast<size_t>(outliers_.channels[i])] = outliers_.scales[i];
    }
  }

  const OutlierChannels& outliers() const { return outliers_; }

  PlannedTensor plan(const std::string& name, std::vector<int64_t> shape) const {
    Kind kind = Kind::Linear;
    if (name == "model.embed_tokens.weight") {
      kind = Kind::Embedding;
    } else if (ends_with(name, "input_layernorm.weight") || ends_with(name, "post_attention_layernorm.weight")) {
      kind = Kind::OutlierNorm;
    } else if (ends_with(name, "norm.weight")) {
      kind = Kind::Norm;
    }
    return {{name, DType::BF16, std::move(shape)}, kind, mix64(seed_ ^ fnv1a(name))};
  }

  void fill(const PlannedTensor& t, uint64_t first, size_t count, uint16_t* out) const {
    // Every value is base + std * g, times the channel scale for the outlier norms.
    const bool norm = t.kind == Kind::Norm || t.kind == Kind::OutlierNorm;
    const float base = norm ? 1.0f : 0.0f;
    const float std = norm ? kNormJitterStd : t.kind == Kind::Embedding ? kEmbeddingStd : kLinearStd;
    const float* scale = t.kind == Kind::OutlierNorm ? norm_scale_.data() : nullptr;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (count >= 65536)
#endif
    for (int64_t j = 0; j < static_cast<int64_t>(count); ++j) {
      const uint64_t i = first + static_cast<uint64_t>(j);
      const float v = base + std * unit_normalish(mix64(t.key + (i + 1) * kGolden));
      out[j] = finite_to_bf16(scale ? v * scale[i] : v);
    }
  }

 private:
  uint64_t seed_;
  OutlierChannels outliers_;
  std::vector<float> norm_scale_;
};

std::vector<PlannedTensor> plan_tensors(const ModelConfig& c, const Generator& gen) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  std::vector<PlannedTensor> out;
  out.push_back(gen.plan("model.embed_tokens.weight", {c.vocab_size, h}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back(gen.plan(p + "input_layernorm.weight", {h}));
    out.push_back(gen.plan(p + "self_attn.q_proj.weight", {q, h}));
    out.push_back(gen.plan(p + "self_attn.k_proj.weight", {kv, h}));
    out.push_back(gen.plan(p + "self_attn.v_proj.weight", {kv, h}));
    out.push_back(gen.plan(p + "self_attn.o_proj.weight", {h, q}));
    out.push_back(gen.plan(p + "post_attention_layernorm.weight", {h}));
    out.push_back(gen.plan(p + "mlp.gate_proj.weight", {c.intermediate_size, h}));
    out.push_back(gen.plan(p + "mlp.up_proj.weight", {c.intermediate_size, h}));
    out.push_back(gen.plan(p + "mlp.down_proj.weight", {h, c.intermediate_size}));
  }
  out.push_back(gen.plan("model.norm.weight", {h}));
  if (!c.tie_word_embeddings) out.push_back(gen.plan("lm_head.weight", {c.vocab_size, h}));
  return out;
}

// BF16 bytes of a planned tensor. validate() bounds each config field below 2^31, but heads * head_dim * hidden
// can still exceed 64 bits.
uint64_t entry_bytes(const SafetensorsEntry& e) {
  uint64_t n = 2;
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n >= (uint64_t{1} << 62)) {
      fail("synthetic tensor '", e.name, "' is too large (its byte size overflows 62 bits)");
    }
  }
  return n;
}

std::string gb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail(path, ": cannot create file: ", std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !written) fail(path, ": write failed: ", std::strerror(written ? errno : err));
}

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into the plan
  uint64_t file_bytes = 0;
};

}  // namespace

std::vector<std::string> synthetic_config_names() { return {"llama-3.1-8b", "llama-3.1-70b", "tiny"}; }

ModelConfig synthetic_config(const std::string& name) {
  ModelConfig c;
  if (name == "llama-3.1-8b" || name == "llama-3.1-70b") {
    const bool big = name == "llama-3.1-70b";
    c.hidden_size = big ? 8192 : 4096;
    c.intermediate_size = big ? 28672 : 14336;
    c.num_hidden_layers = big ? 80 : 32;
    c.num_attention_heads = big ? 64 : 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 128256;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000.0;
    c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192, {}};
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = false;
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else if (name == "tiny") {
    c.hidden_size = 64;
    c.intermediate_size = 176;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 512;
    c.max_position_embeddings = 512;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = true;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
  } else {
    std::string names;
    for (const std::string& n : synthetic_config_names()) names += (names.empty() ? "" : ", ") + n;
    fail("unknown synthetic model '", name, "' (expected one of: ", names, ")");
  }
  c.validate("synthetic config '" + name + "'");
  return c;
}

OutlierChannels synthetic_outlier_channels(int64_t hidden_size, int outlier_channels, uint64_t seed) {
  check(outlier_channels >= 0 && outlier_channels <= hidden_size, "outlier channel count ", outlier_channels,
        " must be between 0 and hidden_size (", hidden_size, ")");
  std::vector<int64_t> pool(static_cast<size_t>(hidden_size));
  for (int64_t i = 0; i < hidden_size; ++i) pool[static_cast<size_t>(i)] = i;
  const uint64_t key = mix64(seed ^ 0x6f75746c69657273ull);  // "outliers": independent of any tensor's stream
  OutlierChannels out;
  std::vector<std::pair<int64_t, float>> picked;
  for (int j = 0; j < outlier_channels; ++j) {
    const uint64_t r = mix64(key + (2 * static_cast<uint64_t>(j) + 1) * kGolden);
    const uint64_t remaining = static_cast<uint64_t>(hidden_size - j);
    std::swap(pool[static_cast<size_t>(j)], pool[static_cast<size_t>(j + static_cast<int64_t>(r % remaining))]);
    const uint64_t u = mix64(key + (2 * static_cast<uint64_t>(j) + 2) * kGolden) >> 40;  // 24 bits
    const float scale = kOutlierScaleMin + (kOutlierScaleMax - kOutlierScaleMin) * static_cast<float>(u) / 16777216.0f;
    picked.emplace_back(pool[static_cast<size_t>(j)], scale);
  }
  std::sort(picked.begin(), picked.end());
  for (const auto& [channel, scale] : picked) {
    out.channels.push_back(channel);
    out.scales.push_back(scale);
  }
  return out;
}

Tensor synthetic_tensor(const ModelConfig& config, const std::string& name, int outlier_channels, uint64_t seed) {
  config.validate("synthetic config");
  const Generator gen(config, outlier_channels, seed);
  for (const PlannedTensor& t : plan_tensors(config, gen)) {
    if (t.entry.name != name) continue;
    std::vector<uint8_t> bytes(entry_bytes(t.entry));
    gen.fill(t, 0, bytes.size() / 2, reinterpret_cast<uint16_t*>(bytes.data()));
    return Tensor::from_bytes(name, DType::BF16, t.entry.shape, std::move(bytes));
  }
  fail("synthetic model has no tensor '", name, "'");
}

void write_synthetic_model(const ModelConfig& config, const std::string& out_dir, int outlier_channels,
                           uint64_t seed, uint64_t max_shard_bytes) {
  config.validate(out_dir + " (synthetic config)");
  const Generator gen(config, outlier_channels, seed);
  const std::vector<PlannedTensor> plan = plan_tensors(config, gen);

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  check(!ec, out_dir, ": cannot create directory: ", ec.message());
  const std::string config_path = out_dir + "/config.json";
  check(!std::filesystem::exists(config_path, ec), config_path,
        ": already exists; refusing to overwrite a model (choose an empty directory)");

  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"futransformer.generator", "synthetic"},
                                                 {"futransformer.seed", std::to_string(seed)}};
  metadata["futransformer.outlier_channels"] = nlohmann::json(gen.outliers().channels).dump();
  metadata["futransformer.outlier_scales"] = nlohmann::json(gen.outliers().scales).dump();
  metadata["futransformer.outlier_rule"] =
      "input_layernorm and post_attention_layernorm weights multiplied by the scale at each outlier channel";

  // Greedy sharding in tensor order, like transformers' save_pretrained: a tensor larger than the limit gets
  // a shard of its own.
  for (const PlannedTensor& t : plan) entry_bytes(t.entry);  // rejects oversized tensors before planning
  std::vector<Shard> shards(1);
  auto entries_of = [&](const std::vector<size_t>& idx) {
    std::vector<SafetensorsEntry> e;
    for (size_t i : idx) e.push_back(plan[i].entry);
    return e;
  };
  for (size_t i = 0; i < plan.size(); ++i) {
    std::vector<size_t> grown = shards.back().tensors;
    grown.push_back(i);
    const uint64_t size = SafetensorsWriter::planned_size(entries_of(grown), metadata);
    if (size > max_shard_bytes && !shards.back().tensors.empty()) {
      shards.emplace_back();
      shards.back().tensors = {i};
      shards.back().file_bytes = SafetensorsWriter::planned_size(entries_of({i}), metadata);
    } else {
      shards.back().tensors = std::move(grown);
      shards.back().file_bytes = size;
    }
  }
  uint64_t total_file_bytes = 0, total_tensor_bytes = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    shards[s].file = shards.size() == 1 ? "model.safetensors" : name;
    check(!__builtin_add_overflow(total_file_bytes, shards[s].file_bytes, &total_file_bytes), out_dir,
          ": the synthetic checkpoint size overflows 64 bits");
  }
  for (const PlannedTensor& t : plan) {
    check(!__builtin_add_overflow(total_tensor_bytes, entry_bytes(t.entry), &total_tensor_bytes), out_dir,
          ": the synthetic checkpoint size overflows 64 bits");
  }

  struct statvfs fs {};
  check(::statvfs(out_dir.c_str(), &fs) == 0, out_dir, ": cannot query free disk space");
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  const uint64_t needed = total_file_bytes + (1u << 20);  // + config/index files and filesystem slack
  check(needed <= free_bytes, out_dir, ": the synthetic checkpoint needs ", gb(needed), ", ", gb(free_bytes),
        " free");

  std::vector<uint16_t> chunk(kChunkElements);
  nlohmann::json weight_map = nlohmann::json::object();
  for (const Shard& shard : shards) {
    const std::vector<SafetensorsEntry> entries = entries_of(shard.tensors);
    SafetensorsWriter writer(out_dir + "/" + shard.file, entries, metadata);
    for (size_t i : shard.tensors) {
      const uint64_t n = entry_bytes(plan[i].entry) / 2;
      for (uint64_t first = 0; first < n; first += kChunkElements) {
        const size_t count = static_cast<size_t>(std::min<uint64_t>(kChunkElements, n - first));
        gen.fill(plan[i], first, count, chunk.data());
        writer.append(chunk.data(), count * 2);
      }
      weight_map[plan[i].entry.name] = shard.file;
    }
    writer.finish();
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_tensor_bytes}}}, {"weight_map", weight_map}};
    write_text_file(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  // config.json last: its presence marks a complete checkpoint (and blocks overwriting it).
  nlohmann::json cfg = hf_config_to_json(config);
  cfg["torch_dtype"] = "bfloat16";
  write_text_file(config_path, cfg.dump(2) + "\n");
}

}  // namespace futransformer
