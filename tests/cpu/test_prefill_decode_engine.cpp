// The prefill/decode reference engine (make_prefill_decode_reference_engine): prompts through one quantised model,
// single-token decode steps through another, one KV cache per sequence — the CPU twin of FP8 prefill + INT4 decode.
//  - with identical models it is the plain reference engine, bit for bit;
//  - with different models a prompt's logits are the prefill engine's, bit for bit, and a decode step is the decode
//    model run by hand (ref::RefModel) over a cache that the prefill model filled, bit for bit;
//  - mismatched configs, KV formats or lengths are rejected with the reason.
// Exact comparisons run the same groups of rows through the same sgemm calls: with BLAS a row's result may depend on
// how many rows share the call (OpenBLAS takes another kernel for one row), so a batch mixing prompts and decode
// steps — which this engine runs as two groups — is compared with the plain engine fed the same two groups.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"
#include "futransformer/reference_engine.h"
#include "ref/kv_cache.h"
#include "ref/ref_model.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {

using Batch = std::vector<SequenceChunk>;
using Logits = std::vector<std::vector<float>>;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

quant::QuantizedModel quantised(const Model& m, const std::string& recipe) {
  quant::QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse(recipe);
  return quant::quantize_model(m, quant::CalibrationSet{}, o);  // fp8 and RTN need no calibration
}

// The plain engine run on a batch the way the prefill/decode engine splits it: the chunks of more than one token as
// one batch, then the single-token chunks as another; logits back in batch order.
Logits forward_split(Engine& e, const Batch& batch, bool all_logits) {
  Batch prompts, steps;
  std::vector<size_t> prompt_at, step_at;
  for (size_t i = 0; i < batch.size(); ++i) {
    (batch[i].tokens.size() > 1 ? prompts : steps).push_back(batch[i]);
    (batch[i].tokens.size() > 1 ? prompt_at : step_at).push_back(i);
  }
  Logits out(batch.size());
  if (!prompts.empty()) {
    Logits got = e.forward(prompts, all_logits);
    for (size_t k = 0; k < got.size(); ++k) out[prompt_at[k]] = std::move(got[k]);
  }
  if (!steps.empty()) {
    Logits got = e.forward(steps, all_logits);
    for (size_t k = 0; k < got.size(); ++k) out[step_at[k]] = std::move(got[k]);
  }
  return out;
}

