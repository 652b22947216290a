// Sampler (greedy, temperature, top-k, top-p, seeding) and the generation loop on a scripted engine.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/generate.h"
#include "futransformer/sampling.h"

namespace futransformer {
namespace {

std::vector<double> softmax64(const std::vector<float>& logits, double temperature) {
  double mx = logits[0], sum = 0;
  for (float l : logits) mx = std::max(mx, double(l));
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < p.size(); ++i) sum += (p[i] = std::exp((logits[i] - mx) / temperature));
  for (double& x : p) x /= sum;
  return p;
}

std::vector<double> frequencies(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) f[s.sample(logits)] += 1.0 / draws;
  return f;
}

constexpr int kDraws = 20000;
// Five standard deviations of a frequency estimated from kDraws draws (the largest, at p = 1/2): a correct sampler
// fails this about once in 3·10^6 runs per token, while a wrong distribution is off by far more.
const double kFreqTol = 5.0 * std::sqrt(0.25 / kDraws);

TEST(Sampling, ArgmaxTakesTheFirstMaximum) {
  EXPECT_EQ(argmax(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{3.0f}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-INFINITY, -5.0f, -INFINITY}), 1);
  EXPECT_THROW(argmax(std::vector<float>{}), Error);
  EXPECT_THROW(argmax(std::vector<float>{1.0f, NAN}), Error);
}

TEST(Sampling, GreedyIsArgmaxAndTopK1IsGreedyAtAnyTemperature) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  Sampler greedy({});
  for (float t : {0.3f, 1.0f, 5.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = 1;
    p.seed = 99;
    Sampler topk1(p);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> logits(97);
      for (float& l : logits) l = dist(rng);
      const int32_t best = argmax(logits);
      EXPECT_EQ(greedy.sample(logits), best);
      EXPECT_EQ(topk1.sample(logits), best) << "temperature " << t;
    }
  }
}

