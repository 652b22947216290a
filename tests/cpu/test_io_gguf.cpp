#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <random>

#include "futransformer/error.h"
#include "futransformer/io/gguf.h"
#include "futransformer/mapped_file.h"
#include "futransformer/model.h"
#include "gguf_test_writer.h"
#include "test_paths.h"

namespace futransformer {
namespace {

using test::GgufWriter;

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kBF16 = 30, kQ4_K = 12;

struct RawTensor {
  std::vector<uint64_t> dims;  // GGUF order
  uint32_t type;
  std::vector<uint8_t> bytes;
};

// Random bytes of a tensor; block scales are real f16 values so the decoded numbers are finite and varied.
std::vector<uint8_t> random_bytes(uint32_t type, size_t numel, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> out;
  auto put16 = [&](uint16_t h) { GgufWriter::put<uint16_t>(out, h); };
  switch (type) {
    case kF32:
      for (size_t i = 0; i < numel; ++i) GgufWriter::put<float>(out, val(rng));
      break;
    case kF16:
      for (size_t i = 0; i < numel; ++i) put16(f32_to_f16(val(rng)));
      break;
    case kBF16:
      for (size_t i = 0; i < numel; ++i) put16(f32_to_bf16(val(rng)));
      break;
    default: {
      const size_t qbytes = type == kQ8_0 ? 32 : 16;
      for (size_t b = 0; b < numel / 32; ++b) {
        put16(f32_to_f16(scale(rng) * (byte(rng) % 2 ? 1.f : -1.f)));
        if (type == kQ4_1) put16(f32_to_f16(val(rng)));
        for (size_t j = 0; j < qbytes; ++j) out.push_back(static_cast<uint8_t>(byte(rng)));
      }
    }
  }
  return out;
}

// The test's own decoder, written from the format description (one block = 32 elements along ne0).
std::vector<float> decode(const RawTensor& t) {
  size_t numel = 1;
  for (uint64_t d : t.dims) numel *= d;
  std::vector<float> out(numel);
  const uint8_t* p = t.bytes.data();
  auto rd16 = [](const uint8_t* q) {
    uint16_t h;
    std::memcpy(&h, q, 2);
    return h;
  };
  for (size_t i = 0; i < numel; ++i) {
    const size_t blk = i / 32, j = i % 32;
    switch (t.type) {
      case kF32: std::memcpy(&out[i], p + 4 * i, 4); break;
      case kF16: out[i] = f16_to_f32(rd16(p + 2 * i)); break;
      case kBF16: out[i] = bf16_to_f32(rd16(p + 2 * i)); break;
      case kQ8_0: {
        const uint8_t* b = p + 34 * blk;
        out[i] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * f16_to_f32(rd16(b));
        break;
      }
      case kQ4_0: {
        const uint8_t* b = p + 18 * blk;
        const int nib = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        out[i] = static_cast<float>(nib - 8) * f16_to_f32(rd16(b));
        break;
      }
      case kQ4_1: {
        const uint8_t* b = p + 20 * blk;
        const int nib = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
        out[i] = static_cast<float>(nib) * f16_to_f32(rd16(b)) + f16_to_f32(rd16(b + 2));
        break;
      }
    }
  }
  return out;
}

// HF row p*(hd/2)+i of each head comes from GGUF row 2i+p.
std::vector<float> unpermute_rows(const std::vector<float>& gguf, int64_t rows, int64_t cols, int64_t hd) {
  std::vector<float> hf(gguf.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / hd, within = r % hd, p = within / (hd / 2), i = within % (hd / 2);
    const int64_t src = h * hd + 2 * i + p;
    std::memcpy(&hf[static_cast<size_t>(r * cols)], &gguf[static_cast<size_t>(src * cols)],
                static_cast<size_t>(cols) * 4);
  }
  return hf;
}

struct TinySpec {
  int64_t hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, ffn = 96, layers = 2, vocab = 40;
  uint32_t weight_type = kF32;
  bool tied = false;
  bool tokenizer = true;
  uint32_t seed = 7;
};

struct Tiny {
  GgufWriter w;
  std::map<std::string, RawTensor> raw;  // by GGUF name
};

void add_config(GgufWriter& w, const TinySpec& s) {
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "tiny");
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(s.hidden));
  w.add_u32("llama.block_count", static_cast<uint32_t>(s.layers));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(s.ffn));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(s.heads));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  if (s.head_dim != s.hidden / s.heads) w.add_u32("llama.attention.key_length", static_cast<uint32_t>(s.head_dim));
  w.add_u32("llama.context_length", 256);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_f32("llama.rope.freq_base", 50000.0f);
}

