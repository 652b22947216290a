// The interface every engine implements (the CPU reference engine, the CUDA engine), so one test can drive
// both with the same inputs and compare.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "futransformer/model.h"

namespace futransformer {

struct SequenceChunk {
  int32_t seq_id = 0;             // a new id starts an empty sequence
  std::vector<int32_t> tokens;    // appended after the sequence's cached tokens
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelConfig& config() const = 0;
  // Runs every chunk's tokens through the model, appending them to the sequence's KV cache (prefill when a
  // chunk has many tokens, a decode step when each has one). Returns one logits vector per chunk: the last
  // token's logits ([vocab]), or every token's ([tokens.size() * vocab], row-major) when all_logits.
  virtual std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits = false) = 0;
  // Number of tokens cached for the sequence (0 for an unknown id).
  virtual int64_t sequence_length(int32_t seq_id) const = 0;
  // Frees the sequence's cache; its id may be reused.
  virtual void reset(int32_t seq_id) = 0;
  // Longest sequence this engine accepts.
  virtual int64_t max_sequence_length() const = 0;
};

// The batch checks every engine makes before it touches a cache, so a rejected batch changes nothing: each sequence
// id at most once, no empty chunk, token ids in [0, vocab_size), and no sequence beyond
// engine.max_sequence_length(). Throws Error whose message starts with `engine_name` ("CUDA engine", …).
void check_batch(const Engine& engine, std::span<const SequenceChunk> batch, const char* engine_name);

}  // namespace futransformer
