#include <set>

#include "futransformer/engine.h"
#include "futransformer/error.h"

namespace futransformer {

void check_batch(const Engine& engine, std::span<const SequenceChunk> batch, const char* engine_name) {
  const int64_t vocab = engine.config().vocab_size, max_len = engine.max_sequence_length();
  std::set<int32_t> seen;
  for (const SequenceChunk& c : batch) {
    check(seen.insert(c.seq_id).second, engine_name, ": sequence ", c.seq_id, " appears more than once in one batch");
    check(!c.tokens.empty(), engine_name, ": sequence ", c.seq_id, " has an empty chunk (no tokens to run)");
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      check(c.tokens[i] >= 0 && c.tokens[i] < vocab, engine_name, ": sequence ", c.seq_id, ": token id ", c.tokens[i],
            " at chunk index ", i, " is outside the vocabulary [0, ", vocab, ")");
    }
    const int64_t cached = engine.sequence_length(c.seq_id);
    const int64_t added = static_cast<int64_t>(c.tokens.size());
    check(added <= max_len - cached, engine_name, ": sequence ", c.seq_id, " would hold ", cached, " + ", added,
          " tokens, more than the maximum sequence length ", max_len);
  }
}

}  // namespace futransformer