void add_tokenizer(GgufWriter& w, int64_t vocab) {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int64_t i = 0; i < vocab; ++i) {
    tokens.push_back("tok" + std::to_string(i));
    scores.push_back(-static_cast<float>(i));
    types.push_back(i < 2 ? 3 : 1);
  }
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "smollm");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", {"t o", "to k"});
  w.add_u32("tokenizer.ggml.bos_token_id", 0);
  w.add_u32("tokenizer.ggml.eos_token_id", 1);
  w.add_i32("tokenizer.ggml.padding_token_id", 1);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
}

Tiny make_tiny(const TinySpec& s) {
  Tiny t;
  std::mt19937 rng(s.seed);
  add_config(t.w, s);
  if (s.tokenizer) add_tokenizer(t.w, s.vocab);
  auto add = [&](const std::string& name, std::vector<uint64_t> dims, uint32_t type) {
    size_t n = 1;
    for (uint64_t d : dims) n *= d;
    RawTensor r{dims, type, random_bytes(type, n, rng)};
    t.w.add_tensor(name, dims, type, r.bytes);
    t.raw[name] = std::move(r);
  };
  const auto h = static_cast<uint64_t>(s.hidden), q = static_cast<uint64_t>(s.heads * s.head_dim),
             kv = static_cast<uint64_t>(s.kv_heads * s.head_dim), f = static_cast<uint64_t>(s.ffn),
             v = static_cast<uint64_t>(s.vocab);
  add("token_embd.weight", {h, v}, s.weight_type);
  {
    // Llama-3.1 files carry RoPE frequency divisors; they land in config.rope_scaling.freq_divisors.
    std::vector<uint8_t> bytes(static_cast<size_t>(s.head_dim / 2) * 4);
    for (int64_t i = 0; i < s.head_dim / 2; ++i) {
      const float d = 1.0f + 0.25f * static_cast<float>(i);
      std::memcpy(bytes.data() + 4 * i, &d, 4);
    }
    const std::vector<uint64_t> dims{static_cast<uint64_t>(s.head_dim / 2)};
    t.w.add_tensor("rope_freqs.weight", dims, kF32, bytes);
  }
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {h}, kF32);
    add(p + "attn_q.weight", {h, q}, s.weight_type);
    add(p + "attn_k.weight", {h, kv}, s.weight_type);
    add(p + "attn_v.weight", {h, kv}, s.weight_type);
    add(p + "attn_output.weight", {q, h}, s.weight_type);
    add(p + "ffn_norm.weight", {h}, kF32);
    add(p + "ffn_gate.weight", {h, f}, s.weight_type);
    add(p + "ffn_up.weight", {h, f}, s.weight_type);
    add(p + "ffn_down.weight", {f, h}, s.weight_type);
  }
  add("output_norm.weight", {h}, kF32);
  if (!s.tied) add("output.weight", {h, v}, s.weight_type);
  return t;
}

class TempDir {
 public:
  TempDir() : dir_(test::make_temp_dir("gguf")) {}
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string path = dir_ + "/" + name + ".gguf";
    GgufWriter::write_file(path, bytes);
    return path;
  }

 private:
  std::string dir_;
};

