// Hugging Face checkpoint I/O: safetensors parsing/writing, config.json, load_hf_model, synthetic checkpoints.
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "futransformer/error.h"
#include "futransformer/io/hf.h"
#include "futransformer/io/safetensors.h"
#include "futransformer/io/synthetic.h"
#include "futransformer/model.h"
#include "test_paths.h"

namespace futransformer {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kSeed = 20240917;

std::vector<uint8_t> bytes_of(const Tensor& t) { return std::vector<uint8_t>(t.data, t.data + t.nbytes()); }

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  f.write(content.data(), static_cast<std::streamsize>(content.size()));
  ASSERT_TRUE(f.good()) << path;
}

// A safetensors file with the given header text and data region (no validation: for malformed inputs).
std::string raw_safetensors(const std::string& header, const std::string& data, uint64_t length_override = 0) {
  const uint64_t n = length_override ? length_override : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

// Runs `fn`, expects an Error whose message contains every string of `needles`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing '" << needles.front() << "'";
  } catch (const Error& e) {
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// ---------- safetensors ----------

TEST(Safetensors, RoundTripsEveryDtypeBitExactly) {
  const std::string dir = test::make_temp_dir("st-roundtrip");
  const std::string path = dir + "/t.safetensors";
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> f32(6 * 5);
  for (float& v : f32) v = normal(rng);
  std::vector<Tensor> tensors;
  tensors.push_back(Tensor::from_f32("a.f32", {6, 5}, f32));
  tensors.push_back(Tensor::from_bytes("b.f16", DType::F16, {3, 7}, random_bytes(42, 1)));  // every bit pattern
  tensors.push_back(Tensor::from_bytes("c.bf16", DType::BF16, {11}, random_bytes(22, 2)));
  tensors.push_back(Tensor::from_bytes("d.i8", DType::I8, {2, 3}, random_bytes(6, 3)));
  tensors.push_back(Tensor::from_bytes("e.i32", DType::I32, {3}, random_bytes(12, 4)));
  tensors.push_back(Tensor::from_bytes("f.u8", DType::U8, {5}, random_bytes(5, 5)));
  tensors.push_back(Tensor::from_bytes("g.empty", DType::F32, {0, 4}, {}));
  tensors.push_back(Tensor::from_bytes("0.written.last", DType::BF16, {2, 2}, random_bytes(8, 6)));
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : tensors) ptrs.push_back(&t);
  write_safetensors(path, ptrs, {{"format", "pt"}, {"note", "hello"}});

  std::map<std::string, std::string> meta;
  const std::vector<Tensor> back = load_safetensors(path, &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hello"}}));
  ASSERT_EQ(back.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {  // returned in data order = the order written
    EXPECT_EQ(back[i].name, tensors[i].name);
    EXPECT_EQ(back[i].dtype, tensors[i].dtype) << tensors[i].name;
    EXPECT_EQ(back[i].shape, tensors[i].shape) << tensors[i].name;
    EXPECT_EQ(bytes_of(back[i]), bytes_of(tensors[i])) << tensors[i].name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(back[i].data) % dtype_size(back[i].dtype), 0u) << tensors[i].name;
  }
  EXPECT_EQ(back[0].to_f32(), f32);
  // The header is padded with spaces so that the data region starts 8-byte aligned.
  std::ifstream f(path, std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, MisalignedTensorIsCopiedAndExact) {
  const std::vector<uint8_t> payload = random_bytes(12, 11);
  // Header of 7 bytes... padded so that the data region starts at an odd address inside an aligned buffer.
  std::string header = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}})";
  const std::string file = raw_safetensors(header, std::string(1, 'z') + std::string(payload.begin(), payload.end()));
  auto buffer = std::make_shared<std::vector<uint64_t>>((file.size() + 7) / 8);
  std::memcpy(buffer->data(), file.data(), file.size());
  const auto* data = reinterpret_cast<const uint8_t*>(buffer->data());
  const std::vector<Tensor> t = parse_safetensors(buffer, data, file.size(), "mem");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t[0].data) % 4, 0u);
  EXPECT_EQ(bytes_of(t[0]), payload);
}

