// head-int4 (the LM head as INT4 RTN, symmetric, BF16 scales): the recipe part, the head's group rule, the row
// padding the GPU upload uses, quantisation of tied and untied heads, the checkpoint round trip, the reference
// engine's INT4 head (close to the full head, yet not equal to it; BF16 logits under act-bf16), the GPU memory
// estimate and the `quantize --head` flag.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/eval/report.h"
#include "futransformer/formats/int4.h"
#include "futransformer/io/safetensors.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"
#include "futransformer/reference_engine.h"
#include "test_paths.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {

// Expected size of the INT4 head's error, from the format: a symmetric group's step is s = 2·amax/15 and rounding
// to nearest leaves an error uniform in [−s/2, s/2] (RMS s/√12). The tiny models' heads are Gaussian (N(0, σ²)
// draws); the largest |x| of a 64-value group is about 2.4σ, and 3σ bounds it for nearly every group. So the head's
// relative RMS weight error is at most 2·3/(15·√12) ≈ 0.115 — and so is the logits' relative L2 error, because the
// errors are independent of the (normalised) input: ||x·Eᵀ||² ≈ ||x||²·E[e²] against ||x·Wᵀ||² ≈ ||x||²·σ².
constexpr double kAmaxOverSigma = 3.0;
const double kInt4RelRms = 2.0 * kAmaxOverSigma / 15.0 / std::sqrt(12.0);
const double kMaxHeadRelL2 = 1.5 * kInt4RelRms;  // margin for the amax spread between groups
// A head that is not the quantised one gives exactly 0 (the full head) — the INT4 head's error is ~0.09.
constexpr double kMinHeadRelL2 = 0.02;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

quant::QuantizedModel quantise(const Model& m, const std::string& recipe) {
  quant::QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse(recipe);
  return quant::quantize_model(m, quant::CalibrationSet{}, o);
}

std::vector<float> all_logits(Engine& e, const std::vector<int32_t>& tokens) {
  const SequenceChunk chunk{0, tokens};
  return e.forward(std::span<const SequenceChunk>(&chunk, 1), true)[0];
}

Model tiny(bool tied, uint32_t seed = 11) {
  test::TinyLlama s;
  s.tied = tied;
  return test::make_tiny_llama(s, seed);
}

bool is_bf16_value(float x) { return bf16_to_f32(f32_to_bf16(x)) == x; }

