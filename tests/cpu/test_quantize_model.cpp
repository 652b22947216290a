// quantize_model on tiny random models: RTN/FP8 equal the format quantisers byte for byte, the engine on a quantised
// model equals the engine on the dequantised weights bit for bit, GPTQ beats RTN on layer outputs, and calibration
// windows are reproducible.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/int4.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/reference_engine.h"
#include "ref/ref_model.h"
#include "test_paths.h"
#include "quant_test_util.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {
using test::random_calibration;
using test::layer_output_error;

using quant::CalibrationSet;
using quant::QuantizedModel;
using quant::QuantizeOptions;

// A byte-level tokenizer: id = 3 + byte % (vocab - 3); BOS = 1. Enough to cut calibration windows.
class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer(int32_t vocab, bool add_bos) : vocab_(vocab), add_bos_(add_bos) {}
  std::vector<int32_t> encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(3 + c % (vocab_ - 3));
    return ids;
  }
  std::string decode(std::span<const int32_t>, bool) const override { return ""; }
  std::string piece(int32_t, int32_t) const override { return ""; }
  int32_t vocab_size() const override { return vocab_; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  bool add_bos() const override { return add_bos_; }

 private:
  int32_t vocab_;
  bool add_bos_;
};

QuantizeOptions options_for(const std::string& recipe) {
  QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse(recipe);
  return o;
}

std::vector<std::string> projection_names(const Model& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.tensors)
    if (is_quantised_projection(name)) out.push_back(name);
  return out;
}

std::vector<float> all_logits(const Engine& e_const, const std::vector<int32_t>& tokens) {
  Engine& e = const_cast<Engine&>(e_const);
  const SequenceChunk chunk{0, tokens};
  std::vector<float> out = e.forward(std::span<const SequenceChunk>(&chunk, 1), true)[0];
  e.reset(0);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(QuantizeModel, RtnAndFp8EqualTheFormatQuantisersByteForByte) {
  const Model m = test::make_tiny_llama({}, 1);
  for (const std::string recipe : {"int4-rtn-g32", "int4-rtn-gch-asym-bf16", "fp8"}) {
    const QuantizedModel q = quant::quantize_model(m, CalibrationSet{}, options_for(recipe));
    EXPECT_EQ(q.recipe.name(), recipe);
    EXPECT_EQ(q.recipe_json.at("recipe"), recipe);
    const std::vector<std::string> names = projection_names(m);
    ASSERT_EQ(names.size(), 14u);
    EXPECT_EQ(q.int4.size() + q.fp8.size(), names.size()) << recipe;
    for (const std::string& name : names) {
      const Tensor& t = m.get(name);
      const std::vector<float> w = t.to_f32();
      std::vector<float> deq;
      if (recipe == "fp8") {
        const formats::Fp8Matrix want = formats::fp8_quantize_weight(w, t.shape[0], t.shape[1], name);
        const formats::Fp8Matrix& got = q.fp8.at(name);
        EXPECT_EQ(got.codes, want.codes) << name;
        EXPECT_EQ(got.scales, want.scales) << name;
        deq = formats::fp8_dequantize(want);
      } else {
        const formats::Int4Weight want = formats::int4_quantize_rtn(w, t.shape[0], t.shape[1], q.recipe.int4, name);
        const formats::Int4Weight& got = q.int4.at(name);
        EXPECT_EQ(got.qweight, want.qweight) << name;
        EXPECT_EQ(got.scales, want.scales) << name;
        EXPECT_EQ(got.zeros, want.zeros) << name;
        deq = formats::int4_dequantize(want);
      }
      EXPECT_TRUE(same_bits(q.model.get(name).to_f32(), deq)) << name;
      EXPECT_EQ(q.recipe_json.at("tensors").at(name).at("format"), recipe == "fp8" ? "fp8" : "int4") << name;
    }
    // Everything else is the source's tensor, bytes shared.
    for (const char* name : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                             "model.layers.1.input_layernorm.weight"})
      EXPECT_EQ(q.model.get(name).data, m.get(name).data) << name;
  }
}

// The engine on a QuantizedModel equals the plain engine on a Model holding the dequantised weights, which the
// test builds itself from the packed forms.
TEST(QuantizeModel, EngineOnQuantisedModelEqualsEngineOnDequantisedWeights) {
  const Model m = test::make_tiny_llama({}, 2);
  std::mt19937 rng(9);
  const std::vector<int32_t> tokens = test::random_token_ids(40, m.config.vocab_size, rng);
  const CalibrationSet calib = random_calibration(4, 64, m.config.vocab_size, 17);
  for (const std::string recipe : {"fp8", "int4-rtn-g64", "int4-gptq-g32-asym"}) {
    const QuantizedModel q = quant::quantize_model(m, calib, options_for(recipe));
    Model by_hand = m;
    for (const auto& [name, w] : q.int4) by_hand.tensors[name] = Tensor::from_f32(name, {w.rows, w.cols},
                                                                                  formats::int4_dequantize(w));
    for (const auto& [name, w] : q.fp8) by_hand.tensors[name] = Tensor::from_f32(name, {w.rows, w.cols},
                                                                                 formats::fp8_dequantize(w));
    const auto got = all_logits(*quant::make_reference_engine(q), tokens);
    const auto want = all_logits(*make_reference_engine(by_hand), tokens);
    EXPECT_TRUE(same_bits(got, want)) << recipe;
    const double change = test::relative_l2(got, all_logits(*make_reference_engine(m), tokens));
    EXPECT_GT(change, 0.0) << recipe;
    EXPECT_LT(change, 0.5) << recipe;
  }
}

