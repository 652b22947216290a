#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/eval/perplexity.h"
#include "test_paths.h"

namespace futransformer::eval {
namespace {

// A scripted engine: logits favour (previous token + 1) mod vocab with a known margin, so the NLL of every
// prediction is known in closed form, and it records what it was asked.
class CountingEngine final : public Engine {
 public:
  explicit CountingEngine(int64_t vocab) { config_.vocab_size = vocab; }
  const ModelConfig& config() const override { return config_; }
  std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits) override {
    std::vector<std::vector<float>> out;
    for (const SequenceChunk& c : batch) {
      EXPECT_TRUE(all_logits);
      std::vector<float> logits(c.tokens.size() * static_cast<size_t>(config_.vocab_size), 0.0f);
      for (size_t i = 0; i < c.tokens.size(); ++i)
        logits[i * static_cast<size_t>(config_.vocab_size) + static_cast<size_t>((c.tokens[i] + 1) % config_.vocab_size)] =
            kMargin;
      lengths_[c.seq_id] += static_cast<int64_t>(c.tokens.size());
      max_len_seen_ = std::max(max_len_seen_, lengths_[c.seq_id]);
      out.push_back(std::move(logits));
    }
    return out;
  }
  int64_t sequence_length(int32_t seq) const override {
    auto it = lengths_.find(seq);
    return it == lengths_.end() ? 0 : it->second;
  }
  void reset(int32_t seq) override { lengths_.erase(seq); }
  int64_t max_sequence_length() const override { return 4096; }

  static constexpr float kMargin = 3.0f;
  int64_t max_len_seen_ = 0;

 private:
  ModelConfig config_;
  std::map<int32_t, int64_t> lengths_;
};

TEST(Perplexity, TokenNllIsMinusLogSoftmax) {
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f};
  double z = 0;
  for (float v : logits) z += std::exp(static_cast<double>(v));
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(token_nll(logits, t), std::log(z) - logits[static_cast<size_t>(t)], 1e-12);
  EXPECT_THROW(token_nll(logits, 4), Error);
}

TEST(Perplexity, WindowsChunksAndMeanNllFollowTheProtocol) {
  constexpr int64_t kVocab = 7;
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(1000);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % kVocab);
  CountingEngine engine(kVocab);
  PerplexityOptions o;
  o.ctx = 96;
  o.chunk = 40;  // windows split into 40 + 40 + 16 token chunks of one sequence
  o.max_windows = 0;
  const PerplexityResult r = evaluate_perplexity(engine, tokens, o);
  EXPECT_EQ(r.windows, 1000 / 96);
  EXPECT_EQ(r.predicted_tokens, r.windows * 95);
  EXPECT_EQ(engine.max_len_seen_, 96);  // every window is a fresh sequence
  // Closed form: p(hit) = e^m / (e^m + V - 1); a miss has p = 1 / (e^m + V - 1).
  const double z = std::exp(double{CountingEngine::kMargin}) + kVocab - 1;
  double expected = 0;
  for (int64_t w = 0; w < r.windows; ++w)
    for (int64_t i = 1; i < o.ctx; ++i) {
      const int32_t prev = tokens[static_cast<size_t>(w * o.ctx + i - 1)], cur = tokens[static_cast<size_t>(w * o.ctx + i)];
      expected += cur == (prev + 1) % kVocab ? std::log(z) - CountingEngine::kMargin : std::log(z);
    }
  expected /= static_cast<double>(r.predicted_tokens);
  EXPECT_NEAR(r.mean_nll, expected, 1e-9);
  EXPECT_NEAR(r.ppl, std::exp(expected), 1e-9);

  o.max_windows = 3;
  EXPECT_EQ(evaluate_perplexity(engine, tokens, o).windows, 3);
}

TEST(Perplexity, RejectsImpossibleSettings) {
  CountingEngine engine(5);
  std::vector<int32_t> tokens(100, 1);
  PerplexityOptions o;
  o.ctx = 200;
  EXPECT_THROW(evaluate_perplexity(engine, tokens, o), Error);  // not one window
  o.ctx = 1;
  EXPECT_THROW(evaluate_perplexity(engine, tokens, o), Error);
  std::vector<int32_t> many(10000, 1);
  o.ctx = 5000;  // longer than the engine accepts
  EXPECT_THROW(evaluate_perplexity(engine, many, o), Error);
}

TEST(Perplexity, EvalTextJoinsLinesWithBlankLines) {
  const std::string dir = test::make_temp_dir("ppl");
  {
    std::ofstream f(dir + "/t.txt");
    f << "a\n b\n\nc\n";
  }
  EXPECT_EQ(read_eval_text(dir + "/t.txt"), "a\n\n b\n\n\n\nc");
  EXPECT_THROW(read_eval_text(dir + "/missing.txt"), Error);
}

}  // namespace
}  // namespace futransformer::eval
