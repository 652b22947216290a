#include "ref/ref_model.h"

#include <algorithm>
#include <array>

#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"
#include "ref/ops.h"

namespace futransformer::ref {
namespace {

constexpr std::array<const char*, kNumProjections> kSuffixes = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

constexpr Projection kQkv[] = {Projection::Q, Projection::K, Projection::V};
constexpr Projection kO[] = {Projection::O};
constexpr Projection kGateUp[] = {Projection::Gate, Projection::Up};
constexpr Projection kDown[] = {Projection::Down};

size_t idx(Projection p) { return static_cast<size_t>(p); }

}  // namespace

std::string projection_tensor_name(int64_t layer, Projection p) {
  return "model.layers." + std::to_string(layer) + "." + kSuffixes[idx(p)];
}

const char* projection_input_name(ProjectionInput g) {
  switch (g) {
    case ProjectionInput::Qkv: return "q/k/v";
    case ProjectionInput::O: return "o";
    case ProjectionInput::GateUp: return "gate/up";
    case ProjectionInput::Down: return "down";
  }
  return "?";
}

std::span<const Projection> projections_of(ProjectionInput g) {
  switch (g) {
    case ProjectionInput::Qkv: return kQkv;
    case ProjectionInput::O: return kO;
    case ProjectionInput::GateUp: return kGateUp;
    case ProjectionInput::Down: return kDown;
  }
  return {};
}

namespace {

void bf16_round(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

void bf16_round_rows(float* x, int64_t rows, int64_t cols) { bf16_round(x, rows * cols); }

// act-fp8-bf16's o_proj input: the GPU's attention kernel writes BF16, which quantize_rows_fp8 then quantises.
void bf16_then_fp8_round_rows(float* x, int64_t rows, int64_t cols) {
  bf16_round(x, rows * cols);
  fp8_round_rows(x, rows, cols);
}

// The rounding an activation format applies to projection p's input (empty: none).
RefLinear::InputQuantizer input_quantizer(ActivationFormat a, Projection p) {
  switch (a) {
    case ActivationFormat::Fp32: return {};
    case ActivationFormat::Fp8PerToken: return fp8_round_rows;
    case ActivationFormat::Bf16: return bf16_round_rows;
    case ActivationFormat::Fp8OverBf16: return p == Projection::O ? bf16_then_fp8_round_rows : fp8_round_rows;
    case ActivationFormat::Fp8BlockOverBf16:
      if (p == Projection::O) return bf16_then_fp8_round_rows;
      return p == Projection::Down ? fp8_block_round_rows : fp8_round_rows;
  }
  return {};
}

// Formats whose projection outputs, RoPE'd q/k and LM-head input are BF16, as the CUDA engine's kernels write them.
bool bf16_exchange(ActivationFormat a) {
  return a == ActivationFormat::Bf16 || a == ActivationFormat::Fp8OverBf16 || a == ActivationFormat::Fp8BlockOverBf16;
}

// Replaces x with the dequantised values of q (same shape).
void decode_into(const formats::Fp8Matrix& q, float* x) {
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const size_t i = static_cast<size_t>(r * q.cols + c);
      x[i] = formats::fp8_e4m3_decode(q.codes[i]) * q.scale(r, c);
    }
  }
}

}  // namespace

void fp8_round_rows(float* x, int64_t rows, int64_t cols) {
  decode_into(formats::fp8_quantize_per_token(std::span<const float>(x, static_cast<size_t>(rows * cols)), rows, cols,
                                              "projection input (act-fp8)"),
              x);
}

void fp8_block_round_rows(float* x, int64_t rows, int64_t cols) {
  decode_into(formats::fp8_quantize_per_token_block(std::span<const float>(x, static_cast<size_t>(rows * cols)), rows,
                                                    cols, "down projection input (act-fp8-block-bf16)"),
              x);
}