// Loads the bytes from a file and returns the Error message; fails the test if nothing (or something else) is thrown.
std::string load_error(const std::vector<uint8_t>& bytes, const std::string& name) {
  TempDir dir;
  const std::string path = dir.write(name, bytes);
  try {
    load_gguf_model(path);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message lacks the path: " << msg;
    return msg;
  }
  ADD_FAILURE() << name << ": loaded without an error";
  return "";
}

size_t find_bytes(const std::vector<uint8_t>& hay, const std::string& needle) {
  for (size_t i = 0; i + needle.size() <= hay.size(); ++i)
    if (std::memcmp(hay.data() + i, needle.data(), needle.size()) == 0) return i;
  ADD_FAILURE() << "'" << needle << "' not found";
  return 0;
}

template <typename T>
void patch(std::vector<uint8_t>& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

// The HF name and GGUF name pairs of a tiny model, with whether the rows are RoPE-permuted.
std::vector<std::tuple<std::string, std::string, int64_t>> name_pairs(const TinySpec& s) {
  std::vector<std::tuple<std::string, std::string, int64_t>> out = {
      {"model.embed_tokens.weight", "token_embd.weight", 0}, {"model.norm.weight", "output_norm.weight", 0}};
  if (!s.tied) out.emplace_back("lm_head.weight", "output.weight", 0);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
    out.emplace_back(hf + "input_layernorm.weight", g + "attn_norm.weight", 0);
    out.emplace_back(hf + "self_attn.q_proj.weight", g + "attn_q.weight", s.heads);
    out.emplace_back(hf + "self_attn.k_proj.weight", g + "attn_k.weight", s.kv_heads);
    out.emplace_back(hf + "self_attn.v_proj.weight", g + "attn_v.weight", 0);
    out.emplace_back(hf + "self_attn.o_proj.weight", g + "attn_output.weight", 0);
    out.emplace_back(hf + "post_attention_layernorm.weight", g + "ffn_norm.weight", 0);
    out.emplace_back(hf + "mlp.gate_proj.weight", g + "ffn_gate.weight", 0);
    out.emplace_back(hf + "mlp.up_proj.weight", g + "ffn_up.weight", 0);
    out.emplace_back(hf + "mlp.down_proj.weight", g + "ffn_down.weight", 0);
  }
  return out;
}

void check_round_trip(const TinySpec& spec, uint64_t alignment) {
  Tiny tiny = make_tiny(spec);
  tiny.w.alignment = alignment;
  if (alignment != 32) tiny.w.add_u32("general.alignment", static_cast<uint32_t>(alignment));
  TempDir dir;
  const std::string path = dir.write("roundtrip", tiny.w.build());
  const Model m = load_gguf_model(path);
  EXPECT_EQ(m.format, "gguf");
  EXPECT_EQ(m.source, path);
  EXPECT_EQ(m.tensors.size(), name_pairs(spec).size()) << "rope_freqs is config, not a weight";
  ASSERT_EQ(static_cast<int64_t>(m.config.rope_scaling.freq_divisors.size()), spec.head_dim / 2);
  for (int64_t i = 0; i < spec.head_dim / 2; ++i)
    EXPECT_EQ(m.config.rope_scaling.freq_divisors[static_cast<size_t>(i)], 1.0 + 0.25 * static_cast<double>(i));
  for (const auto& [hf, g, heads] : name_pairs(spec)) {
    SCOPED_TRACE(hf);
    ASSERT_TRUE(m.has(hf));
    const Tensor& t = m.get(hf);
    const RawTensor& r = tiny.raw.at(g);
    const std::vector<int64_t> shape(r.dims.rbegin(), r.dims.rend());
    EXPECT_EQ(t.shape, shape);
    std::vector<float> want = decode(r);
    if (heads > 0) want = unpermute_rows(want, shape[0], shape[1], spec.head_dim);
    const std::vector<float> got = t.to_f32();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;  // exact
    const DType want_dtype = r.type == kF16 ? DType::F16 : r.type == kBF16 ? DType::BF16 : DType::F32;
    EXPECT_EQ(t.dtype, want_dtype);
    const bool plain = r.type == kF32 || r.type == kF16 || r.type == kBF16;
    if (plain && heads == 0) EXPECT_EQ(std::memcmp(t.data, r.bytes.data(), r.bytes.size()), 0);
    EXPECT_NE(t.owner.get(), nullptr);
  }
}