TEST(HeadInt4Recipe, EveryCombinationRoundTrips) {
  int checked = 0;
  for (const std::string w : {"full", "fp8", "int4-rtn-g32", "int4-gptq-g128-bf16", "int4-rtn-gch-asym"}) {
    for (const std::string act : {"", "+act-fp8", "+act-bf16", "+act-fp8-bf16", "+act-fp8-block-bf16"}) {
      for (const std::string kv : {"", "+kv-int4", "+kv-int4-hadamard"}) {
        const std::string text = w + "+head-int4" + act + kv;
        const PrecisionRecipe r = PrecisionRecipe::parse(text);
        EXPECT_EQ(r.head, HeadFormat::Int4) << text;
        EXPECT_EQ(r.name(), text);
        EXPECT_EQ(PrecisionRecipe::parse(r.name()).name(), text);
        EXPECT_EQ(PrecisionRecipe::parse(w + act + kv).head, HeadFormat::Full) << w + act + kv;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 5 * 5 * 3);
  // Any order on input; name() puts the head right after the weights.
  EXPECT_EQ(PrecisionRecipe::parse("kv-int4+head-int4+act-bf16+int4-rtn-g64").name(),
            "int4-rtn-g64+head-int4+act-bf16+kv-int4");
  EXPECT_EQ(PrecisionRecipe::parse("head-int4").name(), "full+head-int4");
  EXPECT_FALSE(PrecisionRecipe::parse("full+head-int4").is_full_precision());
  EXPECT_TRUE(PrecisionRecipe::parse("full+head-int4").quantises_weights());
  EXPECT_FALSE(PrecisionRecipe::parse("full+act-bf16+kv-int4").quantises_weights());
  EXPECT_TRUE(PrecisionRecipe::parse("fp8").quantises_weights());
}

TEST(HeadInt4Recipe, MistakesGiveClearErrors) {
  EXPECT_NE(error_of([] { PrecisionRecipe::parse("head-int4+full+head-int4"); }).find("two LM-head formats"),
            std::string::npos);
  for (const char* bad : {"full+head-fp8", "head-int4-g64", "head-bf16"}) {
    const std::string e = error_of([&] { PrecisionRecipe::parse(bad); });
    EXPECT_NE(e.find("only low-precision format is head-int4"), std::string::npos) << bad << ": " << e;
  }
  // The list of choices names the part.
  EXPECT_NE(error_of([] { PrecisionRecipe::parse("lm-int4"); }).find("LM head: head-int4"), std::string::npos);
}

TEST(HeadInt4Spec, LargestW4A16GroupDividingHidden) {
  const struct {
    int64_t hidden, group;
  } cases[] = {{4096, 128}, {8192, 128}, {2880, 64}, {64, 64}, {576, 64}, {96, 32}, {288, 32}};
  for (const auto& c : cases) {
    const formats::Int4Spec s = head_int4_spec(c.hidden, "test");
    EXPECT_EQ(s.group_size, c.group) << c.hidden;
    EXPECT_TRUE(s.symmetric);
    EXPECT_EQ(s.scale_type, formats::ScaleType::BF16);
  }
  for (const int64_t bad : {48, 100, 0}) {
    const std::string e = error_of([&] { head_int4_spec(bad, "model.bin: LM head"); });
    EXPECT_NE(e.find("model.bin: LM head"), std::string::npos) << e;
    EXPECT_NE(e.find(std::to_string(bad)), std::string::npos) << e;
  }
}

TEST(Int4PadRows, NewRowsAreZerosAndOldRowsUnchanged) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const bool symmetric : {true, false}) {
    const int64_t rows = 61, cols = 64;
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (float& x : w) x = d(rng);
    formats::Int4Spec spec;
    spec.group_size = 32;
    spec.symmetric = symmetric;
    spec.scale_type = formats::ScaleType::BF16;
    const formats::Int4Weight q = formats::int4_quantize_rtn(w, rows, cols, spec, "w");
    const formats::Int4Weight p = formats::int4_pad_rows(q, 64);
    ASSERT_EQ(p.rows, 64);
    ASSERT_EQ(p.qweight.size(), static_cast<size_t>(64 * cols / 2));
    ASSERT_EQ(p.scales.size(), static_cast<size_t>(64 * 2));
    EXPECT_EQ(p.zeros.size(), symmetric ? 0u : static_cast<size_t>(64 * 2));
    EXPECT_TRUE(std::equal(q.qweight.begin(), q.qweight.end(), p.qweight.begin()));
    EXPECT_TRUE(std::equal(q.scales.begin(), q.scales.end(), p.scales.begin()));
    const std::vector<float> dq = formats::int4_dequantize(q), dp = formats::int4_dequantize(p);
    for (size_t i = 0; i < dq.size(); ++i) ASSERT_EQ(dp[i], dq[i]) << i;
    for (size_t i = dq.size(); i < dp.size(); ++i) {
      ASSERT_EQ(dp[i], 0.0f) << i;
      ASSERT_FALSE(std::signbit(dp[i])) << i;
    }
    EXPECT_EQ(formats::int4_pad_rows(q, rows).qweight, q.qweight);  // nothing to pad: a plain copy
    EXPECT_NE(error_of([&] { formats::int4_pad_rows(q, rows - 1); }).find("fewer"), std::string::npos);
  }
}

class HeadInt4Tied : public ::testing::TestWithParam<bool> {};

