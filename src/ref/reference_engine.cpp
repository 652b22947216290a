#include "futransformer/reference_engine.h"

#include <algorithm>
#include <map>
#include <sstream>
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

// One engine for both factories. With a decode model, chunks of more than one token (prompts) run through `model_`
// and single-token chunks (decode steps) through `decode_`, over the same per-sequence caches.
class ReferenceEngine final : public Engine {
 public:
  ReferenceEngine(const Model& model, const ReferenceOptions& options);
  ReferenceEngine(const Model& prefill_model, const ReferenceOptions& prefill_options, const Model& decode_model,
                  const ReferenceOptions& decode_options);
  const ModelConfig& config() const override { return model_.config(); }
  std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits) override;
  int64_t sequence_length(int32_t seq_id) const override;
  void reset(int32_t seq_id) override { sequences_.erase(seq_id); }
  int64_t max_sequence_length() const override { return max_len_; }

 private:
  // Runs the chunks batch[i] for i in `which` (in that order, as one batch) through `model`; out[i] gets each
  // chunk's logits.
  void run(ref::RefModel& model, std::span<const SequenceChunk> batch, const std::vector<size_t>& which,
           bool all_logits, std::vector<std::vector<float>>& out);

  ref::RefModel model_;                     // every chunk; with decode_, the chunks of more than one token
  std::unique_ptr<ref::RefModel> decode_;   // single-token chunks (null: model_ runs them)
  int64_t max_len_ = 0;
  std::map<int32_t, Sequence> sequences_;
};

ref::RefModelOptions model_options(const ReferenceOptions& o) {
  ref::RefModelOptions m;
  m.activations = o.activations;
  m.kv = o.kv;
  m.head = o.head;
  return m;
}

int64_t resolved_max_length(const Model& model, const ReferenceOptions& options) {
  check(options.max_sequence_length >= 0, model.source, ": max_sequence_length ", options.max_sequence_length,
        " must be positive (or 0 for the model's max_position_embeddings)");
  return options.max_sequence_length > 0 ? options.max_sequence_length : model.config.max_position_embeddings;
}