TEST(GgufLoader, RoundTripF32) { check_round_trip({.weight_type = kF32}, 32); }
TEST(GgufLoader, RoundTripF16) { check_round_trip({.weight_type = kF16, .seed = 11}, 32); }
TEST(GgufLoader, RoundTripBF16) { check_round_trip({.weight_type = kBF16, .seed = 12}, 64); }
TEST(GgufLoader, RoundTripQ8_0) { check_round_trip({.weight_type = kQ8_0, .seed = 13}, 32); }
TEST(GgufLoader, RoundTripQ4_0) { check_round_trip({.weight_type = kQ4_0, .seed = 14}, 32); }
TEST(GgufLoader, RoundTripQ4_1) { check_round_trip({.weight_type = kQ4_1, .seed = 15}, 32); }
TEST(GgufLoader, RoundTripUnalignedF16) { check_round_trip({.weight_type = kF16, .seed = 16}, 1); }
TEST(GgufLoader, RoundTripTiedHeadDimOverride) {
  check_round_trip({.heads = 2, .kv_heads = 1, .head_dim = 48, .weight_type = kQ4_1, .tied = true, .seed = 17}, 32);
}

TEST(GgufLoader, PlainTensorsPointIntoTheMapping) {
  TinySpec spec;
  spec.weight_type = kBF16;
  Tiny tiny = make_tiny(spec);
  TempDir dir;
  const std::string path = dir.write("view", tiny.w.build());
  const auto mapped = MappedFile::open(path);
  const GgufFile f = parse_gguf(mapped, mapped->data(), mapped->size(), path);
  const Model m = gguf_to_model(f, path);
  const uint8_t* lo = mapped->data();
  const uint8_t* hi = lo + mapped->size();
  const Tensor& v = m.get("model.layers.1.self_attn.v_proj.weight");
  EXPECT_TRUE(v.data >= lo && v.data + v.nbytes() <= hi);
  EXPECT_EQ(v.owner.get(), mapped.get());
  const Tensor& q = m.get("model.layers.1.self_attn.q_proj.weight");  // permuted: owned
  EXPECT_FALSE(q.data >= lo && q.data < hi);
  EXPECT_EQ(q.dtype, DType::BF16);
}

TEST(GgufLoader, QkPermutationKnownPattern) {
  // F32 Q/K whose GGUF row r is filled with r: HF row p*(hd/2)+i of head h must hold h*hd + 2i + p.
  TinySpec spec;
  Tiny tiny = make_tiny(spec);
  GgufWriter w;
  add_config(w, spec);
  add_tokenizer(w, spec.vocab);
  const int64_t hd = spec.head_dim;
  for (const auto& [name, r] : tiny.raw) {
    if (name.find("attn_q") == std::string::npos && name.find("attn_k") == std::string::npos) {
      w.add_tensor(name, r.dims, r.type, r.bytes);
      continue;
    }
    std::vector<uint8_t> bytes;
    for (uint64_t row = 0; row < r.dims[1]; ++row)
      for (uint64_t c = 0; c < r.dims[0]; ++c) GgufWriter::put<float>(bytes, static_cast<float>(row));
    w.add_tensor(name, r.dims, kF32, bytes);
  }
  TempDir dir;
  const Model m = load_gguf_model(dir.write("perm", w.build()));
  for (const char* which : {"q_proj", "k_proj"}) {
    const Tensor& t = m.get(std::string("model.layers.0.self_attn.") + which + ".weight");
    const std::vector<float> v = t.to_f32();
    const int64_t rows = t.shape[0], cols = t.shape[1];
    EXPECT_EQ(rows, (which[0] == 'q' ? spec.heads : spec.kv_heads) * hd);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = r / hd, p = (r % hd) / (hd / 2), i = r % (hd / 2);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(v[static_cast<size_t>(r * cols + c)], static_cast<float>(h * hd + 2 * i + p)) << which << " row " << r;
    }
    // Spelled out for head 0 (hd = 16): HF rows 0..7 are GGUF's even rows, rows 8..15 the odd ones.
    EXPECT_EQ(v[static_cast<size_t>(1 * cols)], 2.0f);
    EXPECT_EQ(v[static_cast<size_t>(7 * cols)], 14.0f);
    EXPECT_EQ(v[static_cast<size_t>(8 * cols)], 1.0f);
    EXPECT_EQ(v[static_cast<size_t>(15 * cols)], 15.0f);
    EXPECT_EQ(v[static_cast<size_t>(16 * cols)], 16.0f);
  }
}