struct BadFile {
  const char* label;
  std::string content;
  std::vector<std::string> needles;  // besides the path
};

TEST(Safetensors, MalformedFilesNameThePathAndTensor) {
  const std::string dir = test::make_temp_dir("st-bad");
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string data16(16, '\1');
  const std::vector<BadFile> cases = {
      {"empty", "", {"too short"}},
      {"truncated-length", std::string("\x10\0\0", 3), {"too short"}},
      {"truncated-data", raw_safetensors(ok_header, data16).substr(0, 8 + ok_header.size() + 10), {"'w'", "past"}},
      {"huge-length", raw_safetensors(ok_header, data16, uint64_t{1} << 40), {"header length"}},
      {"length-past-end", raw_safetensors(ok_header, data16, 5000), {"header length", "past the end"}},
      {"not-json", raw_safetensors("{\"w\": nope", ""), {"not valid JSON"}},
      {"json-array", raw_safetensors("[1, 2, 3]", ""), {"array", "expected an object"}},
      {"entry-not-object", raw_safetensors(R"({"w": 3})", ""), {"'w'", "expected an object"}},
      {"unknown-dtype-f64", raw_safetensors(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", data16),
       {"'w'", "F64"}},
      {"unknown-dtype-fp8", raw_safetensors(R"({"w":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]}})", data16),
       {"'w'", "F8_E4M3"}},
      {"dtype-not-string", raw_safetensors(R"({"w":{"dtype":4,"shape":[4],"data_offsets":[0,16]}})", data16),
       {"'w'", "dtype"}},
      {"missing-field", raw_safetensors(R"({"w":{"dtype":"F32","shape":[4]}})", data16), {"'w'", "data_offsets"}},
      {"negative-dim", raw_safetensors(R"({"w":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", data16),
       {"'w'", "negative"}},
      {"float-dim", raw_safetensors(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,16]}})", data16),
       {"'w'", "shape"}},
      {"shape-not-array", raw_safetensors(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", data16),
       {"'w'", "shape"}},
      {"shape-overflow",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", ""),
       {"'w'", "overflow"}},
      {"offsets-count", raw_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", data16),
       {"'w'", "data_offsets"}},
      {"offsets-negative", raw_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[-16,0]}})", data16),
       {"'w'", "negative"}},
      {"offsets-reversed", raw_safetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", data16),
       {"'w'", "before begin"}},
      {"offsets-past-end", raw_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})", data16),
       {"'w'", "past the end"}},
      {"size-mismatch", raw_safetensors(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data16),
       {"'w'", "needs 12"}},
      {"overlap",
       raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       data16),
       {"'a'", "'b'", "overlap"}},
      {"metadata-not-string", raw_safetensors(R"({"__metadata__":{"k":1}})", ""), {"'k'", "string"}},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = dir + "/" + c.label + ".safetensors";
    write_file(path, c.content);
    std::vector<std::string> needles = c.needles;
    needles.push_back(path);
    expect_error([&] { load_safetensors(path); }, needles);
  }
}

TEST(Safetensors, WriterErrorsNameThePath) {
  const Tensor t = Tensor::from_f32("w", {2}, {1.f, 2.f});
  expect_error([&] { write_safetensors("/nonexistent-dir/x.safetensors", {&t}); },
               {"/nonexistent-dir/x.safetensors", "cannot create"});
  // /dev/full fails every write with ENOSPC, as a full disk does.
  if (test::file_exists("/dev/full")) {
    expect_error([&] { write_safetensors("/dev/full", {&t}); }, {"/dev/full", "No space left"});
    EXPECT_TRUE(test::file_exists("/dev/full"));
  }
  const std::string dir = test::make_temp_dir("st-writer");
  expect_error([&] { write_safetensors(dir + "/dup.safetensors", {&t, &t}); }, {"'w'", "duplicate"});
}

