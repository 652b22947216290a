// Quantised checkpoints: write → load is byte-exact for every packed tensor and gives the same logits; load_model
// reads the directory as a plain model; every malformed file is one Error naming the file and the tensor/field.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/io/safetensors.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/reference_engine.h"
#include "test_paths.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {

using quant::CalibrationSet;
using quant::QuantizedModel;
using quant::QuantizeOptions;

QuantizedModel quantise(const Model& m, const std::string& recipe) {
  QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse(recipe);
  std::mt19937 rng(3);
  CalibrationSet c;
  c.source = "test";
  for (int i = 0; i < 3; ++i) c.windows.push_back(test::random_token_ids(48, m.config.vocab_size, rng));
  return quant::quantize_model(m, c, o);
}

std::vector<float> logits(const Engine& e_const, const std::vector<int32_t>& tokens) {
  Engine& e = const_cast<Engine&>(e_const);
  const SequenceChunk chunk{0, tokens};
  return e.forward(std::span<const SequenceChunk>(&chunk, 1), true)[0];
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(QuantizedCheckpoint, WriteThenLoadIsByteExactWithEqualLogits) {
  const Model m = test::make_tiny_llama({}, 1);
  std::mt19937 rng(2);
  const std::vector<int32_t> tokens = test::random_token_ids(30, m.config.vocab_size, rng);
  for (const std::string recipe : {"int4-gptq-g32", "int4-rtn-g64-asym-bf16+kv-int4-hadamard", "fp8+act-fp8+kv-fp8",
                                   "full+kv-bf16"}) {
    const QuantizedModel q = quantise(m, recipe);
    const std::string dir = test::scratch_dir("qckpt");
    quant::write_quantized_checkpoint(q, dir);
    const QuantizedModel l = quant::load_quantized_checkpoint(dir);
    EXPECT_EQ(l.recipe.name(), recipe);
    EXPECT_EQ(l.model.format, "quantized");
    EXPECT_EQ(l.recipe_json.at("recipe"), recipe);
    ASSERT_EQ(l.int4.size(), q.int4.size()) << recipe;
    ASSERT_EQ(l.fp8.size(), q.fp8.size()) << recipe;
    for (const auto& [name, w] : q.int4) {
      const formats::Int4Weight& g = l.int4.at(name);
      EXPECT_EQ(g.qweight, w.qweight) << name;
      EXPECT_EQ(g.scales, w.scales) << name;
      EXPECT_EQ(g.zeros, w.zeros) << name;
      EXPECT_EQ(g.group, w.group) << name;
    }
    for (const auto& [name, w] : q.fp8) {
      EXPECT_EQ(l.fp8.at(name).codes, w.codes) << name;
      EXPECT_EQ(l.fp8.at(name).scales, w.scales) << name;
    }
    ASSERT_EQ(l.model.tensors.size(), q.model.tensors.size());
    for (const auto& [name, t] : q.model.tensors) {
      const Tensor& g = l.model.get(name);
      EXPECT_EQ(g.dtype, t.dtype) << name;
      EXPECT_EQ(g.shape, t.shape) << name;
      EXPECT_EQ(std::memcmp(g.data, t.data, t.nbytes()), 0) << name;
    }
    const auto want = logits(*quant::make_reference_engine(q), tokens);
    const auto got = logits(*quant::make_reference_engine(l), tokens);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << recipe;
    // load_model gives the same dequantised model.
    const Model plain = load_model(dir);
    EXPECT_EQ(plain.format, "quantized");
    EXPECT_EQ(std::memcmp(plain.get("model.layers.1.mlp.down_proj.weight").data,
                          q.model.get("model.layers.1.mlp.down_proj.weight").data,
                          q.model.get("model.layers.1.mlp.down_proj.weight").nbytes()),
              0);
  }
}

TEST(QuantizedCheckpoint, RopeFrequencyDivisorsSurvive) {
  Model m = test::make_tiny_llama({}, 5);
  for (int i = 0; i < 16; ++i) m.config.rope_scaling.freq_divisors.push_back(1.0 + 0.25 * i);
  const std::string dir = test::scratch_dir("qckpt");
  const QuantizedModel q = quantise(m, "int4-rtn-g32");
  quant::write_quantized_checkpoint(q, dir);
  const QuantizedModel l = quant::load_quantized_checkpoint(dir);
  EXPECT_EQ(l.model.config.rope_scaling.freq_divisors, m.config.rope_scaling.freq_divisors);
  std::mt19937 rng(1);
  const std::vector<int32_t> tokens = test::random_token_ids(20, m.config.vocab_size, rng);
  const auto want = logits(*quant::make_reference_engine(q), tokens);
  const auto got = logits(*quant::make_reference_engine(l), tokens);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);

  std::string j = slurp(dir + "/quantization.json");
  const size_t at = j.find("\"rope_freq_divisors\"");
  ASSERT_NE(at, std::string::npos);
  j.replace(at, j.find(']', at) - at + 1, "\"rope_freq_divisors\": [1, 2]");
  write_file(dir + "/quantization.json", j);
  const std::string msg = error_of([&] { quant::load_quantized_checkpoint(dir); });
  EXPECT_NE(msg.find("quantization.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 RoPE frequency divisors"), std::string::npos) << msg;
}