TEST(GgufLoader, ConfigMapping) {
  TinySpec spec;
  Tiny tiny = make_tiny(spec);
  TempDir dir;
  const Model m = load_gguf_model(dir.write("config", tiny.w.build()));
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 40);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_EQ(c.rope_theta, 50000.0);
  EXPECT_EQ(c.rms_norm_eps, static_cast<double>(1e-5f));
  EXPECT_TRUE(c.rope_scaling.type.empty());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
}

TEST(GgufLoader, ConfigDefaultsIntegerTypesAndLlama3Rope) {
  // No head_count_kv, freq_base, vocab_size or tokenizer; integer keys in assorted types; llama3 RoPE scaling.
  TinySpec spec;
  spec.kv_heads = spec.heads;
  spec.tokenizer = false;
  spec.tied = true;
  Tiny tiny = make_tiny(spec);
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u64("llama.embedding_length", 64);
  w.add_i32("llama.block_count", 2);
  w.add_u8("llama.feed_forward_length", 96);
  w.add_scalar<int16_t>("llama.attention.head_count", GgufWriter::kI16, 4);
  w.add_scalar<int64_t>("llama.context_length", GgufWriter::kI64, 131072);
  w.add_f64("llama.attention.layer_norm_rms_epsilon", 1e-6);
  w.add_string("llama.rope.scaling.type", "llama3");
  w.add_f32("llama.rope.scaling.factor", 8.0f);
  w.add_f32("llama.rope.scaling.low_freq_factor", 1.0f);
  w.add_f32("llama.rope.scaling.high_freq_factor", 4.0f);
  w.add_u32("llama.rope.scaling.original_context_length", 8192);
  for (const auto& [name, r] : tiny.raw) w.add_tensor(name, r.dims, r.type, r.bytes);
  TempDir dir;
  const Model m = load_gguf_model(dir.write("defaults", w.build()));
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.vocab_size, 40);  // from token_embd's rows
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(m.has("lm_head.weight"));
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(m.tokenizer.has_value());
  EXPECT_EQ(c.bos_token_id, -1);
}

TEST(GgufLoader, TokenizerMetadata) {
  TinySpec spec;
  Tiny tiny = make_tiny(spec);
  tiny.w.version = 2;  // version 2 has the same layout
  TempDir dir;
  const Model m = load_gguf_model(dir.write("tok", tiny.w.build()));
  ASSERT_TRUE(m.tokenizer.has_value());
  const TokenizerData& t = *m.tokenizer;
  EXPECT_EQ(t.model, "gpt2");
  EXPECT_EQ(t.pre, "smollm");
  ASSERT_EQ(t.tokens.size(), 40u);
  EXPECT_EQ(t.tokens[17], "tok17");
  ASSERT_EQ(t.scores.size(), 40u);
  EXPECT_EQ(t.scores[5], -5.0f);
  ASSERT_EQ(t.token_types.size(), 40u);
  EXPECT_EQ(t.token_types[1], 3);
  EXPECT_EQ(t.token_types[2], 1);
  EXPECT_EQ(t.merges, (std::vector<std::string>{"t o", "to k"}));
  EXPECT_EQ(t.bos_id, 0);
  EXPECT_EQ(t.eos_id, 1);
  EXPECT_EQ(t.unk_id, -1);
  EXPECT_EQ(t.pad_id, 1);
  EXPECT_TRUE(t.add_bos);
}