TEST(QuantizeModel, GptqLowersLayerOutputErrorVsRtn) {
  test::TinyLlama s;
  s.layers = 3;
  const Model m = test::make_tiny_llama(s, 3);
  const CalibrationSet calib = random_calibration(8, 64, m.config.vocab_size, 5);
  const CalibrationSet held_out = random_calibration(4, 64, m.config.vocab_size, 6);
  for (const char* group : {"g32", "gch"}) {
    const QuantizedModel rtn = quant::quantize_model(m, calib, options_for(std::string("int4-rtn-") + group));
    const QuantizedModel gptq = quant::quantize_model(m, calib, options_for(std::string("int4-gptq-") + group));
    const double e_rtn = layer_output_error(m, rtn.model, held_out.windows);
    const double e_gptq = layer_output_error(m, gptq.model, held_out.windows);
    // Measured: 13-14% lower with these seeds. Random Gaussian weights and nearly isotropic inputs are GPTQ's
    // least favourable case (its gain comes from correlated input channels, which real activations have more of),
    // so demand 5%: a GPTQ that propagated no error, or used the wrong Hessian, lands at RTN's error or above.
    EXPECT_LT(e_gptq, 0.95 * e_rtn) << group << ": gptq " << e_gptq << " rtn " << e_rtn;
  }
}