TEST(QuantizedCheckpoint, PackedTensorNamesDtypesAndShapes) {
  const Model m = test::make_tiny_llama({}, 2);
  const std::string dir = test::scratch_dir("qckpt");
  quant::write_quantized_checkpoint(quantise(m, "int4-rtn-g32-asym-bf16"), dir);
  std::map<std::string, Tensor> t;
  for (Tensor& x : load_safetensors(dir + "/model.safetensors")) t.emplace(x.name, std::move(x));
  const std::string p = "model.layers.0.self_attn.q_proj";
  EXPECT_EQ(t.count(p + ".weight"), 0u);
  EXPECT_EQ(t.at(p + ".qweight").dtype, DType::U8);
  EXPECT_EQ(t.at(p + ".qweight").shape, (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(t.at(p + ".scales").dtype, DType::BF16);
  EXPECT_EQ(t.at(p + ".scales").shape, (std::vector<int64_t>{128, 2}));
  EXPECT_EQ(t.at(p + ".zeros").dtype, DType::U8);
  EXPECT_EQ(t.at("model.layers.1.mlp.down_proj.qweight").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(t.at("model.embed_tokens.weight").dtype, DType::F32);

  const std::string dir8 = test::scratch_dir("qckpt");
  quant::write_quantized_checkpoint(quantise(m, "fp8"), dir8);
  std::map<std::string, Tensor> f;
  for (Tensor& x : load_safetensors(dir8 + "/model.safetensors")) f.emplace(x.name, std::move(x));
  EXPECT_EQ(f.at(p + ".fp8").dtype, DType::U8);
  EXPECT_EQ(f.at(p + ".fp8").shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(f.at(p + ".fp8_scale").dtype, DType::F32);
  EXPECT_EQ(f.at(p + ".fp8_scale").shape, (std::vector<int64_t>{128}));
}

TEST(QuantizedCheckpoint, TokenizerTravelsWithTheCheckpoint) {
  Model m = test::make_tiny_llama({}, 3);
  TokenizerData td;
  td.model = "gpt2";
  td.pre = "smollm";
  td.tokens = {"a", "b", "ab"};
  td.scores = {0.5f, -1.0f, 2.0f};
  td.token_types = {1, 1, 3};
  td.merges = {"a b"};
  td.bos_id = 2;
  td.eos_id = 1;
  td.add_bos = true;
  m.tokenizer = td;
  const std::string dir = test::scratch_dir("qckpt");
  quant::write_quantized_checkpoint(quantise(m, "int4-rtn-g32"), dir);
  const Model l = load_model(dir);
  ASSERT_TRUE(l.tokenizer.has_value());
  EXPECT_EQ(l.tokenizer->tokens, td.tokens);
  EXPECT_EQ(l.tokenizer->scores, td.scores);
  EXPECT_EQ(l.tokenizer->token_types, td.token_types);
  EXPECT_EQ(l.tokenizer->merges, td.merges);
  EXPECT_EQ(l.tokenizer->pre, "smollm");
  EXPECT_EQ(l.tokenizer->bos_id, 2);
  EXPECT_TRUE(l.tokenizer->add_bos);

  // A tokenizer file given explicitly (the model has none) is copied; JSON ones keep the HF name.
  Model bare = test::make_tiny_llama({}, 3);
  const std::string tok_dir = test::scratch_dir("tok");
  write_file(tok_dir + "/tok.bin", std::string("\x05\0\0\0binary", 10));
  const std::string dir2 = test::scratch_dir("qckpt");
  quant::write_quantized_checkpoint(quantise(bare, "fp8"), dir2, tok_dir + "/tok.bin");
  EXPECT_EQ(slurp(dir2 + "/tokenizer.model"), slurp(tok_dir + "/tok.bin"));
  EXPECT_EQ(load_model(dir2).tokenizer_path, dir2 + "/tokenizer.model");
  write_file(tok_dir + "/tokenizer.json", "  {\"model\": {}}");
  const std::string dir3 = test::scratch_dir("qckpt");
  quant::write_quantized_checkpoint(quantise(bare, "fp8"), dir3, tok_dir + "/tokenizer.json");
  EXPECT_EQ(load_model(dir3).tokenizer_path, dir3 + "/tokenizer.json");
}

// Rewrites model.safetensors with `edit` applied to its tensors.
void edit_weights(const std::string& dir, const std::function<void(std::vector<Tensor>&)>& edit) {
  std::vector<Tensor> t = load_safetensors(dir + "/model.safetensors");
  edit(t);
  std::vector<const Tensor*> ptrs;
  for (const Tensor& x : t) ptrs.push_back(&x);
  write_safetensors(dir + "/model.safetensors", ptrs);
}

void replace_tensor(std::vector<Tensor>& ts, const std::string& name, Tensor replacement) {
  for (Tensor& t : ts)
    if (t.name == name) t = std::move(replacement);
}

TEST(QuantizedCheckpoint, MalformedFilesGiveOneClearError) {
  const Model m = test::make_tiny_llama({}, 4);
  const QuantizedModel asym = quantise(m, "int4-rtn-g32-asym");
  const QuantizedModel fp8 = quantise(m, "fp8");
  const std::string q = "model.layers.1.self_attn.k_proj";
  const struct Case {
    const char* what;
    const QuantizedModel* source;
    std::function<void(const std::string& dir)> corrupt;
    std::vector<std::string> expected;
  } cases[] = {
      {"not JSON", &asym, [](const std::string& d) { write_file(d + "/quantization.json", "{oops"); },
       {"quantization.json", "not valid JSON"}},
      {"not an object", &asym, [](const std::string& d) { write_file(d + "/quantization.json", "[1]"); },
       {"quantization.json", "expected an object"}},
      {"wrong tag", &asym,
       [](const std::string& d) { write_file(d + "/quantization.json", R"({"format": "x", "version": 1})"); },
       {"quantization.json", "'format'"}},
      {"version", &asym,
       [](const std::string& d) {
         write_file(d + "/quantization.json", R"({"format": "futransformer-quantized", "version": 2})");
       },
       {"quantization.json", "version 2"}},
      {"bad recipe", &asym,
       [](const std::string& d) {
         write_file(d + "/quantization.json",
                    R"({"format": "futransformer-quantized", "version": 1, "recipe": "int4-rtn-g48"})");
       },
       {"quantization.json", "'recipe'", "g48"}},
      {"recipe is a number", &asym,
       [](const std::string& d) {
         write_file(d + "/quantization.json", R"({"format": "futransformer-quantized", "version": 1, "recipe": 4})");
       },
       {"quantization.json", "'recipe'"}},
      {"missing qweight", &asym,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           std::erase_if(t, [&](const Tensor& x) { return x.name == q + ".qweight"; });
         });
       },
       {"model.safetensors", q + ".qweight", "missing"}},
      {"missing zeros", &asym,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           std::erase_if(t, [&](const Tensor& x) { return x.name == q + ".zeros"; });
         });
       },
       {"model.safetensors", q + ".zeros", "missing"}},
      {"scales of the wrong dtype", &asym,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           replace_tensor(t, q + ".scales", Tensor::from_f32(q + ".scales", {64, 2}, std::vector<float>(128, 1.0f)));
         });
       },
       {"model.safetensors", q + ".scales", "expected F16 [64, 2]"}},
      {"qweight of the wrong shape", &asym,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           replace_tensor(t, q + ".qweight",
                          Tensor::from_bytes(q + ".qweight", DType::U8, {64, 31}, std::vector<uint8_t>(64 * 31)));
         });
       },
       {"model.safetensors", q + ".qweight", "[64, 31]", "expected U8 [64, 32]"}},
      {"zero-point out of range", &asym,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           replace_tensor(t, q + ".zeros",
                          Tensor::from_bytes(q + ".zeros", DType::U8, {64, 2}, std::vector<uint8_t>(128, 16)));
         });
       },
       {"model.safetensors", q + ".zeros", "zero-point 16"}},
      {"unquantised projection left in", &asym,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           t.push_back(Tensor::from_f32(q + ".weight", {64, 64}, std::vector<float>(64 * 64, 0.5f)));
         });
       },
       {"model.safetensors", q + ".weight", "stored unquantised"}},
      {"stray packed tensor", &asym,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           t.push_back(Tensor::from_bytes("model.layers.0.extra.qweight", DType::U8, {2}, {1, 2}));
         });
       },
       {"model.safetensors", "model.layers.0.extra.qweight", "not a packed part"}},
      {"fp8 NaN code", &fp8,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           std::vector<uint8_t> codes(64 * 64, 0x38);
           codes[77] = 0x7F;
           replace_tensor(t, q + ".fp8", Tensor::from_bytes(q + ".fp8", DType::U8, {64, 64}, codes));
         });
       },
       {"model.safetensors", q + ".fp8", "NaN code"}},
      {"fp8 zero scale", &fp8,
       [&](const std::string& d) {
         edit_weights(d, [&](std::vector<Tensor>& t) {
           replace_tensor(t, q + ".fp8_scale", Tensor::from_f32(q + ".fp8_scale", {64}, std::vector<float>(64, 0.0f)));
         });
       },
       {"model.safetensors", q + ".fp8_scale", "positive finite scale"}},
      {"tokenizer path escapes", &asym,
       [](const std::string& d) {
         std::string j = slurp(d + "/quantization.json");
         j.replace(j.find("\"tokenizer\": null"), 17, "\"tokenizer\": \"../x\"");
         write_file(d + "/quantization.json", j);
       },
       {"quantization.json", "'tokenizer'", "../x"}},
      {"no weights", &asym, [](const std::string& d) { std::remove((d + "/model.safetensors").c_str()); },
       {"model.safetensors", "not found"}},
  };
  for (const Case& c : cases) {
    const std::string dir = test::scratch_dir("qbad");
    quant::write_quantized_checkpoint(*c.source, dir);
    c.corrupt(dir);
    const std::string msg = error_of([&] { quant::load_quantized_checkpoint(dir); });
    for (const std::string& want : c.expected)
      EXPECT_NE(msg.find(want), std::string::npos) << c.what << ": '" << want << "' not in: " << msg;
    EXPECT_EQ(error_of([&] { load_model(dir); }), msg) << c.what;
  }
}

}  // namespace
}  // namespace futransformer