void expect_same_logits(const Logits& got, const Logits& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << what << ", chunk " << i;
}

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown (expected one mentioning '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Prompts, decode steps, a one-token prompt, continuations and batches mixing them, with both logits modes.
struct Step {
  Batch batch;
  bool all_logits;
};

std::vector<Step> script(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  auto toks = [&](size_t n) { return test::random_token_ids(n, vocab, rng); };
  return {
      {{{1, toks(7)}, {2, toks(12)}}, true},               // two prompts
      {{{1, toks(1)}, {2, toks(1)}}, false},               // decode step
      {{{2, toks(1)}}, true},                              // decode step, all logits
      {{{1, toks(3)}, {2, toks(1)}, {5, toks(1)}}, true},  // continuation + step + one-token prompt
      {{{5, toks(4)}, {1, toks(1)}}, false},               // continuation + step
      {{{1, toks(1)}, {2, toks(1)}, {5, toks(1)}}, false},
  };
}

TEST(PrefillDecodeEngine, IdenticalModelsGiveThePlainEngineBitForBit) {
  const Model m = test::make_tiny_llama({}, 61);
  for (const std::string recipe :
       {"full", "full+act-fp8+kv-int4-hadamard", "full+act-bf16+kv-fp8", "full+act-fp8-bf16+kv-int4",
        "full+act-fp8-block-bf16+kv-bf16"}) {
    SCOPED_TRACE(recipe);
    const ReferenceOptions o = quant::reference_options(PrecisionRecipe::parse(recipe));
    auto dual = make_prefill_decode_reference_engine(m, o, m, o);
    auto plain = make_reference_engine(m, o);
    int n = 0;
    for (const Step& s : script(m.config.vocab_size, 62)) {
      const std::string what = "step " + std::to_string(n++);
      expect_same_logits(dual->forward(s.batch, s.all_logits), forward_split(*plain, s.batch, s.all_logits), what);
      for (int32_t id : {1, 2, 5}) EXPECT_EQ(dual->sequence_length(id), plain->sequence_length(id)) << what;
    }
    EXPECT_EQ(dual->max_sequence_length(), plain->max_sequence_length());
  }
}

// FP8 prefill + INT4 decode, as the CUDA engine will run them (RTN stands in for GPTQ: same packed format).
struct TwoRecipes : ::testing::Test {
  Model m = test::make_tiny_llama({}, 71);
  quant::QuantizedModel pre = quantised(m, "fp8+act-fp8+kv-int4-hadamard");
  quant::QuantizedModel dec = quantised(m, "int4-rtn-g32+kv-int4-hadamard");
  int64_t vocab = m.config.vocab_size;
};

TEST_F(TwoRecipes, PromptLogitsAreThePrefillEnginesBitForBit) {
  auto dual = quant::make_prefill_decode_reference_engine(pre, dec);
  auto prefill_only = quant::make_reference_engine(pre);
  auto decode_only = quant::make_reference_engine(dec);
  std::mt19937 rng(72);
  const Batch prompts = {{3, test::random_token_ids(9, vocab, rng)}, {4, test::random_token_ids(2, vocab, rng)}};
  const Logits got = dual->forward(prompts, true);
  expect_same_logits(got, prefill_only->forward(prompts, true), "prompts");
  // The two recipes really differ, so the comparison above could catch a prompt routed to the decode model.
  const Logits other = decode_only->forward(prompts, true);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FALSE(same_bits(got[i], other[i])) << "chunk " << i;
  // Continuing a prompt with another multi-token chunk stays on the prefill model.
  const Batch more = {{3, test::random_token_ids(5, vocab, rng)}};
  expect_same_logits(dual->forward(more, true), prefill_only->forward(more, true), "continuation");
}

// The decode model run by hand over one sequence's cache: embed, every layer, final norm + LM head (what the engine
// does for a batch of one chunk). Returns the last row's logits.
std::vector<float> run_by_hand(ref::RefModel& model, std::vector<std::unique_ptr<ref::KvStore>>& cache,
                               const std::vector<int32_t>& tokens, int64_t first_pos) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(tokens.size()), h = c.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * h));
  model.embed(tokens, x.data());
  ref::SequenceRows rows{0, n, first_pos, nullptr};
  for (int64_t li = 0; li < model.num_layers(); ++li) {
    rows.kv = cache[static_cast<size_t>(li)].get();
    model.run_layer(li, x.data(), n, std::span<const ref::SequenceRows>(&rows, 1));
  }
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  model.final_logits(&x[static_cast<size_t>((n - 1) * h)], 1, logits.data());
  return logits;
}

ref::RefModelOptions model_options(const PrecisionRecipe& r) {
  ref::RefModelOptions o;
  o.activations = r.activations;
  o.kv = r.kv;
  return o;
}

TEST_F(TwoRecipes, DecodeStepsAreTheDecodeModelOverThePrefillCache) {
  ref::RefModel prefill_model(pre.model, model_options(pre.recipe));
  ref::RefModel decode_model(dec.model, model_options(dec.recipe));
  std::vector<std::unique_ptr<ref::KvStore>> cache;
  for (int64_t li = 0; li < prefill_model.num_layers(); ++li) cache.push_back(prefill_model.make_kv_store());

  auto dual = quant::make_prefill_decode_reference_engine(pre, dec);
  auto prefill_only = quant::make_reference_engine(pre);
  auto decode_only = quant::make_reference_engine(dec);
  std::mt19937 rng(73);
  const std::vector<int32_t> prompt = test::random_token_ids(11, vocab, rng);
  const Batch first = {{8, prompt}};
  EXPECT_TRUE(same_bits(dual->forward(first)[0], run_by_hand(prefill_model, cache, prompt, 0)));
  prefill_only->forward(first);
  decode_only->forward(first);
  for (int64_t pos = 11; pos < 16; ++pos) {
    const std::vector<int32_t> tok = test::random_token_ids(1, vocab, rng);
    const Batch step = {{8, tok}};
    const std::vector<float> got = dual->forward(step)[0];
    EXPECT_TRUE(same_bits(got, run_by_hand(decode_model, cache, tok, pos))) << "position " << pos;
    // Neither single-recipe engine computes this: the step is neither the prefill model's nor over the decode
    // model's own cache.
    EXPECT_FALSE(same_bits(got, prefill_only->forward(step)[0])) << "position " << pos;
    EXPECT_FALSE(same_bits(got, decode_only->forward(step)[0])) << "position " << pos;
    EXPECT_EQ(dual->sequence_length(8), pos + 1);
  }
}

