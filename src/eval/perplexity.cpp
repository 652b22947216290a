#include "futransformer/eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>

#include "futransformer/error.h"

namespace futransformer::eval {

std::string read_eval_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), path, ": cannot open evaluation text");
  std::string text, line;
  bool first = true;
  while (std::getline(in, line)) {
    if (!first) text += "\n\n";
    text += line;
    first = false;
  }
  check(!text.empty(), path, ": evaluation text is empty");
  return text;
}

int64_t perplexity_windows(int64_t n_tokens, const PerplexityOptions& o) {
  check(o.ctx >= 2, "perplexity: --ctx must be at least 2 tokens, got ", o.ctx);
  check(o.max_windows >= 0, "perplexity: --max-windows must be >= 0, got ", o.max_windows);
  check(o.chunk >= 1, "perplexity: chunk must be positive");
  const int64_t available = n_tokens / o.ctx;
  check(available >= 1, "perplexity: the text has ", n_tokens, " tokens, fewer than one window of ", o.ctx);
  return o.max_windows > 0 ? std::min(available, o.max_windows) : available;
}

PerplexityResult perplexity_result(int64_t windows, int64_t predicted_tokens, double nll_sum, double seconds) {
  PerplexityResult r;
  r.windows = windows;
  r.predicted_tokens = predicted_tokens;
  r.mean_nll = nll_sum / static_cast<double>(predicted_tokens);
  r.ppl = std::exp(r.mean_nll);
  r.seconds = seconds;
  return r;
}

double token_nll(std::span<const float> logits, int32_t target) {
  check(target >= 0 && static_cast<size_t>(target) < logits.size(), "perplexity: target token ", target,
        " outside the logits (", logits.size(), ")");
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  check(std::isfinite(mx), "perplexity: logits are not finite");
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return std::log(sum) + mx - static_cast<double>(logits[static_cast<size_t>(target)]);
}

PerplexityResult evaluate_perplexity(Engine& engine, std::span<const int32_t> tokens, const PerplexityOptions& o,
                                     const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t windows = perplexity_windows(static_cast<int64_t>(tokens.size()), o);
  check(o.ctx <= engine.max_sequence_length(), "perplexity: --ctx ", o.ctx, " exceeds the engine's maximum sequence ",
        "length ", engine.max_sequence_length());
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t vocab = engine.config().vocab_size;
  const int64_t total = windows * (o.ctx - 1);
  double nll_sum = 0;
  int64_t done = 0;
  constexpr int32_t kSeq = 0;
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* win = tokens.data() + w * o.ctx;
    engine.reset(kSeq);
    for (int64_t start = 0; start < o.ctx; start += o.chunk) {
      const int64_t n = std::min(o.chunk, o.ctx - start);
      const SequenceChunk chunk{kSeq, std::vector<int32_t>(win + start, win + start + n)};
      const std::vector<std::vector<float>> out = engine.forward(std::span<const SequenceChunk>(&chunk, 1), true);
      check(out.size() == 1 && static_cast<int64_t>(out[0].size()) == n * vocab,
            "perplexity: engine returned logits of the wrong size");
      // Row i predicts token start + i + 1 of the window; the window's last row has nothing to predict.
      for (int64_t i = 0; i < n && start + i + 1 < o.ctx; ++i) {
        nll_sum += token_nll(std::span<const float>(out[0].data() + i * vocab, static_cast<size_t>(vocab)),
                             win[start + i + 1]);
        ++done;
      }
      if (progress) progress(done, total);
    }
  }
  engine.reset(kSeq);
  return perplexity_result(windows, done, nll_sum,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace futransformer::eval
