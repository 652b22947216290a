// Perplexity by the protocol of the GPTQ/AWQ/QuaRot papers: the evaluation text's lines joined with "\n\n",
// tokenised once (no BOS), cut into non-overlapping windows of `ctx` tokens; each window is a fresh sequence and
// every token after its first is predicted from the ones before it; perplexity = exp(mean NLL over all predicted
// tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "futransformer/engine.h"
#include "futransformer/tokenizer.h"

namespace futransformer::eval {

// The evaluation text: the file's lines (without their '\n') joined with "\n\n". Throws Error if unreadable/empty.
std::string read_eval_text(const std::string& path);

struct PerplexityOptions {
  int64_t ctx = 2048;          // window length in tokens
  int64_t max_windows = 0;     // 0: every full window of the text
  int64_t chunk = 512;         // tokens per forward call inside a window (bounds the logits' memory)
};

struct PerplexityResult {
  double ppl = 0;              // exp(mean_nll)
  double mean_nll = 0;         // nats per predicted token
  int64_t windows = 0;
  int64_t predicted_tokens = 0;
  double seconds = 0;
};

// The result of a pass that predicted `predicted_tokens` tokens with a summed NLL of `nll_sum` nats.
PerplexityResult perplexity_result(int64_t windows, int64_t predicted_tokens, double nll_sum, double seconds);

// Number of windows evaluate_perplexity will use for `n_tokens` tokens (throws Error if not even one fits).
int64_t perplexity_windows(int64_t n_tokens, const PerplexityOptions& options);

// Runs every window through `engine` (sequence id 0, reset after each window). `progress(done, total)` is called
// after each chunk with predicted-token counts. Throws Error if ctx exceeds the engine's max sequence length.
PerplexityResult evaluate_perplexity(Engine& engine, std::span<const int32_t> tokens, const PerplexityOptions& options,
                                     const std::function<void(int64_t done, int64_t total)>& progress = {});

// -log softmax(logits)[target], computed in double with max subtraction.
double token_nll(std::span<const float> logits, int32_t target);

}  // namespace futransformer::eval