TEST_P(HeadInt4Tied, QuantiseRoundsTheHeadToNearest) {
  const bool tied = GetParam();
  const Model m = tiny(tied);
  const quant::QuantizedModel q = quantise(m, "int4-rtn-g32+head-int4");
  // The head's source: the embedding when tied (its lookup stays full precision, bit for bit).
  const Tensor& src = m.get(tied ? "model.embed_tokens.weight" : "lm_head.weight");
  const formats::Int4Spec spec = head_int4_spec(m.config.hidden_size, "test");
  const formats::Int4Weight want =
      formats::int4_quantize_rtn(src.to_f32(), m.config.vocab_size, m.config.hidden_size, spec, "want");
  ASSERT_EQ(q.int4.count(kLmHeadTensor), 1u);
  const formats::Int4Weight& got = q.int4.at(kLmHeadTensor);
  EXPECT_EQ(got.group, 64);
  EXPECT_TRUE(got.spec.symmetric);
  EXPECT_EQ(got.spec.scale_type, formats::ScaleType::BF16);
  EXPECT_EQ(got.qweight, want.qweight);
  EXPECT_EQ(got.scales, want.scales);
  EXPECT_EQ(q.model.get(kLmHeadTensor).to_f32(), formats::int4_dequantize(want));
  EXPECT_EQ(q.model.get("model.embed_tokens.weight").to_f32(), m.get("model.embed_tokens.weight").to_f32());
  EXPECT_EQ(q.model.config.tie_word_embeddings, tied);
  // Projections as without the head part; the record names the head's format and source.
  const quant::QuantizedModel q0 = quantise(m, "int4-rtn-g32");
  EXPECT_EQ(q0.int4.count(kLmHeadTensor), 0u);
  EXPECT_EQ(q.int4.size(), q0.int4.size() + 1);
  EXPECT_EQ(q.recipe_json["tensors"][kLmHeadTensor]["format"], "int4");
  EXPECT_EQ(q.recipe_json["tensors"][kLmHeadTensor]["group_size"], 64);
  EXPECT_EQ(q.recipe_json["lm_head"]["source"], tied ? "model.embed_tokens.weight" : "lm_head.weight");
  EXPECT_EQ(q0.recipe_json["lm_head"], "as stored");
}

TEST_P(HeadInt4Tied, CheckpointRoundTripKeepsTheHead) {
  const Model m = tiny(GetParam());
  for (const std::string recipe : {"int4-rtn-g32+head-int4", "full+head-int4+act-bf16"}) {
    const quant::QuantizedModel q = quantise(m, recipe);
    const std::string dir = test::scratch_dir("headint4");
    quant::write_quantized_checkpoint(q, dir);
    bool packed = false, plain = false;
    for (const Tensor& t : load_safetensors(dir + "/model.safetensors")) {
      packed = packed || t.name == "lm_head.qweight";
      plain = plain || t.name == kLmHeadTensor;
      if (t.name == "lm_head.scales") EXPECT_EQ(t.dtype, DType::BF16);
    }
    EXPECT_TRUE(packed) << recipe;
    EXPECT_FALSE(plain) << recipe << ": the head is stored packed only";
    const quant::QuantizedModel back = quant::load_quantized_checkpoint(dir);
    EXPECT_EQ(back.recipe.name(), recipe);
    ASSERT_EQ(back.int4.count(kLmHeadTensor), 1u) << recipe;
    EXPECT_EQ(back.int4.at(kLmHeadTensor).qweight, q.int4.at(kLmHeadTensor).qweight);
    EXPECT_EQ(back.int4.at(kLmHeadTensor).scales, q.int4.at(kLmHeadTensor).scales);
    EXPECT_EQ(back.model.get(kLmHeadTensor).to_f32(), q.model.get(kLmHeadTensor).to_f32());
    EXPECT_EQ(back.model.get("model.embed_tokens.weight").to_f32(), q.model.get("model.embed_tokens.weight").to_f32());
    // Same logits from the loaded checkpoint as from the in-memory quantisation (both with the recipe's options).
    std::mt19937 rng(2);
    const std::vector<int32_t> prompt = test::random_token_ids(9, m.config.vocab_size, rng);
    const std::unique_ptr<Engine> a = quant::make_reference_engine(q), b = quant::make_reference_engine(back);
    EXPECT_EQ(all_logits(*a, prompt), all_logits(*b, prompt)) << recipe;
  }
}

