// The reference engine's model: weights as fp32 RefLinears and the Llama forward split into steps (embed, one
// decoder layer over a batch of sequences, final norm + LM head), so that the engine and the GPTQ calibration run
// the same code. A layer hook sees the input of each group of projections that share it (q/k/v, o, gate/up, down)
// before those projections run, and may replace their weights: sequential GPTQ quantises a group from its inputs
// and the rest of the same forward already uses the quantised weights.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "futransformer/recipe.h"
#include "ref/kv_cache.h"
#include "ref/linear.h"

namespace futransformer::ref {

enum class Projection : uint8_t { Q, K, V, O, Gate, Up, Down };
inline constexpr int kNumProjections = 7;
// "model.layers.<layer>.self_attn.q_proj.weight", … (the Hugging Face name).
std::string projection_tensor_name(int64_t layer, Projection p);

// Groups of projections that read the same activations (so share one GPTQ Hessian).
enum class ProjectionInput : uint8_t { Qkv, O, GateUp, Down };
const char* projection_input_name(ProjectionInput g);
// The projections that read input g.
std::span<const Projection> projections_of(ProjectionInput g);

struct RefModelOptions {
  ActivationFormat activations = ActivationFormat::Fp32;  // see ReferenceOptions::activations
  std::optional<formats::KvFormat> kv;                    // nullopt: fp32 cache
  HeadFormat head = HeadFormat::Full;                     // see ReferenceOptions::head
};

// Where one sequence's tokens sit in a batch: rows [first_row, first_row + count) at absolute positions
// first_pos …, attending over `kv` (this layer's cache of the sequence, which the layer appends to).
struct SequenceRows {
  int64_t first_row = 0;
  int64_t count = 0;
  int64_t first_pos = 0;
  KvStore* kv = nullptr;
};

// x: [rows, cols], the exact input the group's projections are about to multiply (before any input quantiser).
using LayerHook = std::function<void(int64_t layer, ProjectionInput input, const float* x, int64_t rows,
                                     int64_t cols)>;

class RefModel {
 public:
  // Validates the model and copies its weights as fp32. Throws Error when the KV format cannot hold the model's
  // head_dim.
  RefModel(const Model& model, const RefModelOptions& options);

  const ModelConfig& config() const { return config_; }
  const RefModelOptions& options() const { return options_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // An empty cache for one layer of one sequence, in the options' KV format.
  std::unique_ptr<KvStore> make_kv_store() const;

  // x[n, hidden] = the embedding rows of tokens (ids must be in range; the engine checks them).
  void embed(std::span<const int32_t> tokens, float* x) const;
  // One decoder layer in place on x [rows, hidden]; every row belongs to exactly one entry of seqs.
  void run_layer(int64_t layer, float* x, int64_t rows, std::span<const SequenceRows> seqs,
                 const LayerHook& hook = {});
  // logits[rows, vocab] = LM head of the final RMSNorm of x [rows, hidden].
  void final_logits(const float* x, int64_t rows, float* logits) const;

  const RefLinear& projection(int64_t layer, Projection p) const;
  // Replaces a projection's weights ([out, in], same shape); the activation quantiser stays.
  void set_projection_weights(int64_t layer, Projection p, std::vector<float> weights);

 private:
  struct Layer {
    std::vector<float> attn_norm, mlp_norm;
    RefLinear proj[kNumProjections];
  };
  RefLinear& linear(int64_t layer, Projection p);
  void attend(const float* q, int64_t q_width, std::span<const SequenceRows> seqs, float* out) const;

  ModelConfig config_;
  RefModelOptions options_;
  std::shared_ptr<const std::vector<float>> embedding_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  RefLinear lm_head_;
  std::vector<float> inv_freq_;
};

// In place: each of `rows` rows of `cols` values becomes its per-token FP8 E4M3 quantise-dequantise
// (formats::fp8_quantize_per_token, then decode · scale) — what an FP8 GEMM's activation operand holds.
void fp8_round_rows(float* x, int64_t rows, int64_t cols);
// In place: the same with one scale per token per 128 channels (formats::fp8_quantize_per_token_block) — the
// down GEMM's operand under act-fp8-block-bf16. cols must be a multiple of 128 (Error otherwise).
void fp8_block_round_rows(float* x, int64_t rows, int64_t cols);

}  // namespace futransformer::ref
