// Autoregressive generation on any Engine: prefill the prompt, then sample and decode one token at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "futransformer/engine.h"
#include "futransformer/sampling.h"

namespace futransformer {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingParams sampling;
  bool stop_at_eos = true;
};

// Appends `prompt` (non-empty) to sequence `seq_id` in one forward call, then samples up to max_new_tokens tokens,
// feeding each back as a one-token decode step. Every new token is passed to on_token (if set) and returned;
// generation stops after a token for which on_token returns false, after a token for which is_end returns true
// (when stop_at_eos and is_end is set; that end token is still passed and returned), at max_new_tokens, or when the
// sequence fills the engine's max_sequence_length. The last returned token is not fed back, so afterwards the
// sequence holds the prompt and all returned tokens but the last. max_new_tokens 0 returns at once without running
// the prompt. Throws Error on an empty prompt, a negative max_new_tokens, invalid sampling parameters, or anything the
// engine rejects (bad token id, prompt too long).
std::vector<int32_t> generate(Engine& engine, int32_t seq_id, std::span<const int32_t> prompt,
                              const GenerateOptions& options, const std::function<bool(int32_t token)>& on_token,
                              const std::function<bool(int32_t)>& is_end = {});

}  // namespace futransformer