TEST(GgufLoader, TokenizerInconsistentLengthsRejected) {
  TinySpec spec;
  spec.tokenizer = false;
  Tiny tiny = make_tiny(spec);
  GgufWriter w;
  add_config(w, spec);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  w.add_f32_array("tokenizer.ggml.scores", {0.f, 1.f});
  for (const auto& [name, r] : tiny.raw) w.add_tensor(name, r.dims, r.type, r.bytes);
  const std::string msg = load_error(w.build(), "scores");
  EXPECT_NE(msg.find("tokenizer.ggml.scores"), std::string::npos) << msg;
}

// --- Malformed files: each one Error naming the file (load_error checks the path) and the culprit. ---

std::vector<uint8_t> valid_tiny_bytes() {
  TinySpec spec;
  spec.weight_type = kQ8_0;
  return make_tiny(spec).w.build();
}

TEST(GgufMalformed, BadMagic) {
  std::vector<uint8_t> b = valid_tiny_bytes();
  b[0] = 'X';
  EXPECT_NE(load_error(b, "magic").find("magic"), std::string::npos);
}

TEST(GgufMalformed, Version1) {
  std::vector<uint8_t> b = valid_tiny_bytes();
  patch<uint32_t>(b, 4, 1);
  EXPECT_NE(load_error(b, "v1").find("version 1"), std::string::npos);
}

TEST(GgufMalformed, TruncatedEverywhere) {
  const std::vector<uint8_t> b = valid_tiny_bytes();
  // Every proper prefix that ends before the data section fails in the parser (in memory, quickly), and so do
  // prefixes cutting the tensor data (every 7th byte is enough: the data is only bounds-checked) ...
  const size_t data_start = parse_gguf(nullptr, b.data(), b.size(), "mem.gguf").data_offset;
  for (size_t n = 0; n < b.size(); n += n < data_start ? 1 : 7) {
    const std::vector<uint8_t> prefix(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_gguf(nullptr, prefix.data(), prefix.size(), "mem.gguf"), Error) << "prefix " << n;
  }
  // ... and through the file loader with the path, at points in the header, the metadata, the tensor infos
  // and the data.
  for (size_t n : {size_t{3}, size_t{10}, size_t{30}, find_bytes(b, "tok17") + 2, find_bytes(b, "blk.1.ffn_up"),
                   b.size() - 100, b.size() - 1}) {
    const std::vector<uint8_t> prefix(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string msg = load_error(prefix, "trunc" + std::to_string(n));
    EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("outside") != std::string::npos ||
                msg.find("exceeds") != std::string::npos || msg.find("cannot fit") != std::string::npos)
        << msg;
  }
}

TEST(GgufMalformed, HugeCounts) {
  const std::vector<uint8_t> base = valid_tiny_bytes();
  std::vector<uint8_t> b = base;
  patch<uint64_t>(b, 8, uint64_t{1} << 60);  // tensor_count
  EXPECT_NE(load_error(b, "tensor_count").find("tensor_count"), std::string::npos);
  b = base;
  patch<uint64_t>(b, 16, uint64_t{1} << 60);  // kv_count
  EXPECT_NE(load_error(b, "kv_count").find("kv_count"), std::string::npos);
  b = base;
  const size_t name_at = find_bytes(b, "general.name");
  patch<uint64_t>(b, name_at + 12 + 4, uint64_t{1} << 60);  // the value string's length
  EXPECT_NE(load_error(b, "strlen").find("general.name"), std::string::npos);
  b = base;
  const size_t tokens_at = find_bytes(b, "tokenizer.ggml.tokens");
  patch<uint64_t>(b, tokens_at + 21 + 4 + 4, uint64_t{1} << 60);  // the array's count
  EXPECT_NE(load_error(b, "arraycount").find("tokenizer.ggml.tokens"), std::string::npos);
}

