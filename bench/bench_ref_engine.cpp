// Times the CPU reference engine on a random model of SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads, 3 KV
// heads, head_dim 64, intermediate 1536, vocab 49152, tied): one prefill window with every position's logits (the
// perplexity workload) and a run of decode steps. Usage: bench_ref_engine [window=2048] [decode_steps=32]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/reference_engine.h"

using namespace futransformer;

namespace {

Model smollm2_shaped_model() {
  Model m;
  m.source = "synthetic:smollm2-135m-shape";
  m.format = "synthetic";
  ModelConfig& c = m.config;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 30;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.vocab_size = 49152;
  c.max_position_embeddings = 8192;
  c.rope_theta = 100000.0;
  c.tie_word_embeddings = true;
  // Uniform weights of the right scale are enough for timing and much cheaper to draw than normals.
  std::mt19937 rng(1);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    m.tensors[name] = Tensor::from_f32(name, std::move(shape), std::move(v));
  };
  const int64_t h = c.hidden_size, kv = c.num_key_value_heads * c.head_dim, in = c.intermediate_size;
  add("model.embed_tokens.weight", {c.vocab_size, h}, -0.1f, 0.1f);
  add("model.norm.weight", {h}, 0.9f, 1.1f);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h}, 0.9f, 1.1f);
    add(p + "post_attention_layernorm.weight", {h}, 0.9f, 1.1f);
    add(p + "self_attn.q_proj.weight", {h, h}, -0.07f, 0.07f);
    add(p + "self_attn.k_proj.weight", {kv, h}, -0.07f, 0.07f);
    add(p + "self_attn.v_proj.weight", {kv, h}, -0.07f, 0.07f);
    add(p + "self_attn.o_proj.weight", {h, h}, -0.07f, 0.07f);
    add(p + "mlp.gate_proj.weight", {in, h}, -0.07f, 0.07f);
    add(p + "mlp.up_proj.weight", {in, h}, -0.07f, 0.07f);
    add(p + "mlp.down_proj.weight", {h, in}, -0.04f, 0.04f);
  }
  return m;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int window = argc > 1 ? std::atoi(argv[1]) : 2048;
    const int steps = argc > 2 ? std::atoi(argv[2]) : 32;
    check(window > 0 && steps >= 0, "usage: bench_ref_engine [window > 0] [decode_steps >= 0]");
    const Model model = smollm2_shaped_model();
    auto engine = make_reference_engine(model);
    const double params = static_cast<double>(model.parameter_count());

    std::mt19937 rng(2);
    std::uniform_int_distribution<int32_t> tok(0, 49151);
    std::vector<int32_t> tokens(static_cast<size_t>(window));
    for (int32_t& t : tokens) t = tok(rng);

    auto t0 = std::chrono::steady_clock::now();
    const auto logits = engine->forward(std::vector<SequenceChunk>{{0, tokens}}, true);
    const double prefill = seconds_since(t0);
    // Projections and LM head: 2 flops per parameter per token; attention: 4·d per head per (query, key) pair.
    const double attn_flops = 4.0 * 64 * 9 * 30 * (static_cast<double>(window) * (window + 1) / 2);
    std::printf("prefill %d tokens (all logits): %.2f s, %.1f tok/s, %.1f GFLOP/s\n", window, prefill,
                window / prefill, (2.0 * params * window + attn_flops) / prefill * 1e-9);

    engine->reset(0);
    engine->forward(std::vector<SequenceChunk>{{0, std::vector<int32_t>(tokens.begin(), tokens.begin() + 16)}});
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) engine->forward(std::vector<SequenceChunk>{{0, {tokens[16 + i % 100]}}});
    const double decode = seconds_since(t0);
    if (steps > 0) std::printf("decode: %.1f ms/token\n", decode / steps * 1e3);
    return logits.empty() ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