RefModel::RefModel(const Model& model, const RefModelOptions& options) : config_(model.config), options_(options) {
  model.validate();
  // A fused SwiGLU epilogue sees 128 channels of a row per GEMM tile, so the block format has no partial blocks.
  constexpr int64_t kBlock = formats::kFp8BlockCols;
  check(options_.activations != ActivationFormat::Fp8BlockOverBf16 || config_.intermediate_size % kBlock == 0,
        model.source, ": act-fp8-block-bf16 quantises the down projection's input with one FP8 scale per ", kBlock,
        " channels, but intermediate_size ", config_.intermediate_size, " is not a multiple of ", kBlock,
        "; use act-fp8-bf16 (one scale per token) for this model");
  if (options_.kv) {
    try {
      formats::kv_page_layout(*options_.kv, config_.head_dim);
    } catch (const Error& e) {
      fail(model.source, ": KV-cache format ", formats::kv_format_name(*options_.kv), " cannot hold this model's ",
           "heads: ", e.what());
    }
  }
  const Tensor& emb = model.get("model.embed_tokens.weight");
  embedding_ = std::make_shared<const std::vector<float>>(emb.to_f32());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer l;
    l.attn_norm = model.get(p + "input_layernorm.weight").to_f32();
    l.mlp_norm = model.get(p + "post_attention_layernorm.weight").to_f32();
    for (int j = 0; j < kNumProjections; ++j) {
      l.proj[j] = RefLinear::from_tensor(model.get(projection_tensor_name(i, static_cast<Projection>(j))));
      l.proj[j].set_input_quantizer(input_quantizer(options_.activations, static_cast<Projection>(j)));
    }
    layers_.push_back(std::move(l));
  }
  final_norm_ = model.get("model.norm.weight").to_f32();
  // Tied as in HF: the head is the embedding matrix (any lm_head.weight is ignored), held once — unless the head is
  // INT4, whose dequantised copy is lm_head.weight (quant::quantize_model adds it for tied models). The head has no
  // input quantiser: act-fp8 rounds only the decoder projections' inputs, and act-bf16's rounding of the head's
  // input happens in final_logits.
  if (options_.head == HeadFormat::Int4) {
    check(model.has(kLmHeadTensor), model.source, ": head-int4 needs tensor '", kLmHeadTensor, "' holding the ",
          "dequantised INT4 head (quant::quantize_model with a head-int4 recipe adds it, also for tied embeddings)");
    lm_head_ = RefLinear::from_tensor(model.get(kLmHeadTensor, {config_.vocab_size, config_.hidden_size}));
  } else if (config_.tie_word_embeddings) {
    lm_head_ = RefLinear(emb.name, config_.vocab_size, config_.hidden_size, embedding_);
  } else {
    lm_head_ = RefLinear::from_tensor(model.get("lm_head.weight"));
  }
  inv_freq_ = rope_inv_freq(config_.head_dim, config_.rope_theta, config_.rope_scaling);
}

std::unique_ptr<KvStore> RefModel::make_kv_store() const {
  return ref::make_kv_store(options_.kv, config_.num_key_value_heads, config_.head_dim);
}

RefLinear& RefModel::linear(int64_t layer, Projection p) {
  check(layer >= 0 && layer < num_layers(), "reference model: layer ", layer, " outside [0, ", num_layers(), ")");
  return layers_[static_cast<size_t>(layer)].proj[idx(p)];
}

const RefLinear& RefModel::projection(int64_t layer, Projection p) const {
  return const_cast<RefModel*>(this)->linear(layer, p);
}

void RefModel::set_projection_weights(int64_t layer, Projection p, std::vector<float> weights) {
  RefLinear& l = linear(layer, p);
  RefLinear replaced(l.name(), l.out_features(), l.in_features(),
                     std::make_shared<const std::vector<float>>(std::move(weights)));
  replaced.set_input_quantizer(input_quantizer(options_.activations, p));
  l = std::move(replaced);
}

void RefModel::embed(std::span<const int32_t> tokens, float* x) const {
  const int64_t h = config_.hidden_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* e = embedding_->data() + static_cast<int64_t>(tokens[i]) * h;
    std::copy(e, e + h, x + static_cast<int64_t>(i) * h);
  }
}

// q: [rows, nh·hd] after RoPE, in the model's basis. For int4-hadamard the cache holds H·k − c (c: the key anchor)
// and H·v, so each chunk's queries are rotated (H·q · (H·k − c) = q · k − H·q · c, the same shift for every key,
// which softmax cancels) and the output, a weighted sum of H·v, is rotated back.
void RefModel::attend(const float* q_in, int64_t qw, std::span<const SequenceRows> seqs, float* out) const {
  const int64_t hd = config_.head_dim, nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
  const int64_t kvw = nkv * hd;
  std::vector<float> q, keys, values;
  for (const SequenceRows& s : seqs) {
    const size_t n_q = static_cast<size_t>(s.count * qw);
    q.assign(q_in + s.first_row * qw, q_in + s.first_row * qw + n_q);
    if (options_.kv) formats::kv_rotate_query(*options_.kv, hd, q);
    const int64_t n_kv = s.first_pos + s.count;
    keys.resize(static_cast<size_t>(n_kv * kvw));
    values.resize(static_cast<size_t>(n_kv * kvw));
    s.kv->read_keys(n_kv, keys.data());
    s.kv->read_values(n_kv, values.data());
    float* o = out + s.first_row * qw;
    attention(q.data(), keys.data(), values.data(), o, s.count, s.first_pos, n_kv, nh, nkv, hd);
    if (options_.kv) formats::kv_unrotate_output(*options_.kv, hd, std::span<float>(o, n_q));
  }
}