TEST(Safetensors, StreamingWriterChecksByteCounts) {
  const std::string dir = test::make_temp_dir("st-stream");
  const std::string path = dir + "/s.safetensors";
  const std::vector<SafetensorsEntry> entries = {{"a", DType::BF16, {3, 4}}, {"b", DType::F32, {5}}};
  const std::vector<uint8_t> bytes = random_bytes(24 + 20, 9);
  {
    SafetensorsWriter w(path, entries);
    for (size_t i = 0; i < bytes.size(); i += 5) w.append(bytes.data() + i, std::min<size_t>(5, bytes.size() - i));
    EXPECT_THROW(w.append(bytes.data(), 1), Error);
    EXPECT_FALSE(test::file_exists(path)) << "the file appears only when finished";
    w.finish();
    EXPECT_EQ(fs::file_size(path), w.file_size());
    EXPECT_EQ(w.file_size(), SafetensorsWriter::planned_size(entries));
  }
  const std::vector<Tensor> back = load_safetensors(path);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(bytes_of(back[0]), std::vector<uint8_t>(bytes.begin(), bytes.begin() + 24));
  EXPECT_EQ(bytes_of(back[1]), std::vector<uint8_t>(bytes.begin() + 24, bytes.end()));

  const std::string partial = dir + "/partial.safetensors";
  {
    SafetensorsWriter w(partial, entries);
    w.append(bytes.data(), 10);
    expect_error([&] { w.finish(); }, {partial, "only"});
  }
  EXPECT_FALSE(test::file_exists(partial)) << "an unfinished file must be removed";
}

TEST(Safetensors, OverwritingKeepsLoadedTensorsIntact) {
  const std::string path = test::make_temp_dir("st-overwrite") + "/w.safetensors";
  const Tensor a = Tensor::from_bytes("w", DType::BF16, {4096}, random_bytes(8192, 21));
  const Tensor b = Tensor::from_bytes("w", DType::BF16, {2048}, random_bytes(4096, 22));
  write_safetensors(path, {&a});
  const std::vector<Tensor> old = load_safetensors(path);
  write_safetensors(path, {&b});  // a smaller file: truncating the mapped one in place would fault
  EXPECT_EQ(bytes_of(old.at(0)), bytes_of(a));
  EXPECT_EQ(bytes_of(load_safetensors(path).at(0)), bytes_of(b));
}

// ---------- config.json ----------

// Meta's Llama-3.1-8B config.json as published on the Hugging Face hub.
const char* kLlama31_8bConfig = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

TEST(HfConfig, MetaLlama31ConfigMatchesSyntheticPreset) {
  const ModelConfig c = parse_hf_config_text(kLlama31_8bConfig, "config.json");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  expect_same_config(synthetic_config("llama-3.1-8b"), c);
}

