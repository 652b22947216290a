#include "futransformer/reference_engine.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "futransformer/error.h"
#include "ref/kv_cache.h"
#include "ref/linear.h"
#include "ref/ops.h"

namespace futransformer {
namespace {

using ref::RefLinear;

struct Layer {
  std::vector<float> attn_norm, mlp_norm;
  RefLinear q, k, v, o, gate, up, down;
};

struct Sequence {
  int64_t length = 0;
  std::vector<std::unique_ptr<ref::KvStore>> layers;  // one store per layer
};

// Where one chunk's tokens sit in the batch's rows.
struct ChunkRows {
  int64_t first_row = 0;
  int64_t count = 0;
  int64_t first_pos = 0;  // absolute position of the chunk's first token
  Sequence* seq = nullptr;
};

class ReferenceEngine final : public Engine {
 public:
  ReferenceEngine(const Model& model, const ReferenceOptions& options);
  const ModelConfig& config() const override { return config_; }
  std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits) override;
  int64_t sequence_length(int32_t seq_id) const override;
  void reset(int32_t seq_id) override { sequences_.erase(seq_id); }
  int64_t max_sequence_length() const override { return max_len_; }

 private:
  void validate_batch(std::span<const SequenceChunk> batch) const;
  void run_layer(const Layer& layer, size_t index, std::vector<float>& x, const std::vector<ChunkRows>& chunks,
                 int64_t rows) const;

  ModelConfig config_;
  std::string source_;
  int64_t max_len_ = 0;
  std::shared_ptr<const std::vector<float>> embedding_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  RefLinear lm_head_;
  std::vector<float> inv_freq_;
  ref::KvStoreFactory kv_factory_ = ref::make_f32_kv_store;
  std::map<int32_t, Sequence> sequences_;
};

ReferenceEngine::ReferenceEngine(const Model& model, const ReferenceOptions& options)
    : config_(model.config), source_(model.source) {
  model.validate();
  check(options.max_sequence_length >= 0, source_, ": max_sequence_length ", options.max_sequence_length,
        " must be positive (or 0 for the model's max_position_embeddings)");
  max_len_ = options.max_sequence_length > 0 ? options.max_sequence_length : config_.max_position_embeddings;
  const Tensor& emb = model.get("model.embed_tokens.weight");
  embedding_ = std::make_shared<const std::vector<float>>(emb.to_f32());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto linear = [&](const std::string& name) { return RefLinear::from_tensor(model.get(p + name)); };
    Layer l;
    l.attn_norm = model.get(p + "input_layernorm.weight").to_f32();
    l.mlp_norm = model.get(p + "post_attention_layernorm.weight").to_f32();
    l.q = linear("self_attn.q_proj.weight");
    l.k = linear("self_attn.k_proj.weight");
    l.v = linear("self_attn.v_proj.weight");
    l.o = linear("self_attn.o_proj.weight");
    l.gate = linear("mlp.gate_proj.weight");
    l.up = linear("mlp.up_proj.weight");
    l.down = linear("mlp.down_proj.weight");
    layers_.push_back(std::move(l));
  }
  final_norm_ = model.get("model.norm.weight").to_f32();
  // Tied as in HF: the head is the embedding matrix (any lm_head.weight is ignored), held once.
  if (config_.tie_word_embeddings) {
    lm_head_ = RefLinear(emb.name, config_.vocab_size, config_.hidden_size, embedding_);
  } else {
    lm_head_ = RefLinear::from_tensor(model.get("lm_head.weight"));
  }
  inv_freq_ = ref::rope_inv_freq(config_.head_dim, config_.rope_theta, config_.rope_scaling);
}

int64_t ReferenceEngine::sequence_length(int32_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? 0 : it->second.length;
}

// Every user error is found before any cache changes, so a rejected batch leaves the engine as it was.
void ReferenceEngine::validate_batch(std::span<const SequenceChunk> batch) const {
  std::set<int32_t> seen;
  for (const SequenceChunk& c : batch) {
    check(seen.insert(c.seq_id).second, "reference engine: sequence ", c.seq_id,
          " appears more than once in one batch");
    check(!c.tokens.empty(), "reference engine: sequence ", c.seq_id, " has an empty chunk (no tokens to run)");
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      check(c.tokens[i] >= 0 && c.tokens[i] < config_.vocab_size, "reference engine: sequence ", c.seq_id,
            ": token id ", c.tokens[i], " at chunk index ", i, " is outside the vocabulary [0, ", config_.vocab_size,
            ")");
    }
    const int64_t cached = sequence_length(c.seq_id);
    const int64_t added = static_cast<int64_t>(c.tokens.size());
    check(added <= max_len_ - cached, "reference engine: sequence ", c.seq_id, " would hold ", cached, " + ", added,
          " tokens, more than the maximum sequence length ", max_len_);
  }
}