TEST_P(HeadInt4Tied, ReferenceHeadIsCloseToFullButQuantised) {
  const Model m = tiny(GetParam());
  const quant::QuantizedModel q = quantise(m, "int4-rtn-g32+head-int4");
  const quant::QuantizedModel q0 = quantise(m, "int4-rtn-g32");  // the same projections, the full head
  const std::unique_ptr<Engine> e = quant::make_reference_engine(q), e0 = quant::make_reference_engine(q0);
  std::mt19937 rng(9);
  const std::vector<int32_t> prompt = test::random_token_ids(24, m.config.vocab_size, rng);
  const std::vector<float> got = all_logits(*e, prompt), full = all_logits(*e0, prompt);
  const double err = test::relative_l2(got, full);
  std::printf("INT4 head vs full head: logits rel L2 %.4f (expected about %.3f, bound %.3f)\n", err,
              kInt4RelRms * 2.4 / kAmaxOverSigma, kMaxHeadRelL2);
  EXPECT_LE(err, kMaxHeadRelL2);
  EXPECT_GE(err, kMinHeadRelL2) << "the INT4 head is not the one running";
}

TEST_P(HeadInt4Tied, Bf16ActivationsRoundTheInt4HeadsLogits) {
  const Model m = tiny(GetParam());
  std::mt19937 rng(4);
  const std::vector<int32_t> prompt = test::random_token_ids(16, m.config.vocab_size, rng);
  const auto count_non_bf16 = [&](const std::string& recipe) {
    const quant::QuantizedModel q = quantise(m, recipe);
    const std::unique_ptr<Engine> e = quant::make_reference_engine(q);
    int n = 0;
    for (float x : all_logits(*e, prompt)) n += !is_bf16_value(x);
    return n;
  };
  // act-bf16 + head-int4: the W4A16 GEMM writes BF16 logits, so the twin's are BF16 values, every one.
  EXPECT_EQ(count_non_bf16("int4-rtn-g32+head-int4+act-bf16"), 0);
  EXPECT_EQ(count_non_bf16("full+head-int4+act-fp8-bf16"), 0);
  EXPECT_EQ(count_non_bf16("full+head-int4+act-fp8-block-bf16"), 0);
  // The BF16 head's cuBLAS GEMM writes fp32, and fp32 activations round nothing.
  EXPECT_GT(count_non_bf16("int4-rtn-g32+act-bf16"), 100);
  EXPECT_GT(count_non_bf16("int4-rtn-g32+head-int4"), 100);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, HeadInt4Tied, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

TEST(HeadInt4Reference, OptionWithoutAQuantisedHeadIsAnError) {
  ReferenceOptions o;
  o.head = HeadFormat::Int4;
  const std::string e = error_of([&] { make_reference_engine(tiny(true), o); });
  EXPECT_NE(e.find("lm_head.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("head-int4"), std::string::npos) << e;
}

TEST(HeadInt4Reference, PrefillAndDecodeMustShareTheHeadFormat) {
  const quant::QuantizedModel q = quantise(tiny(false), "int4-rtn-g32+head-int4");
  const quant::QuantizedModel q8 = quantise(tiny(false), "fp8+act-fp8-bf16");
  const std::string e = error_of([&] { quant::make_prefill_decode_reference_engine(q8, q); });
  EXPECT_NE(e.find("LM head"), std::string::npos) << e;
  EXPECT_NE(e.find("head-int4"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { quant::make_prefill_decode_reference_engine(quantise(tiny(false), "fp8+head-int4"), q); }),
            "(no error)");
}

TEST(HeadInt4Quantise, NoGroupDividingHiddenFailsBeforeWork) {
  test::TinyLlama s;
  s.hidden = 48;
  s.head_dim = 12;
  const Model m = test::make_tiny_llama(s, 1);
  const std::string e = error_of([&] { quantise(m, "full+head-int4"); });
  EXPECT_NE(e.find("LM head"), std::string::npos) << e;
  EXPECT_NE(e.find("48"), std::string::npos) << e;
  EXPECT_NE(eval::recipe_model_mismatch(m.config, PrecisionRecipe::parse("full+head-int4")).find("48"),
            std::string::npos);
  EXPECT_EQ(eval::recipe_model_mismatch(tiny(false).config, PrecisionRecipe::parse("full+head-int4")), "");
}

TEST(HeadInt4Checkpoint, RecipeWithoutThePackedHeadIsAnError) {
  const std::string dir = test::scratch_dir("headint4");
  quant::write_quantized_checkpoint(quantise(tiny(true), "int4-rtn-g32"), dir);
  const std::string qpath = dir + "/quantization.json";
  std::stringstream text;
  text << std::ifstream(qpath).rdbuf();
  std::string j = text.str();
  const std::string from = "\"recipe\": \"int4-rtn-g32\"";
  ASSERT_NE(j.find(from), std::string::npos);
  j.replace(j.find(from), from.size(), "\"recipe\": \"int4-rtn-g32+head-int4\"");
  std::ofstream(qpath, std::ios::trunc) << j;
  const std::string e = error_of([&] { quant::load_quantized_checkpoint(dir); });
  EXPECT_NE(e.find("lm_head.qweight"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

// The estimate counts the INT4 head (rows padded to 32 as the engine uploads them) instead of the BF16 one.
TEST(HeadInt4Estimate, CountsTheInt4HeadInsteadOfBf16) {
  for (const bool tied : {true, false}) {
    const ModelConfig c = tiny(tied).config;  // vocab 61 → 64 rows, hidden 64 → group 64
    const eval::GpuMemoryEstimate a = eval::estimate_gpu_memory(c, PrecisionRecipe::parse("int4-rtn-g32"), 1, 64);
    const eval::GpuMemoryEstimate b =
        eval::estimate_gpu_memory(c, PrecisionRecipe::parse("int4-rtn-g32+head-int4"), 1, 64);
    const int64_t int4_head = 64 * 64 / 2 + 64 * 1 * 2, bf16_head = tied ? 0 : 61 * 64 * 2;
    EXPECT_EQ(b.weights - a.weights, int4_head - bf16_head) << tied;
    EXPECT_EQ(b.activations - a.activations, 2 * 16 * 64) << "BF16 logits of 16 head rows";
  }
}

class CliQuantizeHead : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::shared_path("models/stories260K/");
    if (!test::file_exists(dir_ + "stories260K.bin") || !test::file_exists(dir_ + "tok512.bin"))
      GTEST_SKIP() << "missing test file: " << dir_ << "stories260K.bin / tok512.bin";
  }
  std::string model() const {
    return test::quote(dir_ + "stories260K.bin") + " --tokenizer " + test::quote(dir_ + "tok512.bin");
  }
  std::string dir_;
};

TEST_F(CliQuantizeHead, HeadFlagWritesAnInt4HeadThatInfoAndGenerateRead) {
  const std::string out = test::scratch_dir("q260k-head");
  const test::CliResult r = test::run_cli("quantize -q --model " + model() + " --out " + out +
                                          " --weights int4-rtn --group-size ch --head int4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("int4-rtn-gch+head-int4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("+ INT4 LM head"), std::string::npos) << r.out;
  const test::CliResult info = test::run_cli("info --model " + out);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("LM head:                  INT4 RTN, symmetric, BF16 scales, group 64"), std::string::npos)
      << info.out;
  const test::CliResult g =
      test::run_cli("generate --device cpu --model " + out + " --prompt 'Once upon a time' --temperature 0 -n 10");
  EXPECT_EQ(g.exit_code, 0) << g.err;

  const test::CliResult full_weights = test::run_cli("quantize -q --model " + model() + " --out " + out +
                                                     " --recipe full+head-int4");
  EXPECT_EQ(full_weights.exit_code, 0) << full_weights.err;
  const test::CliResult both =
      test::run_cli("quantize --model " + model() + " --out " + out + " --recipe int4-rtn-gch --head int4");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("--head"), std::string::npos) << both.err;
  const test::CliResult bad = test::run_cli("quantize --model " + model() + " --out " + out + " --head fp8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--head"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace futransformer
