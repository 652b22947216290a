// A small random Llama built in memory for the precision tests: head_dim 32 (the INT4 KV formats need a multiple of
// 32) and input sizes 64 and 128 (INT4 groups of 32 and 64 divide every projection's input).
#pragma once

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "futransformer/model.h"
#include "test_paths.h"

namespace futransformer::test {

struct TinyLlama {
  int64_t hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 32, inter = 128, vocab = 61;
  bool tied = false;
};

// A tiny Llama whose projections take the W4A16 GEMM at several tilings and whose heads are head_dim 64: hidden 256,
// intermediate 768 (gate|up 256 -> 1536, down 768 -> 256), 4 query and 2 KV heads, vocabulary 300.
inline TinyLlama tiny_llama_w4a16_shape() {
  TinyLlama s;
  s.hidden = 256;
  s.inter = 768;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 300;
  return s;
}

inline Model make_tiny_llama(const TinyLlama& s, uint32_t seed) {
  Model m;
  m.source = "synthetic:tiny-llama";
  m.format = "synthetic";
  ModelConfig& c = m.config;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = 256;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = s.tied;
  std::mt19937 rng(seed);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float stddev) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    m.tensors[name] = Tensor::from_f32(name, std::move(shape), std::move(v));
  };
  // N(0, 1/in) keeps activations O(1); q/k scaled up so attention is far from uniform.
  auto linear = [&](const std::string& name, int64_t out, int64_t in, float gain) {
    add(name, {out, in}, 0.0f, gain / std::sqrt(float(in)));
  };
  const int64_t h = s.hidden, qw = s.heads * s.head_dim, kvw = s.kv_heads * s.head_dim;
  add("model.embed_tokens.weight", {s.vocab, h}, 0.0f, 1.0f);
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h}, 1.0f, 0.2f);
    add(p + "post_attention_layernorm.weight", {h}, 1.0f, 0.2f);
    linear(p + "self_attn.q_proj.weight", qw, h, 3.0f);
    linear(p + "self_attn.k_proj.weight", kvw, h, 3.0f);
    linear(p + "self_attn.v_proj.weight", kvw, h, 1.0f);
    linear(p + "self_attn.o_proj.weight", h, qw, 1.0f);
    linear(p + "mlp.gate_proj.weight", s.inter, h, 1.0f);
    linear(p + "mlp.up_proj.weight", s.inter, h, 1.0f);
    linear(p + "mlp.down_proj.weight", h, s.inter, 1.0f);
  }
  add("model.norm.weight", {h}, 1.0f, 0.2f);
  if (!s.tied) linear("lm_head.weight", s.vocab, h, 1.0f);
  m.validate();
  return m;
}

inline std::vector<int32_t> random_token_ids(size_t n, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = dist(rng);
  return t;
}

// ||a - b|| / ||b|| over two equal-length vectors, in double.
inline double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / den);
}

// A fresh temporary directory (make_temp_dir) that is removed, with its contents, when the test binary exits.
inline std::string scratch_dir(const std::string& tag) {
  struct Cleanup {
    std::vector<std::string> dirs;
    ~Cleanup() {
      for (const std::string& d : dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    }
  };
  static Cleanup cleanup;
  cleanup.dirs.push_back(make_temp_dir(tag));
  return cleanup.dirs.back();
}

}  // namespace futransformer::test