TEST(QuantizeModel, GptqRecordsItsSettingsAndLosses) {
  const Model m = test::make_tiny_llama({}, 4);
  CalibrationSet calib = random_calibration(3, 50, m.config.vocab_size, 1);
  calib.sha256 = "abc";
  QuantizeOptions o = options_for("int4-gptq-g32");
  o.damp_percent = 0.02;
  o.act_order = true;
  o.seed = 7;
  std::vector<std::string> stages;
  int64_t last_done = 0, last_total = 0;
  const QuantizedModel q = quant::quantize_model(m, calib, o, [&](const std::string& st, int64_t d, int64_t t) {
    stages.push_back(st);
    last_done = d;
    last_total = t;
  });
  EXPECT_EQ(last_done, 14);
  EXPECT_EQ(last_total, 14);
  EXPECT_EQ(stages.back(), "gptq");
  const nlohmann::json& g = q.recipe_json.at("gptq");
  EXPECT_EQ(g.at("device"), "cpu");
  EXPECT_FALSE(g.contains("device_name"));
  EXPECT_EQ(g.at("damp_percent"), 0.02);
  EXPECT_EQ(g.at("act_order"), true);
  EXPECT_EQ(g.at("block_size"), 128);
  EXPECT_EQ(g.at("calibration").at("samples"), 3);
  EXPECT_EQ(g.at("calibration").at("sample_tokens"), 50);
  EXPECT_EQ(g.at("calibration").at("tokens"), 150);
  EXPECT_EQ(g.at("calibration").at("sha256"), "abc");
  EXPECT_EQ(g.at("calibration").at("seed"), 7);
  ASSERT_EQ(g.at("layers").size(), 2u);
  for (const auto& layer : g.at("layers")) {
    EXPECT_EQ(layer.at("tensors").size(), 7u);
    EXPECT_GT(layer.at("loss").get<double>(), 0.0);
  }
  const nlohmann::json& w = q.recipe_json.at("weights");
  EXPECT_EQ(w.at("format"), "int4-gptq");
  EXPECT_EQ(w.at("group_size"), 32);
  EXPECT_EQ(w.at("symmetric"), true);
  EXPECT_EQ(w.at("scale_type"), "f16");
  EXPECT_EQ(q.recipe_json.at("tensors").at("model.embed_tokens.weight").at("format"), "F32");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(QuantizeModel, ClearErrorsBeforeAnyWork) {
  test::TinyLlama s;
  s.inter = 80;  // down_proj has K = 80: groups of 32 and 64 do not divide it
  const Model m = test::make_tiny_llama(s, 5);
  for (const char* recipe : {"int4-rtn-g32", "int4-gptq-g64"}) {
    const std::string msg = error_of([&] { quant::quantize_model(m, CalibrationSet{}, options_for(recipe)); });
    EXPECT_NE(msg.find("model.layers.0.mlp.down_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("80"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(quant::quantize_model(m, CalibrationSet{}, options_for("int4-rtn-gch")));

  const Model ok = test::make_tiny_llama({}, 5);
  EXPECT_NE(error_of([&] { quant::quantize_model(ok, CalibrationSet{}, options_for("int4-gptq-g32")); })
                .find("calibration windows"),
            std::string::npos);
  CalibrationSet bad = random_calibration(2, 10, ok.config.vocab_size, 1);
  bad.windows[1][3] = 1000;
  EXPECT_NE(error_of([&] { quant::quantize_model(ok, bad, options_for("int4-gptq-g32")); }).find("token id 1000"),
            std::string::npos);
  const CalibrationSet too_long = random_calibration(1, 300, ok.config.vocab_size, 1);
  EXPECT_NE(error_of([&] { quant::quantize_model(ok, too_long, options_for("int4-gptq-g32")); })
                .find("longer than the model's context"),
            std::string::npos);
}

std::string write_text_file(const std::string& text) {
  const std::string path = test::scratch_dir("calib") + "/calibration.txt";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(Calibration, WindowsAreSeededAndStartWithBos) {
  std::string text;
  std::mt19937 rng(1);
  for (int i = 0; i < 3000; ++i) text += static_cast<char>('a' + rng() % 26);
  QuantizeOptions o;
  o.calibration_path = write_text_file(text);
  o.samples = 5;
  o.sample_tokens = 100;
  const ByteTokenizer with_bos(61, true), without_bos(61, false);
  const CalibrationSet a = quant::load_calibration(with_bos, o);
  ASSERT_EQ(a.windows.size(), 5u);
  const std::vector<int32_t> ids = with_bos.encode(text, false);
  for (const auto& w : a.windows) {
    ASSERT_EQ(w.size(), 100u);
    EXPECT_EQ(w[0], 1);
    // The rest is a contiguous run of the text's tokens.
    const auto it = std::search(ids.begin(), ids.end(), w.begin() + 1, w.end());
    EXPECT_NE(it, ids.end());
  }
  EXPECT_EQ(a.sha256, sha256_hex(text.data(), text.size()));
  EXPECT_EQ(a.source, o.calibration_path);
  EXPECT_EQ(quant::load_calibration(with_bos, o).windows, a.windows);
  o.seed = 1;
  EXPECT_NE(quant::load_calibration(with_bos, o).windows, a.windows);
  const CalibrationSet b = quant::load_calibration(without_bos, o);
  EXPECT_NE(b.windows[0][0], 1);
  EXPECT_EQ(b.windows[0].size(), 100u);

  o.sample_tokens = 4000;
  EXPECT_NE(error_of([&] { quant::load_calibration(with_bos, o); }).find("fewer than one window"), std::string::npos);
  o.calibration_path = "/nonexistent/calibration.txt";
  EXPECT_NE(error_of([&] { quant::load_calibration(with_bos, o); }).find("/nonexistent/calibration.txt"),
            std::string::npos);
}

TEST(Calibration, GptqFromTextEqualsGptqFromItsWindows) {
  std::string text;
  std::mt19937 rng(2);
  for (int i = 0; i < 2000; ++i) text += static_cast<char>(' ' + rng() % 90);
  const Model m = test::make_tiny_llama({}, 6);
  const ByteTokenizer tok(static_cast<int32_t>(m.config.vocab_size), true);
  QuantizeOptions o = options_for("int4-gptq-g32");
  o.calibration_path = write_text_file(text);
  o.samples = 4;
  o.sample_tokens = 64;
  const QuantizedModel a = quant::quantize_model(m, tok, o);
  const QuantizedModel b = quant::quantize_model(m, quant::load_calibration(tok, o), o);
  for (const auto& [name, w] : a.int4) EXPECT_EQ(w.qweight, b.int4.at(name).qweight) << name;
  EXPECT_EQ(a.recipe_json.at("gptq").at("calibration").at("sha256"), sha256_hex(text.data(), text.size()));
}

TEST(QuantizeModel, EngineForRecipeAppliesActivationAndKvFormats) {
  const Model m = test::make_tiny_llama({}, 7);
  const ByteTokenizer tok(static_cast<int32_t>(m.config.vocab_size), true);
  std::mt19937 rng(1);
  const std::vector<int32_t> tokens = test::random_token_ids(30, m.config.vocab_size, rng);
  for (const std::string recipe : {"fp8+act-fp8+kv-int4-hadamard", "int4-rtn-g32+kv-fp8", "full+kv-bf16", "full"}) {
    const PrecisionRecipe r = PrecisionRecipe::parse(recipe);
    const auto engine = quant::make_reference_engine_for_recipe(m, tok, r, QuantizeOptions{}, 100);
    EXPECT_EQ(engine->max_sequence_length(), 100);
    const QuantizedModel q = quant::quantize_model(m, CalibrationSet{}, options_for(recipe));
    ReferenceOptions ro;
    ro.activations = r.activations;
    ro.kv = r.kv;
    EXPECT_TRUE(same_bits(all_logits(*engine, tokens), all_logits(*make_reference_engine(q.model, ro), tokens)))
        << recipe;
  }
}

}  // namespace
}  // namespace futransformer
