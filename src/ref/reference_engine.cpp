#include "futransformer/reference_engine.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "futransformer/error.h"
#include "ref/kv_cache.h"
#include "ref/ref_model.h"

namespace futransformer {
namespace {

struct Sequence {
  int64_t length = 0;
  std::vector<std::unique_ptr<ref::KvStore>> layers;  // one store per layer
};

class ReferenceEngine final : public Engine {
 public:
  ReferenceEngine(const Model& model, const ReferenceOptions& options);
  const ModelConfig& config() const override { return model_.config(); }
  std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits) override;
  int64_t sequence_length(int32_t seq_id) const override;
  void reset(int32_t seq_id) override { sequences_.erase(seq_id); }
  int64_t max_sequence_length() const override { return max_len_; }

 private:
  void validate_batch(std::span<const SequenceChunk> batch) const;

  ref::RefModel model_;
  int64_t max_len_ = 0;
  std::map<int32_t, Sequence> sequences_;
};

ref::RefModelOptions model_options(const ReferenceOptions& o) {
  ref::RefModelOptions m;
  m.activations = o.activations;
  m.kv = o.kv;
  return m;
}

ReferenceEngine::ReferenceEngine(const Model& model, const ReferenceOptions& options)
    : model_(model, model_options(options)) {
  check(options.max_sequence_length >= 0, model.source, ": max_sequence_length ", options.max_sequence_length,
        " must be positive (or 0 for the model's max_position_embeddings)");
  max_len_ = options.max_sequence_length > 0 ? options.max_sequence_length : config().max_position_embeddings;
}

int64_t ReferenceEngine::sequence_length(int32_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? 0 : it->second.length;
}

// Every user error is found before any cache changes, so a rejected batch leaves the engine as it was.
void ReferenceEngine::validate_batch(std::span<const SequenceChunk> batch) const {
  const int64_t vocab = config().vocab_size;
  std::set<int32_t> seen;
  for (const SequenceChunk& c : batch) {
    check(seen.insert(c.seq_id).second, "reference engine: sequence ", c.seq_id,
          " appears more than once in one batch");
    check(!c.tokens.empty(), "reference engine: sequence ", c.seq_id, " has an empty chunk (no tokens to run)");
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      check(c.tokens[i] >= 0 && c.tokens[i] < vocab, "reference engine: sequence ", c.seq_id, ": token id ",
            c.tokens[i], " at chunk index ", i, " is outside the vocabulary [0, ", vocab, ")");
    }
    const int64_t cached = sequence_length(c.seq_id);
    const int64_t added = static_cast<int64_t>(c.tokens.size());
    check(added <= max_len_ - cached, "reference engine: sequence ", c.seq_id, " would hold ", cached, " + ", added,
          " tokens, more than the maximum sequence length ", max_len_);
  }
}

std::vector<std::vector<float>> ReferenceEngine::forward(std::span<const SequenceChunk> batch, bool all_logits) {
  validate_batch(batch);
  const int64_t h = config().hidden_size, vocab = config().vocab_size;

  // All chunks' tokens go through the projections together as one [rows, hidden] matrix; only attention is
  // per chunk, over that chunk's own cache and positions.
  std::vector<ref::SequenceRows> rows_of(batch.size());
  std::vector<Sequence*> seqs(batch.size());
  int64_t rows = 0;
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    Sequence& seq = sequences_[batch[ci].seq_id];
    if (seq.layers.empty()) {
      for (int64_t i = 0; i < model_.num_layers(); ++i) seq.layers.push_back(model_.make_kv_store());
    }
    const int64_t n = static_cast<int64_t>(batch[ci].tokens.size());
    rows_of[ci] = {rows, n, seq.length, nullptr};
    seqs[ci] = &seq;
    rows += n;
  }

  std::vector<float> x(static_cast<size_t>(rows * h));
  for (size_t ci = 0; ci < batch.size(); ++ci) model_.embed(batch[ci].tokens, &x[rows_of[ci].first_row * h]);
  try {
    for (int64_t li = 0; li < model_.num_layers(); ++li) {
      for (size_t ci = 0; ci < batch.size(); ++ci) rows_of[ci].kv = seqs[ci]->layers[static_cast<size_t>(li)].get();
      model_.run_layer(li, x.data(), rows, rows_of);
    }
  } catch (...) {
    // Only a failure inside the math gets here (a quantised KV cache rejects non-finite keys): some layers'
    // caches already hold the chunk, so the batch's sequences cannot continue and are freed.
    for (const SequenceChunk& c : batch) sequences_.erase(c.seq_id);
    throw;
  }
  for (size_t ci = 0; ci < batch.size(); ++ci) seqs[ci]->length += rows_of[ci].count;

  std::vector<std::vector<float>> out(batch.size());
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    const ref::SequenceRows& c = rows_of[ci];
    const int64_t first = all_logits ? c.first_row : c.first_row + c.count - 1;
    const int64_t n = all_logits ? c.count : 1;
    out[ci].resize(static_cast<size_t>(n * vocab));
    model_.final_logits(&x[first * h], n, out[ci].data());
  }
  return out;
}

}  // namespace

std::unique_ptr<Engine> make_reference_engine(const Model& model, const ReferenceOptions& options) {
  return std::make_unique<ReferenceEngine>(model, options);
}

}  // namespace futransformer