TEST(HfConfig, SyntheticPresetsHaveMetasValues) {
  const ModelConfig c8 = synthetic_config("llama-3.1-8b");
  EXPECT_EQ(c8.hidden_size, 4096);
  EXPECT_EQ(c8.intermediate_size, 14336);
  EXPECT_EQ(c8.num_hidden_layers, 32);
  EXPECT_EQ(c8.num_attention_heads, 32);
  EXPECT_EQ(c8.num_key_value_heads, 8);
  EXPECT_EQ(c8.head_dim, 128);
  EXPECT_EQ(c8.vocab_size, 128256);
  EXPECT_EQ(c8.max_position_embeddings, 131072);
  EXPECT_EQ(c8.rope_theta, 500000.0);
  EXPECT_EQ(c8.rope_scaling.type, "llama3");
  EXPECT_EQ(c8.rope_scaling.factor, 8.0);
  EXPECT_EQ(c8.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c8.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c8.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c8.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c8.tie_word_embeddings);
  EXPECT_EQ(c8.bos_token_id, 128000);
  EXPECT_EQ(c8.eos_token_id, 128001);
  const ModelConfig c70 = synthetic_config("llama-3.1-70b");
  EXPECT_EQ(c70.hidden_size, 8192);
  EXPECT_EQ(c70.intermediate_size, 28672);
  EXPECT_EQ(c70.num_hidden_layers, 80);
  EXPECT_EQ(c70.num_attention_heads, 64);
  EXPECT_EQ(c70.num_key_value_heads, 8);
  EXPECT_EQ(c70.head_dim, 128);
  EXPECT_EQ(c70.vocab_size, 128256);
  EXPECT_EQ(c70.rope_scaling.factor, 8.0);
  const ModelConfig tiny = synthetic_config("tiny");
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.intermediate_size, 176);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_attention_heads, 4);
  EXPECT_EQ(tiny.num_key_value_heads, 2);
  EXPECT_EQ(tiny.vocab_size, 512);
  EXPECT_EQ(tiny.max_position_embeddings, 512);
  EXPECT_TRUE(tiny.rope_scaling.type.empty());
  EXPECT_TRUE(tiny.tie_word_embeddings);
  expect_error([] { synthetic_config("llama-4"); }, {"llama-4", "llama-3.1-8b", "llama-3.1-70b", "tiny"});
}

TEST(HfConfig, ToJsonRoundTrips) {
  for (const std::string& name : synthetic_config_names()) {
    SCOPED_TRACE(name);
    const ModelConfig c = synthetic_config(name);
    const json j = hf_config_to_json(c);
    EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
    expect_same_config(parse_hf_config_text(j.dump(), "roundtrip"), c);
  }
}

TEST(HfConfig, DefaultsFollowTransformers) {
  const ModelConfig c = parse_hf_config_text(
      R"({"hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 6,
          "vocab_size": 1000, "eos_token_id": [7, 8], "rope_scaling": null})",
      "cfg");
  EXPECT_EQ(c.num_key_value_heads, 6);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_id, 7);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.rope_scaling.type.empty());
}

TEST(HfConfig, ErrorsNameTheField) {
  json base = json::parse(kLlama31_8bConfig);
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j);
    return j;
  };
  struct Case {
    const char* label;
    json config;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"missing hidden_size", with([](json& j) { j.erase("hidden_size"); }), {"hidden_size", "missing"}},
      {"string hidden_size", with([](json& j) { j["hidden_size"] = "4096"; }), {"hidden_size", "an integer"}},
      {"float layers", with([](json& j) { j["num_hidden_layers"] = 32.5; }), {"num_hidden_layers", "an integer"}},
      {"yarn", with([](json& j) { j["rope_scaling"]["rope_type"] = "yarn"; }), {"rope_scaling", "yarn"}},
      {"legacy type key", with([](json& j) {
         j["rope_scaling"].erase("rope_type");
         j["rope_scaling"]["type"] = "dynamic";
       }),
       {"rope_scaling", "dynamic"}},
      {"rope factor string", with([](json& j) { j["rope_scaling"]["factor"] = "8"; }),
       {"rope_scaling.factor", "a number"}},
      {"kv heads", with([](json& j) { j["num_key_value_heads"] = 5; }), {"num_key_value_heads", "multiple"}},
      {"model_type", with([](json& j) { j["model_type"] = "mistral"; }), {"model_type", "mistral"}},
      {"architectures", with([](json& j) { j["architectures"] = json::array({"GPT2LMHeadModel"}); }),
       {"architectures", "GPT2LMHeadModel"}},
      {"tie string", with([](json& j) { j["tie_word_embeddings"] = "no"; }), {"tie_word_embeddings", "true or false"}},
      {"eos empty", with([](json& j) { j["eos_token_id"] = json::array(); }), {"eos_token_id", "empty"}},
      {"eos negative", with([](json& j) { j["eos_token_id"] = -3; }), {"eos_token_id", "-3"}},
      {"biases", with([](json& j) { j["attention_bias"] = true; }), {"attention_bias"}},
      {"activation", with([](json& j) { j["hidden_act"] = "gelu"; }), {"hidden_act", "gelu"}},
      {"huge", with([](json& j) { j["vocab_size"] = uint64_t{1} << 63; }), {"vocab_size"}},
      {"top-level array", json::array({1, 2}), {"expected an object"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    std::vector<std::string> needles = c.needles;
    needles.push_back("my/config.json");
    expect_error([&] { parse_hf_config(c.config, "my/config.json"); }, needles);
  }
  expect_error([] { parse_hf_config_text("{\"hidden_size\": ", "my/config.json"); },
               {"my/config.json", "not valid JSON"});
}

