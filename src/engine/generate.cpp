#include "futransformer/generate.h"

#include "futransformer/error.h"

namespace futransformer {

std::vector<int32_t> generate(Engine& engine, int32_t seq_id, std::span<const int32_t> prompt,
                              const GenerateOptions& options, const std::function<bool(int32_t token)>& on_token,
                              const std::function<bool(int32_t)>& is_end) {
  check(!prompt.empty(), "generate: sequence ", seq_id, ": the prompt is empty (nothing to predict from)");
  check(options.max_new_tokens >= 0, "generate: max_new_tokens ", options.max_new_tokens, " must be >= 0");
  Sampler sampler(options.sampling);
  std::vector<int32_t> out;
  if (options.max_new_tokens == 0) return out;

  SequenceChunk chunk{seq_id, std::vector<int32_t>(prompt.begin(), prompt.end())};
  std::vector<float> logits = std::move(engine.forward(std::span<const SequenceChunk>(&chunk, 1))[0]);
  while (true) {
    const int32_t token = sampler.sample(logits);
    out.push_back(token);
    if (on_token && !on_token(token)) break;
    if (options.stop_at_eos && is_end && is_end(token)) break;
    if (static_cast<int64_t>(out.size()) >= options.max_new_tokens) break;
    if (engine.sequence_length(seq_id) >= engine.max_sequence_length()) break;
    chunk.tokens.assign(1, token);
    logits = std::move(engine.forward(std::span<const SequenceChunk>(&chunk, 1))[0]);
  }
  return out;
}

}  // namespace futransformer
