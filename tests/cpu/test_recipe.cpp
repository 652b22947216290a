// PrecisionRecipe text form: every valid combination round-trips, every mistake is one clear Error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/sha256.h"
#include "futransformer/error.h"
#include "futransformer/recipe.h"

namespace futransformer {
namespace {

std::string parse_error(const std::string& text) {
  try {
    PrecisionRecipe::parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Recipe, EveryValidCombinationRoundTrips) {
  std::vector<std::string> weights = {"full", "fp8"};
  for (const char* q : {"int4-rtn", "int4-gptq"})
    for (const char* g : {"g32", "g64", "g128", "gch"})
      for (const char* opt : {"", "-asym", "-bf16", "-asym-bf16"}) weights.push_back(std::string(q) + "-" + g + opt);
  int checked = 0;
  for (const std::string& w : weights) {
    for (const std::string act : {"", "+act-fp8", "+act-bf16", "+act-fp8-bf16", "+act-fp8-block-bf16"}) {
      for (const std::string kv : {"", "+kv-bf16", "+kv-fp8", "+kv-int4", "+kv-int4-hadamard"}) {
        const std::string text = w + act + kv;
        const PrecisionRecipe r = PrecisionRecipe::parse(text);
        EXPECT_EQ(r.name(), text);
        const PrecisionRecipe again = PrecisionRecipe::parse(r.name());
        EXPECT_EQ(again.weights, r.weights);
        EXPECT_EQ(again.activations, r.activations);
        EXPECT_EQ(again.kv, r.kv);
        EXPECT_EQ(again.int4.group_size, r.int4.group_size);
        EXPECT_EQ(again.int4.symmetric, r.int4.symmetric);
        EXPECT_EQ(again.int4.scale_type, r.int4.scale_type);
        ++checked;
      }
    }
  }
  // Every weight format x {fp32, fp8, bf16, fp8-bf16, fp8-block-bf16} activations x 5 caches.
  EXPECT_EQ(checked, (2 + 2 * 4 * 4) * 5 * 5);
}

TEST(Recipe, FieldsAreParsed) {
  const PrecisionRecipe r = PrecisionRecipe::parse("int4-gptq-g64-asym-bf16+kv-int4-hadamard");
  EXPECT_EQ(r.weights, WeightFormat::Int4Gptq);
  EXPECT_EQ(r.int4.group_size, 64);
  EXPECT_FALSE(r.int4.symmetric);
  EXPECT_EQ(r.int4.scale_type, formats::ScaleType::BF16);
  EXPECT_EQ(r.activations, ActivationFormat::Fp32);
  ASSERT_TRUE(r.kv.has_value());
  EXPECT_EQ(*r.kv, formats::KvFormat::INT4_HADAMARD);
  EXPECT_EQ(PrecisionRecipe::parse("int4-rtn-gch").int4.group_size, 0);
  EXPECT_TRUE(PrecisionRecipe::parse("full").is_full_precision());
  EXPECT_FALSE(PrecisionRecipe::parse("full+kv-bf16").is_full_precision());
}

TEST(Recipe, PartsInAnyOrderAndWeightsOptional) {
  EXPECT_EQ(PrecisionRecipe::parse("kv-fp8+act-fp8+fp8").name(), "fp8+act-fp8+kv-fp8");
  // Any weights with FP8 activations: the reference engine runs every combination.
  EXPECT_EQ(PrecisionRecipe::parse("act-fp8").name(), "full+act-fp8");
  EXPECT_EQ(PrecisionRecipe::parse("int4-gptq-g128+act-fp8").name(), "int4-gptq-g128+act-fp8");
  EXPECT_EQ(PrecisionRecipe::parse("kv-int4").name(), "full+kv-int4");
}

TEST(Recipe, MistakesGiveClearErrors) {
  const struct {
    const char* text;
    std::vector<std::string> expected;
  } cases[] = {
      {"int4-gptq-g48", {"'int4-gptq-g48'", "g48", "g32, g64, g128 or gch"}},
      {"int4-rtn-g", {"valid group sizes"}},
      {"int4-rtn-g128-sym", {"unknown options '-sym'"}},
      {"int4", {"needs a quantiser and a group size"}},
      {"int4-gptq", {"needs a quantiser and a group size"}},
      {"fp16", {"unknown part 'fp16'", "weights:", "activations: act-fp8 | act-bf16", "act-fp8-block-bf16",
                "kv-int4-hadamard"}},
      {"fp8-g128", {"fp8 weights take no group size"}},
      {"fp8+int4-rtn-g32", {"two weight formats", "'fp8'", "'int4-rtn-g32'"}},
      {"full+full", {"two weight formats"}},
      {"fp8+act-fp8+act-fp8", {"two activation formats"}},
      {"act-fp8+act-bf16", {"two activation formats"}},
      {"act-fp8-bf16+act-fp8", {"two activation formats"}},
      {"act-fp8-block-bf16+act-fp8-bf16", {"two activation formats", "'act-fp8-block-bf16'", "'act-fp8-bf16'"}},
      {"act-fp8-block", {"unknown part 'act-fp8-block'"}},
      {"kv-fp8+kv-int4", {"two KV-cache formats", "'kv-fp8'", "'kv-int4'"}},
      {"kv-int8", {"'kv-int8'", "bf16, fp8, int4, int4-hadamard"}},
      {"", {"empty precision recipe"}},
      {"fp8++kv-fp8", {"empty part"}},
      {"fp8+", {"empty part"}},
  };
  for (const auto& c : cases) {
    const std::string msg = parse_error(c.text);
    for (const std::string& want : c.expected)
      EXPECT_NE(msg.find(want), std::string::npos) << "recipe '" << c.text << "': '" << want << "' not in: " << msg;
  }
}

TEST(Recipe, QuantisedProjections) {
  for (const char* yes : {"model.layers.0.self_attn.q_proj.weight", "model.layers.31.self_attn.k_proj.weight",
                          "model.layers.7.self_attn.v_proj.weight", "model.layers.7.self_attn.o_proj.weight",
                          "model.layers.2.mlp.gate_proj.weight", "model.layers.2.mlp.up_proj.weight",
                          "model.layers.12.mlp.down_proj.weight"})
    EXPECT_TRUE(is_quantised_projection(yes)) << yes;
  for (const char* no : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                         "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.bias",
                         "model.layers..self_attn.q_proj.weight", "model.layers.x.self_attn.q_proj.weight",
                         "model.layers.0.self_attn.q_proj.weight.qweight", "layers.0.self_attn.q_proj.weight"})
    EXPECT_FALSE(is_quantised_projection(no)) << no;
}

TEST(Sha256, KnownDigests) {
  // FIPS 180-4 examples: one block, empty, and a message whose padding needs a second block.
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(two.data(), two.size()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace futransformer