void ReferenceEngine::run_layer(const Layer& l, size_t index, std::vector<float>& x,
                                const std::vector<ChunkRows>& chunks, int64_t rows) const {
  const int64_t h = config_.hidden_size, hd = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
  const int64_t qw = nh * hd, kvw = nkv * hd, inter = config_.intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);

  std::vector<float> xn(static_cast<size_t>(rows * h));
  for (int64_t r = 0; r < rows; ++r) ref::rmsnorm(&x[r * h], l.attn_norm.data(), &xn[r * h], h, eps);
  std::vector<float> q(static_cast<size_t>(rows * qw)), k(static_cast<size_t>(rows * kvw)),
      v(static_cast<size_t>(rows * kvw));
  l.q.forward(xn.data(), rows, q.data());
  l.k.forward(xn.data(), rows, k.data());
  l.v.forward(xn.data(), rows, v.data());

  std::vector<float> att(static_cast<size_t>(rows * qw));
  std::vector<float> keys, values;
  for (const ChunkRows& c : chunks) {
    for (int64_t i = 0; i < c.count; ++i) {
      const int64_t r = c.first_row + i;
      ref::apply_rope(&q[r * qw], nh, hd, c.first_pos + i, inv_freq_.data());
      ref::apply_rope(&k[r * kvw], nkv, hd, c.first_pos + i, inv_freq_.data());
    }
    ref::KvStore& store = *c.seq->layers[index];
    store.append(&k[c.first_row * kvw], &v[c.first_row * kvw], c.count);
    const int64_t n_kv = c.first_pos + c.count;
    keys.resize(static_cast<size_t>(n_kv * kvw));
    values.resize(static_cast<size_t>(n_kv * kvw));
    store.read_keys(n_kv, keys.data());
    store.read_values(n_kv, values.data());
    ref::attention(&q[c.first_row * qw], keys.data(), values.data(), &att[c.first_row * qw], c.count, c.first_pos,
                   n_kv, nh, nkv, hd);
  }

  std::vector<float> delta(static_cast<size_t>(rows * h));
  l.o.forward(att.data(), rows, delta.data());
  for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];

  for (int64_t r = 0; r < rows; ++r) ref::rmsnorm(&x[r * h], l.mlp_norm.data(), &xn[r * h], h, eps);
  std::vector<float> gate(static_cast<size_t>(rows * inter)), up(static_cast<size_t>(rows * inter));
  l.gate.forward(xn.data(), rows, gate.data());
  l.up.forward(xn.data(), rows, up.data());
  ref::swiglu(gate.data(), up.data(), gate.data(), rows * inter);
  l.down.forward(gate.data(), rows, delta.data());
  for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
}

std::vector<std::vector<float>> ReferenceEngine::forward(std::span<const SequenceChunk> batch, bool all_logits) {
  validate_batch(batch);
  const int64_t h = config_.hidden_size, vocab = config_.vocab_size;

  // All chunks' tokens go through the projections together as one [rows, hidden] matrix; only attention is
  // per chunk, over that chunk's own cache and positions.
  std::vector<ChunkRows> chunks;
  int64_t rows = 0;
  for (const SequenceChunk& c : batch) {
    Sequence& seq = sequences_[c.seq_id];
    if (seq.layers.empty()) {
      for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
        seq.layers.push_back(kv_factory_(config_.num_key_value_heads * config_.head_dim));
    }
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    chunks.push_back({rows, n, seq.length, &seq});
    rows += n;
  }

  std::vector<float> x(static_cast<size_t>(rows * h));
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    for (int64_t i = 0; i < chunks[ci].count; ++i) {
      const float* e = embedding_->data() + static_cast<int64_t>(batch[ci].tokens[i]) * h;
      std::copy(e, e + h, &x[(chunks[ci].first_row + i) * h]);
    }
  }
  for (size_t li = 0; li < layers_.size(); ++li) run_layer(layers_[li], li, x, chunks, rows);
  for (ChunkRows& c : chunks) c.seq->length += c.count;

  std::vector<std::vector<float>> out(batch.size());
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const ChunkRows& c = chunks[ci];
    const int64_t first = all_logits ? c.first_row : c.first_row + c.count - 1;
    const int64_t n = all_logits ? c.count : 1;
    std::vector<float> xn(static_cast<size_t>(n * h));
    for (int64_t r = 0; r < n; ++r) ref::rmsnorm(&x[(first + r) * h], final_norm_.data(), &xn[r * h], h, eps);
    out[ci].resize(static_cast<size_t>(n * vocab));
    lm_head_.forward(xn.data(), n, out[ci].data());
  }
  return out;
}

}  // namespace

std::unique_ptr<Engine> make_reference_engine(const Model& model, const ReferenceOptions& options) {
  return std::make_unique<ReferenceEngine>(model, options);
}

}  // namespace futransformer