TEST_F(TwoRecipes, AOneTokenPromptRunsTheDecodeModel) {
  auto dual = quant::make_prefill_decode_reference_engine(pre, dec);
  auto decode_only = quant::make_reference_engine(dec);
  std::mt19937 rng(74);
  const Batch b = {{0, test::random_token_ids(1, vocab, rng)}, {9, test::random_token_ids(1, vocab, rng)}};
  expect_same_logits(dual->forward(b, true), decode_only->forward(b, true), "one-token prompts");
}

TEST_F(TwoRecipes, ARejectedBatchChangesNothing) {
  auto dual = quant::make_prefill_decode_reference_engine(pre, dec);
  std::mt19937 rng(75);
  dual->forward(Batch{{1, test::random_token_ids(4, vocab, rng)}});
  // A valid prompt next to a decode step with a bad id: the whole batch is refused before either group runs.
  EXPECT_THROW(dual->forward(Batch{{2, test::random_token_ids(3, vocab, rng)}, {1, {static_cast<int32_t>(vocab)}}}),
               Error);
  EXPECT_THROW(dual->forward(Batch{{1, {0}}, {1, {1, 2}}}), Error);
  EXPECT_EQ(dual->sequence_length(1), 4);
  EXPECT_EQ(dual->sequence_length(2), 0);
}

TEST(PrefillDecodeEngine, RejectsModelsThatCannotShareACache) {
  const Model m = test::make_tiny_llama({}, 81);
  test::TinyLlama deeper;
  deeper.layers = 3;
  const Model m3 = test::make_tiny_llama(deeper, 81);
  test::TinyLlama wider_vocab;
  wider_vocab.vocab = 67;
  const Model mv = test::make_tiny_llama(wider_vocab, 81);
  const ReferenceOptions plain;
  expect_error([&] { make_prefill_decode_reference_engine(m, plain, m3, plain); }, "num_hidden_layers (2 vs 3)");
  expect_error([&] { make_prefill_decode_reference_engine(mv, plain, m, plain); }, "vocab_size (67 vs 61)");

  ReferenceOptions int4h;
  int4h.kv = formats::KvFormat::INT4_HADAMARD;
  expect_error([&] { make_prefill_decode_reference_engine(m, plain, m, int4h); }, "KV-cache format (fp32)");

  ReferenceOptions shorter;
  shorter.max_sequence_length = 100;
  expect_error([&] { make_prefill_decode_reference_engine(m, shorter, m, plain); }, "same length");
  ReferenceOptions same_as_default;
  same_as_default.max_sequence_length = m.config.max_position_embeddings;
  EXPECT_NO_THROW(make_prefill_decode_reference_engine(m, same_as_default, m, plain));

  // Activation formats may differ: that is the point (act-fp8 prompts, act-bf16 or fp32 steps).
  ReferenceOptions fp8_acts;
  fp8_acts.activations = ActivationFormat::Fp8PerToken;
  EXPECT_NO_THROW(make_prefill_decode_reference_engine(m, fp8_acts, m, plain));

  const quant::QuantizedModel a = quantised(m, "fp8+act-fp8+kv-int4-hadamard");
  const quant::QuantizedModel b = quantised(m, "int4-rtn-g32+kv-int4");
  expect_error([&] { quant::make_prefill_decode_reference_engine(a, b); }, "KV-cache format (int4-hadamard)");
}

}  // namespace
}  // namespace futransformer