template <typename T>
std::string text(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The first field in which two configs give a different forward pass ("" when none): name, then both values.
std::string config_difference(const ModelConfig& a, const ModelConfig& b) {
  const auto diff = [](const char* name, const auto& x, const auto& y) -> std::string {
    return x == y ? "" : std::string(name) + " (" + text(x) + " vs " + text(y) + ")";
  };
  for (const std::string& d :
       {diff("hidden_size", a.hidden_size, b.hidden_size),
        diff("intermediate_size", a.intermediate_size, b.intermediate_size),
        diff("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers),
        diff("num_attention_heads", a.num_attention_heads, b.num_attention_heads),
        diff("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads),
        diff("head_dim", a.head_dim, b.head_dim), diff("vocab_size", a.vocab_size, b.vocab_size),
        diff("rope_theta", a.rope_theta, b.rope_theta), diff("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps),
        diff("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings),
        diff("rope_scaling.type", "'" + a.rope_scaling.type + "'", "'" + b.rope_scaling.type + "'"),
        diff("rope_scaling.factor", a.rope_scaling.factor, b.rope_scaling.factor),
        diff("rope_scaling.low_freq_factor", a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor),
        diff("rope_scaling.high_freq_factor", a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor),
        diff("rope_scaling.original_max_position_embeddings", a.rope_scaling.original_max_position_embeddings,
             b.rope_scaling.original_max_position_embeddings),
        diff("rope_scaling.freq_divisors (count)", a.rope_scaling.freq_divisors.size(),
             b.rope_scaling.freq_divisors.size())}) {
    if (!d.empty()) return d;
  }
  if (a.rope_scaling.freq_divisors != b.rope_scaling.freq_divisors) return "rope_scaling.freq_divisors (values)";
  return "";
}

std::string kv_name(const std::optional<formats::KvFormat>& kv) { return kv ? formats::kv_format_name(*kv) : "fp32"; }

ReferenceEngine::ReferenceEngine(const Model& model, const ReferenceOptions& options)
    : model_(model, model_options(options)), max_len_(resolved_max_length(model, options)) {}

ReferenceEngine::ReferenceEngine(const Model& prefill_model, const ReferenceOptions& prefill_options,
                                 const Model& decode_model, const ReferenceOptions& decode_options)
    : model_(prefill_model, model_options(prefill_options)),
      decode_(std::make_unique<ref::RefModel>(decode_model, model_options(decode_options))),
      max_len_(resolved_max_length(prefill_model, prefill_options)) {
  constexpr const char* who = "prefill/decode reference engine: ";
  const std::string d = config_difference(prefill_model.config, decode_model.config);
  check(d.empty(), who, "the prefill model (", prefill_model.source, ") and the decode model (", decode_model.source,
        ") differ in ", d, "; both must be quantisations of one model");
  check(prefill_options.kv == decode_options.kv, who, "the prefill options' KV-cache format (",
        kv_name(prefill_options.kv), ") differs from the decode options' (", kv_name(decode_options.kv),
        "); decode steps read the cache the prompts wrote, so both must use one format");
  // The CUDA engine runs every chunk's head from the decode model: both must name one head format (quantisations
  // of one checkpoint then hold the same head, RTN being deterministic).
  check(prefill_options.head == decode_options.head, who, "the prefill options' LM head is ",
        prefill_options.head == HeadFormat::Int4 ? "INT4 (head-int4)" : "full precision", " and the decode options' ",
        decode_options.head == HeadFormat::Int4 ? "INT4 (head-int4)" : "full precision",
        "; both recipes must name the same head format");
  const int64_t decode_len = resolved_max_length(decode_model, decode_options);
  check(decode_len == max_len_, who, "the prefill options allow sequences of ", max_len_,
        " tokens and the decode options ", decode_len, "; both must allow the same length");
}

int64_t ReferenceEngine::sequence_length(int32_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? 0 : it->second.length;
}

// check_batch finds every user error before any cache changes, so a rejected batch leaves the engine as it was.
std::vector<std::vector<float>> ReferenceEngine::forward(std::span<const SequenceChunk> batch, bool all_logits) {
  check_batch(*this, batch, "reference engine");
  std::vector<std::vector<float>> out(batch.size());
  std::vector<size_t> prompts, steps;
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    (decode_ && batch[ci].tokens.size() == 1 ? steps : prompts).push_back(ci);
  }
  try {
    // The two groups share no sequence (ids are unique in a batch) and rows never interact outside attention, so
    // running them one after the other is the same math as one batch (with BLAS a row's rounding may depend on
    // how many rows share the sgemm call).
    if (!prompts.empty()) run(model_, batch, prompts, all_logits, out);
    if (!steps.empty()) run(*decode_, batch, steps, all_logits, out);
  } catch (...) {
    // Only a failure inside the math gets here (a quantised KV cache rejects non-finite keys): some layers'
    // caches already hold the chunk, so the batch's sequences cannot continue and are freed.
    for (const SequenceChunk& c : batch) sequences_.erase(c.seq_id);
    throw;
  }
  return out;
}

void ReferenceEngine::run(ref::RefModel& model, std::span<const SequenceChunk> batch, const std::vector<size_t>& which,
                          bool all_logits, std::vector<std::vector<float>>& out) {
  const int64_t h = config().hidden_size, vocab = config().vocab_size;

  // All chunks' tokens go through the projections together as one [rows, hidden] matrix; only attention is
  // per chunk, over that chunk's own cache and positions.
  std::vector<ref::SequenceRows> rows_of(which.size());
  std::vector<Sequence*> seqs(which.size());
  int64_t rows = 0;
  for (size_t k = 0; k < which.size(); ++k) {
    const SequenceChunk& chunk = batch[which[k]];
    Sequence& seq = sequences_[chunk.seq_id];
    // Either model makes the stores: both have one KV format and one config (checked at construction).
    if (seq.layers.empty()) {
      for (int64_t i = 0; i < model.num_layers(); ++i) seq.layers.push_back(model.make_kv_store());
    }
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    rows_of[k] = {rows, n, seq.length, nullptr};
    seqs[k] = &seq;
    rows += n;
  }

  std::vector<float> x(static_cast<size_t>(rows * h));
  for (size_t k = 0; k < which.size(); ++k) model.embed(batch[which[k]].tokens, &x[rows_of[k].first_row * h]);
  for (int64_t li = 0; li < model.num_layers(); ++li) {
    for (size_t k = 0; k < which.size(); ++k) rows_of[k].kv = seqs[k]->layers[static_cast<size_t>(li)].get();
    model.run_layer(li, x.data(), rows, rows_of);
  }
  for (size_t k = 0; k < which.size(); ++k) seqs[k]->length += rows_of[k].count;

  for (size_t k = 0; k < which.size(); ++k) {
    const ref::SequenceRows& c = rows_of[k];
    const int64_t first = all_logits ? c.first_row : c.first_row + c.count - 1;
    const int64_t n = all_logits ? c.count : 1;
    std::vector<float>& o = out[which[k]];
    o.resize(static_cast<size_t>(n * vocab));
    model.final_logits(&x[first * h], n, o.data());
  }
}

}  // namespace

std::unique_ptr<Engine> make_reference_engine(const Model& model, const ReferenceOptions& options) {
  return std::make_unique<ReferenceEngine>(model, options);
}

std::unique_ptr<Engine> make_prefill_decode_reference_engine(const Model& prefill_model,
                                                             const ReferenceOptions& prefill_options,
                                                             const Model& decode_model,
                                                             const ReferenceOptions& decode_options) {
  return std::make_unique<ReferenceEngine>(prefill_model, prefill_options, decode_model, decode_options);
}

}  // namespace futransformer