TEST(GgufMalformed, UnknownValueType) {
  std::vector<uint8_t> b = valid_tiny_bytes();
  patch<uint32_t>(b, find_bytes(b, "general.name") + 12, 13);
  const std::string msg = load_error(b, "valuetype");
  EXPECT_NE(msg.find("general.name"), std::string::npos) << msg;
  EXPECT_NE(msg.find("type 13"), std::string::npos) << msg;
}

TEST(GgufMalformed, TensorInfoProblems) {
  TinySpec spec;
  auto with_extra = [&](const std::string& name, std::vector<uint64_t> dims, uint32_t type, size_t nbytes,
                        int64_t offset = -1) {
    Tiny t = make_tiny(spec);
    t.w.add_tensor(name, dims, type, std::vector<uint8_t>(nbytes, 1), offset);
    return t.w.build();
  };
  std::string msg = load_error(with_extra("extra5", {2, 2, 2, 2, 2}, kF32, 128), "ndims5");
  EXPECT_NE(msg.find("'extra5' has 5 dims"), std::string::npos) << msg;
  msg = load_error(with_extra("extra0", {}, kF32, 4), "ndims0");
  EXPECT_NE(msg.find("'extra0' has 0 dims"), std::string::npos) << msg;
  msg = load_error(with_extra("extra_q4k", {256, 1}, kQ4_K, 144), "q4k");
  EXPECT_NE(msg.find("'extra_q4k'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("12 (Q4_K)"), std::string::npos) << msg;
  msg = load_error(with_extra("extra_far", {8}, kF32, 32, int64_t{1} << 40), "offset");
  EXPECT_NE(msg.find("'extra_far'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside"), std::string::npos) << msg;
  msg = load_error(with_extra("extra_misaligned", {8}, kF32, 32, 4), "misaligned");
  EXPECT_NE(msg.find("alignment"), std::string::npos) << msg;
  msg = load_error(with_extra("extra_overflow", {uint64_t{1} << 32, uint64_t{1} << 32}, kF32, 4), "overflow");
  EXPECT_NE(msg.find("overflow"), std::string::npos) << msg;
  msg = load_error(with_extra("extra_q8", {48, 1}, kQ8_0, 34), "ne0");
  EXPECT_NE(msg.find("multiple of its block size 32"), std::string::npos) << msg;
  msg = load_error(with_extra("token_embd.weight", {64, 40}, kF32, 64 * 40 * 4), "duplicate");
  EXPECT_NE(msg.find("'token_embd.weight' appears twice"), std::string::npos) << msg;
}

TEST(GgufMalformed, TensorsThatDoNotFitTheModel) {
  TinySpec spec;
  Tiny t = make_tiny(spec);
  t.w.add_tensor("blk.5.attn_v.weight", {64, 32}, kF32, std::vector<uint8_t>(64 * 32 * 4, 0));
  std::string msg = load_error(t.w.build(), "layer5");
  EXPECT_NE(msg.find("'blk.5.attn_v.weight' belongs to layer 5"), std::string::npos) << msg;
  Tiny b = make_tiny(spec);
  b.w.add_tensor("blk.0.attn_q.bias", {64}, kF32, std::vector<uint8_t>(64 * 4, 0));
  msg = load_error(b.w.build(), "bias");
  EXPECT_NE(msg.find("'blk.0.attn_q.bias' is a bias"), std::string::npos) << msg;
}

TEST(GgufMalformed, BadAlignment) {
  Tiny t = make_tiny({});
  t.w.add_u32("general.alignment", 48);
  const std::string msg = load_error(t.w.build(), "align48");
  EXPECT_NE(msg.find("general.alignment"), std::string::npos) << msg;
}

TEST(GgufMalformed, MissingKeyAndWrongArchitecture) {
  TinySpec spec;
  Tiny tiny = make_tiny(spec);
  auto rebuild = [&](const std::string& skip, const std::string& arch) {
    GgufWriter w;
    // Rebuild the config by hand so one key can be left out or changed.
    w.add_string("general.architecture", arch);
    if (skip != "llama.block_count") w.add_u32("llama.block_count", 2);
    w.add_u32("llama.embedding_length", 64);
    w.add_u32("llama.feed_forward_length", 96);
    w.add_u32("llama.attention.head_count", 4);
    w.add_u32("llama.attention.head_count_kv", 2);
    w.add_u32("llama.context_length", 256);
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    for (const auto& [name, r] : tiny.raw) w.add_tensor(name, r.dims, r.type, r.bytes);
    return w.build();
  };
  std::string msg = load_error(rebuild("llama.block_count", "llama"), "noblocks");
  EXPECT_NE(msg.find("missing GGUF key 'llama.block_count'"), std::string::npos) << msg;
  msg = load_error(rebuild("", "gpt2"), "gpt2");
  EXPECT_NE(msg.find("'gpt2'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("general.architecture"), std::string::npos) << msg;
}

TEST(GgufMalformed, WrongKeyTypeAndWrongShape) {
  TinySpec spec;
  Tiny tiny = make_tiny(spec);
  tiny.w.add_string("llama.attention.key_length", "sixteen");
  std::string msg = load_error(tiny.w.build(), "keytype");
  EXPECT_NE(msg.find("llama.attention.key_length"), std::string::npos) << msg;

  // A K projection with the wrong number of rows for the permutation.
  GgufWriter w;
  add_config(w, spec);
  for (const auto& [name, r] : tiny.raw) {
    if (name == "blk.1.attn_k.weight") {
      w.add_tensor(name, {64, 24}, kF32, std::vector<uint8_t>(64 * 24 * 4, 0));
    } else {
      w.add_tensor(name, r.dims, r.type, r.bytes);
    }
  }
  msg = load_error(w.build(), "kshape");
  EXPECT_NE(msg.find("blk.1.attn_k.weight"), std::string::npos) << msg;
}

// --- The real SmolLM2-135M-Instruct Q4_1 file. ---

TEST(GgufSmolLM2, LoadsWithConfigTokenizerAndSaneWeights) {
  const std::string path = test::smollm2_gguf_path();
  FT_REQUIRE_FILE(path);
  const auto start = std::chrono::steady_clock::now();
  const Model m = load_gguf_model(path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "SmolLM2 GGUF load: " << seconds << " s\n";
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(m.has("lm_head.weight"));
  ASSERT_TRUE(m.tokenizer.has_value());
  const TokenizerData& t = *m.tokenizer;
  std::cout << "tokenizer.ggml.pre = '" << t.pre << "', bos " << t.bos_id << ", eos " << t.eos_id << ", merges "
            << t.merges.size() << "\n";
  EXPECT_EQ(t.model, "gpt2");
  EXPECT_EQ(t.tokens.size(), 49152u);
  EXPECT_GT(t.merges.size(), 40000u);
  EXPECT_GE(t.eos_id, 0);

  // Every decoded weight is finite; RMS values are those of a trained model (norm gains near O(1), projections
  // small but not zero).
  for (const auto& [name, tensor] : m.tensors) {
    SCOPED_TRACE(name);
    const std::vector<float> v = tensor.to_f32();
    double sq = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x));
      sq += static_cast<double>(x) * x;
    }
    const double rms = std::sqrt(sq / static_cast<double>(v.size()));
    EXPECT_GT(rms, 1e-3);
    EXPECT_LT(rms, 10.0);
  }
}

}  // namespace
}  // namespace futransformer