// ---------- load_hf_model and synthetic checkpoints ----------

void expect_matches_synthetic(const Model& m, int outliers, uint64_t seed) {
  for (const auto& [name, t] : m.tensors) {
    const Tensor want = synthetic_tensor(m.config, name, outliers, seed);
    EXPECT_EQ(t.dtype, DType::BF16) << name;
    EXPECT_EQ(t.shape, want.shape) << name;
    EXPECT_EQ(bytes_of(t), bytes_of(want)) << name;
  }
}

TEST(HfModel, SyntheticTinyRoundTrip) {
  const std::string dir = test::make_temp_dir("hf-tiny") + "/model";
  const ModelConfig config = synthetic_config("tiny");
  write_synthetic_model(config, dir, 3, kSeed);
  const Model m = load_hf_model(dir);
  EXPECT_EQ(m.format, "hf");
  EXPECT_EQ(m.source, dir);
  EXPECT_EQ(m.tokenizer_path, "");
  expect_same_config(m.config, config);
  // 2 layers x 9 tensors + embedding + final norm (tied: no lm_head).
  EXPECT_EQ(m.tensors.size(), 20u);
  EXPECT_FALSE(m.has("lm_head.weight"));
  EXPECT_EQ(m.get("model.layers.1.mlp.down_proj.weight").shape, (std::vector<int64_t>{64, 176}));
  EXPECT_EQ(m.get("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{32, 64}));
  expect_matches_synthetic(m, 3, kSeed);

  std::map<std::string, std::string> meta;
  load_safetensors(dir + "/model.safetensors", &meta);
  EXPECT_EQ(json::parse(meta.at("futransformer.outlier_channels")).get<std::vector<int64_t>>(),
            synthetic_outlier_channels(64, 3, kSeed).channels);
  EXPECT_EQ(meta.at("futransformer.seed"), std::to_string(kSeed));

  expect_error([&] { write_synthetic_model(config, dir, 3, kSeed); }, {dir + "/config.json", "already exists"});

  write_file(dir + "/tokenizer.model", "x");
  EXPECT_EQ(load_hf_model(dir).tokenizer_path, dir + "/tokenizer.model");
  write_file(dir + "/tokenizer.json", "{}");
  EXPECT_EQ(load_hf_model(dir).tokenizer_path, dir + "/tokenizer.json");
}

TEST(HfModel, SyntheticIsDeterministicInTheSeed) {
  const std::string root = test::make_temp_dir("hf-det");
  ModelConfig config = synthetic_config("tiny");
  config.tie_word_embeddings = false;
  write_synthetic_model(config, root + "/a", 2, 1);
  write_synthetic_model(config, root + "/b", 2, 1);
  write_synthetic_model(config, root + "/c", 2, 2);
  const Model a = load_hf_model(root + "/a"), b = load_hf_model(root + "/b"), c = load_hf_model(root + "/c");
  ASSERT_TRUE(a.has("lm_head.weight"));
  for (const auto& [name, t] : a.tensors) {
    EXPECT_EQ(bytes_of(t), bytes_of(b.get(name))) << name;
    EXPECT_NE(bytes_of(t), bytes_of(c.get(name))) << name;
  }
  expect_matches_synthetic(a, 2, 1);
}

TEST(HfModel, SyntheticWeightsHaveRealisticScale) {
  const ModelConfig config = synthetic_config("tiny");
  // Statistical tolerance: the std of n samples has relative error ~1/sqrt(2n) (~1% for n = 11264); BF16
  // rounding adds 2^-9 relative. 5% is many sigmas away from both and still catches a wrong scale.
  constexpr double kStdTolerance = 0.05;
  for (const char* name : {"model.layers.0.mlp.gate_proj.weight", "model.embed_tokens.weight"}) {
    const std::vector<float> v = synthetic_tensor(config, name, 0, kSeed).to_f32();
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double(x) * x;
    const double mean = sum / v.size(), std = std::sqrt(sq / v.size() - mean * mean);
    EXPECT_NEAR(std, 0.02, 0.02 * kStdTolerance) << name;
    EXPECT_NEAR(mean, 0.0, 0.002) << name;
  }
  const std::vector<float> norm = synthetic_tensor(config, "model.norm.weight", 0, kSeed).to_f32();
  for (float x : norm) EXPECT_TRUE(x > 0.6f && x < 1.4f) << x;
}

TEST(HfModel, OutlierChannelsDominateProjectionInputs) {
  const ModelConfig config = synthetic_config("tiny");
  constexpr int kOutliers = 3;
  const OutlierChannels oc = synthetic_outlier_channels(config.hidden_size, kOutliers, kSeed);
  ASSERT_EQ(oc.channels.size(), 3u);
  EXPECT_EQ(std::adjacent_find(oc.channels.begin(), oc.channels.end()), oc.channels.end());
  for (float s : oc.scales) EXPECT_TRUE(s >= 20.f && s <= 50.f) << s;
  EXPECT_NE(synthetic_outlier_channels(config.hidden_size, kOutliers, kSeed + 1).channels, oc.channels);

  const std::vector<float> emb = synthetic_tensor(config, "model.embed_tokens.weight", kOutliers, kSeed).to_f32();
  const int64_t h = config.hidden_size;
  for (const char* norm_name : {"model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"}) {
    SCOPED_TRACE(norm_name);
    const std::vector<float> w = synthetic_tensor(config, norm_name, kOutliers, kSeed).to_f32();
    // Mean |RMSNorm(x) * w| per channel over many token embeddings: what q/k/v or gate/up see.
    std::vector<double> mag(h, 0.0);
    const int64_t tokens = 256;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* x = emb.data() + t * h;
      double ms = 0;
      for (int64_t c = 0; c < h; ++c) ms += double(x[c]) * x[c];
      const double inv = 1.0 / std::sqrt(ms / h + config.rms_norm_eps);
      for (int64_t c = 0; c < h; ++c) mag[c] += std::fabs(x[c] * inv * w[c]) / tokens;
    }
    std::vector<double> normal;
    for (int64_t c = 0; c < h; ++c) {
      if (std::find(oc.channels.begin(), oc.channels.end(), c) == oc.channels.end()) normal.push_back(mag[c]);
    }
    std::sort(normal.begin(), normal.end());
    const double median = normal[normal.size() / 2], largest_normal = normal.back();
    for (int64_t c : oc.channels) {
      EXPECT_GT(mag[c], 10.0 * median) << "channel " << c;
      EXPECT_GT(mag[c], 5.0 * largest_normal) << "channel " << c;
    }
  }
  // Without outliers no channel stands out.
  const std::vector<float> plain = synthetic_tensor(config, "model.layers.0.input_layernorm.weight", 0, kSeed).to_f32();
  EXPECT_LT(*std::max_element(plain.begin(), plain.end()), 1.4f);
  expect_error([&] { synthetic_outlier_channels(64, 65, 1); }, {"65", "hidden_size"});
}

// Writes `tensors` into an HF directory split over two shards with a hand-written index.
void write_two_shards(const std::string& dir, const ModelConfig& config, const std::vector<Tensor>& tensors,
                      json index_map_override = nullptr) {
  fs::create_directories(dir);
  write_file(dir + "/config.json", hf_config_to_json(config).dump());
  std::vector<const Tensor*> first, second;
  json weight_map = json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    (i % 2 ? second : first).push_back(&tensors[i]);
    weight_map[tensors[i].name] = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", first);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", second);
  if (!index_map_override.is_null()) weight_map = index_map_override;
  write_file(dir + "/model.safetensors.index.json", json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
}

std::vector<Tensor> tiny_tensors(const ModelConfig& config, uint64_t seed) {
  std::vector<Tensor> out;
  const std::string dir = test::make_temp_dir("hf-src") + "/m";
  write_synthetic_model(config, dir, 0, seed);
  const Model m = load_hf_model(dir);
  for (const auto& [name, t] : m.tensors) out.push_back(synthetic_tensor(config, name, 0, seed));
  return out;
}

TEST(HfModel, ShardedRoundTripWithHandWrittenIndex) {
  const ModelConfig config = synthetic_config("tiny");
  std::vector<Tensor> tensors = tiny_tensors(config, kSeed);
  tensors.push_back(Tensor::from_f32("model.layers.0.self_attn.rotary_emb.inv_freq", {8},
                                     {1, .5f, .25f, .125f, .0625f, .03125f, .015625f, .0078125f}));
  const std::string dir = test::make_temp_dir("hf-shard") + "/m";
  write_two_shards(dir, config, tensors);
  const Model m = load_hf_model(dir);
  EXPECT_FALSE(m.has("model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_EQ(m.tensors.size(), tensors.size() - 1);
  expect_matches_synthetic(m, 0, kSeed);
}

TEST(HfModel, SyntheticWriterShards) {
  const std::string dir = test::make_temp_dir("hf-synth-shard") + "/m";
  ModelConfig config = synthetic_config("tiny");
  config.tie_word_embeddings = false;
  constexpr uint64_t kShardLimit = 100'000;  // the embedding alone is 65 KB: several shards
  write_synthetic_model(config, dir, 1, kSeed, kShardLimit);
  EXPECT_FALSE(test::file_exists(dir + "/model.safetensors"));
  const json index = json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GE(files.size(), 3u);
  for (const std::string& f : files) EXPECT_LE(fs::file_size(dir + "/" + f), kShardLimit) << f;
  const Model m = load_hf_model(dir);
  EXPECT_EQ(m.tensors.size(), 21u);
  expect_matches_synthetic(m, 1, kSeed);
}

TEST(HfModel, BrokenDirectoriesAreReported) {
  const ModelConfig config = synthetic_config("tiny");
  const std::vector<Tensor> tensors = tiny_tensors(config, kSeed);
  const std::string root = test::make_temp_dir("hf-broken");
  auto single = [&](const std::string& name, const ModelConfig& cfg, const std::vector<const Tensor*>& ts) {
    const std::string dir = root + "/" + name;
    fs::create_directories(dir);
    write_file(dir + "/config.json", hf_config_to_json(cfg).dump());
    write_safetensors(dir + "/model.safetensors", ts);
    return dir;
  };
  std::vector<const Tensor*> all;
  for (const Tensor& t : tensors) all.push_back(&t);

  {  // missing tensor
    std::vector<const Tensor*> some;
    for (const Tensor* t : all) {
      if (t->name != "model.layers.1.mlp.down_proj.weight") some.push_back(t);
    }
    const std::string dir = single("missing", config, some);
    expect_error([&] { load_hf_model(dir); }, {dir, "model.layers.1.mlp.down_proj.weight", "missing"});
  }
  {  // wrong shape: q_proj transposed-size replaced by a [64, 32] tensor
    std::vector<const Tensor*> some;
    const Tensor bad = Tensor::from_bytes("model.layers.0.self_attn.q_proj.weight", DType::BF16, {64, 32},
                                          random_bytes(64 * 32 * 2, 3));
    for (const Tensor* t : all) some.push_back(t->name == bad.name ? &bad : t);
    const std::string dir = single("shape", config, some);
    expect_error([&] { load_hf_model(dir); }, {dir, "q_proj", "[64, 32]", "[64, 64]"});
  }
  {  // integer dtype where a weight belongs
    std::vector<const Tensor*> some;
    const Tensor bad = Tensor::from_bytes("model.norm.weight", DType::I8, {64}, random_bytes(64, 3));
    for (const Tensor* t : all) some.push_back(t->name == bad.name ? &bad : t);
    const std::string dir = single("dtype", config, some);
    expect_error([&] { load_hf_model(dir); }, {dir, "model.norm.weight", "I8"});
  }
  {  // untied but no lm_head
    ModelConfig untied = config;
    untied.tie_word_embeddings = false;
    const std::string dir = single("untied", untied, all);
    expect_error([&] { load_hf_model(dir); }, {dir, "lm_head.weight", "tie_word_embeddings"});
  }
  {  // no weights at all
    const std::string dir = root + "/empty";
    fs::create_directories(dir);
    write_file(dir + "/config.json", hf_config_to_json(config).dump());
    expect_error([&] { load_hf_model(dir); }, {dir, "model.safetensors"});
    expect_error([&] { load_hf_model(root + "/nothing-here"); }, {root + "/nothing-here", "config.json"});
  }
  {  // bad config.json text
    const std::string dir = root + "/badcfg";
    fs::create_directories(dir);
    write_file(dir + "/config.json", "{\"hidden_size\": 64,");
    expect_error([&] { load_hf_model(dir); }, {dir + "/config.json", "not valid JSON"});
  }
  {  // a shard file is missing
    const std::string dir = root + "/shard-missing";
    write_two_shards(dir, config, tensors);
    fs::remove(dir + "/model-00002-of-00002.safetensors");
    expect_error([&] { load_hf_model(dir); }, {"model-00002-of-00002.safetensors", "does not exist"});
  }
  {  // the index lists a tensor its shard lacks
    json map = json::object();
    for (size_t i = 0; i < tensors.size(); ++i) {
      map[tensors[i].name] = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    map["model.extra.weight"] = "model-00001-of-00002.safetensors";
    const std::string dir = root + "/shard-lacks";
    write_two_shards(dir, config, tensors, map);
    expect_error([&] { load_hf_model(dir); }, {"model-00001-of-00002.safetensors", "model.extra.weight", "absent"});
  }
  for (const char* escape : {"../outside.safetensors", "sub/x.safetensors", ".."}) {
    SCOPED_TRACE(escape);
    json map = json::object();
    for (const Tensor& t : tensors) map[t.name] = "model-00001-of-00002.safetensors";
    map["model.norm.weight"] = escape;
    const std::string dir = root + "/escape" + std::to_string(std::strlen(escape));
    write_two_shards(dir, config, tensors, map);
    expect_error([&] { load_hf_model(dir); }, {dir + "/model.safetensors.index.json", "model.norm.weight", escape});
  }
}

TEST(HfModel, SyntheticWriterChecksFreeSpace) {
  const std::string dir = test::make_temp_dir("hf-space");
  struct statvfs st {};
  ASSERT_EQ(::statvfs(dir.c_str(), &st), 0);
  const double free_bytes = double(st.f_bavail) * st.f_frsize;
  // An embedding of 2^31-1 rows x 2^20 columns in BF16 is 4.5 PB: more than any test machine has free.
  ModelConfig huge = synthetic_config("tiny");
  huge.vocab_size = (int64_t{1} << 31) - 1;
  huge.hidden_size = int64_t{1} << 20;
  ASSERT_LT(free_bytes, 4e15) << "this test assumes less than 4 PB free";
  expect_error([&] { write_synthetic_model(huge, dir + "/m", 0, 1); }, {dir + "/m", "needs", "GB free"});
  EXPECT_FALSE(test::file_exists(dir + "/m/config.json"));
}

}  // namespace
}  // namespace futransformer