TEST(Sampling, SameSeedSameSequenceOtherSeedDiffers) {
  const std::vector<float> logits = {0.1f, 0.4f, -0.3f, 0.2f, 0.0f, 0.3f, -0.1f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  Sampler a(p), b(p);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(a.sample(logits));
    sb.push_back(b.sample(logits));
    sc.push_back(c.sample(logits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampling, TemperatureFrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  for (float t : {1.0f, 0.5f, 2.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 42;
    Sampler s(p);
    const auto want = softmax64(logits, t);
    const auto got = frequencies(s, logits, kDraws);
    for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(got[i], want[i], kFreqTol) << "T " << t << " token " << i;
  }
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  p.seed = 5;
  Sampler s(p);
  const auto got = frequencies(s, logits, kDraws);
  // Tokens 1 and 4 renormalised: e^2 / (e^2 + e^1.5).
  const double p1 = 1.0 / (1.0 + std::exp(-0.5));
  EXPECT_NEAR(got[1], p1, kFreqTol);
  EXPECT_NEAR(got[4], 1.0 - p1, kFreqTol);
  EXPECT_EQ(got[0] + got[2] + got[3], 0.0);
}

TEST(Sampling, TopPCutsTheTail) {
  // Probabilities 0.5, 0.3, 0.1, 0.06, 0.04 at temperature 1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.1f), std::log(0.06f), std::log(0.04f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 77;
  p.top_p = 0.6f;  // 0.5 < 0.6 <= 0.8: the two most likely tokens
  Sampler two(p);
  const auto got = frequencies(two, logits, kDraws);
  EXPECT_NEAR(got[0], 0.5 / 0.8, kFreqTol);
  EXPECT_NEAR(got[1], 0.3 / 0.8, kFreqTol);
  EXPECT_EQ(got[2] + got[3] + got[4], 0.0);
  p.top_p = 0.45f;  // the first token alone already holds more than 0.45
  Sampler one(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.sample(logits), 0);
  p.top_p = 0.95f;  // 0.9 < 0.95 <= 0.96: everything but the last token
  Sampler four(p);
  const auto most = frequencies(four, logits, kDraws);
  EXPECT_EQ(most[4], 0.0);
  EXPECT_NEAR(most[3], 0.06 / 0.96, kFreqTol);
}

TEST(Sampling, InvalidParametersAndLogitsThrow) {
  auto make = [](float t, int32_t k, float top_p) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    return Sampler(p);
  };
  EXPECT_THROW(make(-0.1f, 0, 1.0f), Error);
  EXPECT_THROW(make(NAN, 0, 1.0f), Error);
  EXPECT_THROW(make(INFINITY, 0, 1.0f), Error);
  EXPECT_THROW(make(1.0f, -1, 1.0f), Error);
  EXPECT_THROW(make(1.0f, 0, 0.0f), Error);
  EXPECT_THROW(make(1.0f, 0, 1.5f), Error);
  EXPECT_THROW(make(1.0f, 0, NAN), Error);
  Sampler ok = make(1.0f, 0, 1.0f);
  EXPECT_THROW(ok.sample(std::vector<float>{}), Error);
  EXPECT_THROW(ok.sample(std::vector<float>{0.0f, NAN}), Error);
  EXPECT_THROW(ok.sample(std::vector<float>{-INFINITY, -INFINITY}), Error);
  EXPECT_EQ(ok.sample(std::vector<float>{-INFINITY, 0.0f, -INFINITY}), 1);
}

// An engine whose next token is always (last token + 1) mod vocab, recording every forward call.
class ScriptedEngine final : public Engine {
 public:
  explicit ScriptedEngine(int64_t max_len) : max_len_(max_len) { config_.vocab_size = 10; }
  const ModelConfig& config() const override { return config_; }
  std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits) override {
    std::vector<std::vector<float>> out;
    for (const SequenceChunk& c : batch) {
      calls.push_back(c.tokens);
      check(len_[c.seq_id] + int64_t(c.tokens.size()) <= max_len_, "scripted engine: sequence too long");
      len_[c.seq_id] += int64_t(c.tokens.size());
      std::vector<float> logits(10, 0.0f);
      logits[(c.tokens.back() + 1) % 10] = 5.0f;
      out.push_back(logits);
    }
    return out;
  }
  int64_t sequence_length(int32_t seq_id) const override {
    auto it = len_.find(seq_id);
    return it == len_.end() ? 0 : it->second;
  }
  void reset(int32_t seq_id) override { len_.erase(seq_id); }
  int64_t max_sequence_length() const override { return max_len_; }

  std::vector<std::vector<int32_t>> calls;

 private:
  ModelConfig config_;
  int64_t max_len_;
  std::map<int32_t, int64_t> len_;
};

TEST(Generate, PrefillsOnceThenDecodesOneTokenAtATime) {
  ScriptedEngine engine(100);
  GenerateOptions opt;
  opt.max_new_tokens = 4;
  std::vector<int32_t> streamed;
  const std::vector<int32_t> prompt = {3, 1, 4};
  const auto out = generate(engine, 2, prompt, opt, [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  EXPECT_EQ(out, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(streamed, out);
  // The prompt in one call, then each new token but the last fed back alone.
  EXPECT_EQ(engine.calls, (std::vector<std::vector<int32_t>>{{3, 1, 4}, {5}, {6}, {7}}));
  EXPECT_EQ(engine.sequence_length(2), 6);
}

TEST(Generate, StopsAtEndTokenOnlyWhenAsked) {
  ScriptedEngine engine(100);
  GenerateOptions opt;
  opt.max_new_tokens = 20;
  auto is_end = [](int32_t t) { return t == 0; };
  const std::vector<int32_t> prompt = {7};
  EXPECT_EQ(generate(engine, 1, prompt, opt, {}, is_end), (std::vector<int32_t>{8, 9, 0}));
  opt.stop_at_eos = false;
  opt.max_new_tokens = 5;
  EXPECT_EQ(generate(engine, 2, prompt, opt, {}, is_end), (std::vector<int32_t>{8, 9, 0, 1, 2}));
}

TEST(Generate, OnTokenFalseStops) {
  ScriptedEngine engine(100);
  GenerateOptions opt;
  int seen = 0;
  const std::vector<int32_t> prompt = {0};
  const auto out = generate(engine, 0, prompt, opt, [&](int32_t) { return ++seen < 3; });
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3}));
}

TEST(Generate, StopsWhenTheSequenceIsFull) {
  ScriptedEngine engine(6);
  GenerateOptions opt;
  opt.max_new_tokens = 50;
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  // Positions 4 and 5 are filled by the first two new tokens; the third is sampled from position 5's logits.
  EXPECT_EQ(generate(engine, 0, prompt, opt, {}), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(engine.sequence_length(0), 6);
}

TEST(Generate, RejectsBadArguments) {
  ScriptedEngine engine(100);
  GenerateOptions opt;
  EXPECT_THROW(generate(engine, 0, std::vector<int32_t>{}, opt, {}), Error);
  opt.max_new_tokens = -1;
  EXPECT_THROW(generate(engine, 0, std::vector<int32_t>{1}, opt, {}), Error);
  opt.max_new_tokens = 3;
  opt.sampling.top_p = 0.0f;
  EXPECT_THROW(generate(engine, 0, std::vector<int32_t>{1}, opt, {}), Error);
  EXPECT_TRUE(engine.calls.empty());
  opt.sampling.top_p = 1.0f;
  opt.max_new_tokens = 0;
  EXPECT_TRUE(generate(engine, 0, std::vector<int32_t>{1}, opt, {}).empty());
}

}  // namespace
}  // namespace futransformer