void RefModel::run_layer(int64_t index, float* x, int64_t rows, std::span<const SequenceRows> seqs,
                         const LayerHook& hook) {
  check(index >= 0 && index < num_layers(), "reference model: layer ", index, " outside [0, ", num_layers(), ")");
  const Layer& l = layers_[static_cast<size_t>(index)];
  const int64_t h = config_.hidden_size, hd = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
  const int64_t qw = nh * hd, kvw = nkv * hd, inter = config_.intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  auto observe = [&](ProjectionInput g, const float* in, int64_t cols) {
    if (hook) hook(index, g, in, rows, cols);
  };
  auto proj = [&](Projection p) -> const RefLinear& { return l.proj[idx(p)]; };
  // act-bf16 / act-fp8-bf16: the GPU's GEMMs write BF16 and RoPE rounds q and k again (inputs are rounded by the
  // quantiser).
  const bool bf16 = bf16_exchange(options_.activations);
  auto round_out = [&](std::vector<float>& v) {
    if (bf16) bf16_round(v.data(), static_cast<int64_t>(v.size()));
  };

  std::vector<float> xn(static_cast<size_t>(rows * h));
  for (int64_t r = 0; r < rows; ++r) rmsnorm(&x[r * h], l.attn_norm.data(), &xn[r * h], h, eps);
  observe(ProjectionInput::Qkv, xn.data(), h);
  std::vector<float> q(static_cast<size_t>(rows * qw)), k(static_cast<size_t>(rows * kvw)),
      v(static_cast<size_t>(rows * kvw));
  proj(Projection::Q).forward(xn.data(), rows, q.data());
  proj(Projection::K).forward(xn.data(), rows, k.data());
  proj(Projection::V).forward(xn.data(), rows, v.data());
  round_out(q);
  round_out(k);
  round_out(v);

  for (const SequenceRows& s : seqs) {
    for (int64_t i = 0; i < s.count; ++i) {
      const int64_t r = s.first_row + i;
      apply_rope(&q[r * qw], nh, hd, s.first_pos + i, inv_freq_.data());
      apply_rope(&k[r * kvw], nkv, hd, s.first_pos + i, inv_freq_.data());
    }
  }
  round_out(q);
  round_out(k);
  for (const SequenceRows& s : seqs) s.kv->append(&k[s.first_row * kvw], &v[s.first_row * kvw], s.count);
  std::vector<float> att(static_cast<size_t>(rows * qw));
  attend(q.data(), qw, seqs, att.data());

  observe(ProjectionInput::O, att.data(), qw);
  std::vector<float> delta(static_cast<size_t>(rows * h));
  proj(Projection::O).forward(att.data(), rows, delta.data());
  round_out(delta);
  for (int64_t i = 0; i < rows * h; ++i) x[i] += delta[static_cast<size_t>(i)];

  for (int64_t r = 0; r < rows; ++r) rmsnorm(&x[r * h], l.mlp_norm.data(), &xn[r * h], h, eps);
  observe(ProjectionInput::GateUp, xn.data(), h);
  std::vector<float> gate(static_cast<size_t>(rows * inter)), up(static_cast<size_t>(rows * inter));
  proj(Projection::Gate).forward(xn.data(), rows, gate.data());
  proj(Projection::Up).forward(xn.data(), rows, up.data());
  round_out(gate);
  round_out(up);
  swiglu(gate.data(), up.data(), gate.data(), rows * inter);
  observe(ProjectionInput::Down, gate.data(), inter);
  proj(Projection::Down).forward(gate.data(), rows, delta.data());
  round_out(delta);
  for (int64_t i = 0; i < rows * h; ++i) x[i] += delta[static_cast<size_t>(i)];
}

void RefModel::final_logits(const float* x, int64_t rows, float* logits) const {
  const int64_t h = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> xn(static_cast<size_t>(rows * h));
  for (int64_t r = 0; r < rows; ++r) rmsnorm(&x[r * h], final_norm_.data(), &xn[r * h], h, eps);
  const bool bf16 = bf16_exchange(options_.activations);
  if (bf16) bf16_round(xn.data(), rows * h);
  lm_head_.forward(xn.data(), rows, logits);
  // The GPU's INT4 head is a W4A16 GEMM, which writes BF16 (the BF16 head's cuBLAS GEMM writes fp32 logits).
  if (bf16 && options_.head == HeadFormat::Int4) bf16_round(logits, rows * config_.vocab_size);
}

}  // namespace futransformer::ref
