// llama2.c legacy checkpoint loader and tokenizer.bin: the shared stories260K files, synthetic checkpoints with
// known values (Q/K RoPE permutation), malformed files, and the tokenizer against a plain transcription of
// run.c's encode() on random text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/io/llama2c.h"
#include "futransformer/model.h"
#include "futransformer/tokenizer.h"
#include "test_paths.h"

namespace futransformer {
namespace {

// RoPE on fp32 values of magnitude ~1 with a handful of products per output: a few ulps of float.
constexpr float kRopeTolerance = 1e-5f;

std::string stories_model() { return test::shared_path("models/stories260K/stories260K.bin"); }
std::string stories_tokenizer() { return test::shared_path("models/stories260K/tok512.bin"); }

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

template <typename T>
void append(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// Runs `fn`, which must throw an Error mentioning `path` and `needle`.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& path, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// A synthetic legacy checkpoint. Every float is distinct and random, so a tensor read from the wrong offset or
// a wrong row permutation cannot match by accident.
struct Synthetic {
  int32_t dim = 8, hidden = 6, layers = 2, heads = 2, kv_heads = 1, vocab = 5, seq_len = 4;
  bool shared = false;

  int32_t head_size() const { return dim / heads; }
  int32_t kv_dim() const { return kv_heads * head_size(); }
  // Element counts of the arrays in file order.
  std::vector<std::pair<std::string, size_t>> sections() const {
    const size_t D = dim, F = hidden, L = layers, V = vocab, KV = kv_dim(), S = seq_len, hs = head_size();
    std::vector<std::pair<std::string, size_t>> s = {
        {"embed", V * D}, {"rms_att", L * D}, {"wq", L * D * D},  {"wk", L * KV * D},     {"wv", L * KV * D},
        {"wo", L * D * D}, {"rms_ffn", L * D}, {"w1", L * F * D}, {"w2", L * D * F},      {"w3", L * F * D},
        {"rms_final", D},  {"freq_real", S * hs / 2},             {"freq_imag", S * hs / 2}};
    if (!shared) s.emplace_back("wcls", V * D);
    return s;
  }
  // The header followed by the arrays; `values[name]` gets each array's contents.
  std::vector<uint8_t> build(std::map<std::string, std::vector<float>>& values, uint32_t seed = 7) const {
    std::vector<uint8_t> out;
    for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq_len}) append(out, v);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (const auto& [name, n] : sections()) {
      std::vector<float>& v = values[name];
      v.resize(n);
      for (float& x : v) {
        x = dist(rng);
        append(out, x);
      }
    }
    return out;
  }
};

// Row `row` of a [rows, cols] matrix that starts at element `offset` of `v`.
std::vector<float> row_of(const std::vector<float>& v, size_t offset, size_t row, size_t cols) {
  return std::vector<float>(v.begin() + static_cast<long>(offset + row * cols),
                            v.begin() + static_cast<long>(offset + (row + 1) * cols));
}
std::vector<float> row_of(const Tensor& t, size_t row) {
  const std::vector<float> all = t.to_f32();
  const size_t cols = static_cast<size_t>(t.shape[1]);
  return row_of(all, 0, row, cols);
}

Model parse(const std::vector<uint8_t>& bytes, const std::string& source = "synthetic.bin") {
  auto owner = std::make_shared<std::vector<uint8_t>>(bytes);
  return parse_llama2c(owner, owner->data(), owner->size(), source);
}

TEST(Llama2cModel, SyntheticTensorsLandAtTheirOffsets) {
  Synthetic s;
  std::map<std::string, std::vector<float>> v;
  const Model m = parse(s.build(v));
  EXPECT_EQ(m.format, "llama2c");
  EXPECT_FALSE(m.config.tie_word_embeddings);
  EXPECT_EQ(m.get("model.embed_tokens.weight").to_f32(), v["embed"]);
  EXPECT_EQ(m.get("lm_head.weight").to_f32(), v["wcls"]);
  EXPECT_EQ(m.get("model.norm.weight").to_f32(), v["rms_final"]);
  const size_t D = s.dim, F = s.hidden, KV = s.kv_dim();
  for (size_t l = 0; l < static_cast<size_t>(s.layers); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto slice = [&](const std::string& name, size_t n) {
      const auto first = v[name].begin() + static_cast<long>(l * n);
      return std::vector<float>(first, first + static_cast<long>(n));
    };
    EXPECT_EQ(m.get(p + "input_layernorm.weight").to_f32(), slice("rms_att", D));
    EXPECT_EQ(m.get(p + "post_attention_layernorm.weight").to_f32(), slice("rms_ffn", D));
    EXPECT_EQ(m.get(p + "self_attn.v_proj.weight").to_f32(), slice("wv", KV * D));
    EXPECT_EQ(m.get(p + "self_attn.o_proj.weight").to_f32(), slice("wo", D * D));
    EXPECT_EQ(m.get(p + "mlp.gate_proj.weight").to_f32(), slice("w1", F * D));
    EXPECT_EQ(m.get(p + "mlp.down_proj.weight").to_f32(), slice("w2", D * F));
    EXPECT_EQ(m.get(p + "mlp.up_proj.weight").to_f32(), slice("w3", F * D));
  }
}

TEST(Llama2cModel, QKRowsPermutedToRotateHalf) {
  Synthetic s;  // head_size 4: within a head, HF rows (0, 1, 2, 3) are llama2.c rows (0, 2, 1, 3)
  std::map<std::string, std::vector<float>> v;
  const Model m = parse(s.build(v));
  const std::vector<size_t> q_source_rows = {0, 2, 1, 3, 4, 6, 5, 7};  // 2 heads
  const std::vector<size_t> k_source_rows = {0, 2, 1, 3};             // 1 KV head
  const size_t D = s.dim, KV = s.kv_dim();
  for (size_t l = 0; l < static_cast<size_t>(s.layers); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const Tensor& q = m.get(p + "q_proj.weight", {s.dim, s.dim});
    const Tensor& k = m.get(p + "k_proj.weight", {s.kv_dim(), s.dim});
    for (size_t r = 0; r < q_source_rows.size(); ++r)
      EXPECT_EQ(row_of(q, r), row_of(v["wq"], l * D * D, q_source_rows[r], D)) << "layer " << l << " q row " << r;
    for (size_t r = 0; r < k_source_rows.size(); ++r)
      EXPECT_EQ(row_of(k, r), row_of(v["wk"], l * KV * D, k_source_rows[r], D)) << "layer " << l << " k row " << r;
  }
}

// The point of the permutation: llama2.c's interleaved RoPE on its rows and HF's rotate-half RoPE on ours give
// the same attention scores q.k for every pair of positions.
TEST(Llama2cModel, PermutedRopeGivesSameAttentionScores) {
  Synthetic s;
  s.dim = 16, s.heads = 2, s.kv_heads = 2;  // head_size 8: four frequencies per head
  std::map<std::string, std::vector<float>> v;
  const Model m = parse(s.build(v, 11));
  const int hs = s.head_size(), D = s.dim;
  auto matvec = [&](const std::vector<float>& w, const std::vector<float>& x) {
    std::vector<float> y(w.size() / x.size());
    for (size_t r = 0; r < y.size(); ++r)
      for (size_t c = 0; c < x.size(); ++c) y[r] += w[r * x.size() + c] * x[c];
    return y;
  };
  auto freq = [&](int i) { return std::pow(10000.0, -2.0 * i / hs); };
  auto rope_interleaved = [&](std::vector<float> y, int pos) {
    for (size_t h = 0; h < y.size() / hs; ++h)
      for (int i = 0; i < hs / 2; ++i) {
        float& a = y[h * hs + 2 * i];
        float& b = y[h * hs + 2 * i + 1];
        const double c = std::cos(pos * freq(i)), sn = std::sin(pos * freq(i));
        const float a0 = a, b0 = b;
        a = static_cast<float>(a0 * c - b0 * sn);
        b = static_cast<float>(a0 * sn + b0 * c);
      }
    return y;
  };
  auto rope_half = [&](std::vector<float> y, int pos) {
    for (size_t h = 0; h < y.size() / hs; ++h)
      for (int i = 0; i < hs / 2; ++i) {
        float& a = y[h * hs + i];
        float& b = y[h * hs + i + hs / 2];
        const double c = std::cos(pos * freq(i)), sn = std::sin(pos * freq(i));
        const float a0 = a, b0 = b;
        a = static_cast<float>(a0 * c - b0 * sn);
        b = static_cast<float>(a0 * sn + b0 * c);
      }
    return y;
  };
  auto head_dot = [&](const std::vector<float>& a, const std::vector<float>& b, int h) {
    float d = 0;
    for (int j = 0; j < hs; ++j) d += a[h * hs + j] * b[h * hs + j];
    return d;
  };
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(D)), z(static_cast<size_t>(D));
  for (float& e : x) e = dist(rng);
  for (float& e : z) e = dist(rng);
  const std::vector<float> wq0(v["wq"].begin(), v["wq"].begin() + D * D), wk0(v["wk"].begin(), v["wk"].begin() + D * D);
  const std::vector<float> hq = m.get("model.layers.0.self_attn.q_proj.weight").to_f32();
  const std::vector<float> hk = m.get("model.layers.0.self_attn.k_proj.weight").to_f32();
  for (int qpos : {0, 1, 5}) {
    for (int kpos : {0, 3}) {
      const auto lq = rope_interleaved(matvec(wq0, x), qpos), lk = rope_interleaved(matvec(wk0, z), kpos);
      const auto fq = rope_half(matvec(hq, x), qpos), fk = rope_half(matvec(hk, z), kpos);
      for (int h = 0; h < s.heads; ++h)
        EXPECT_NEAR(head_dot(lq, lk, h), head_dot(fq, fk, h), kRopeTolerance) << qpos << " " << kpos << " head " << h;
    }
  }
}

TEST(Llama2cModel, SharedClassifierTiesEmbeddings) {
  Synthetic s;
  s.shared = true;
  std::map<std::string, std::vector<float>> v;
  const Model m = parse(s.build(v));
  EXPECT_TRUE(m.config.tie_word_embeddings);
  EXPECT_FALSE(m.has("lm_head.weight"));
}

TEST(Llama2cModel, Stories260KConfig) {
  FT_REQUIRE_FILE(stories_model());
  const Model m = load_llama2c_model(stories_model());
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(m.has("lm_head.weight"));
  EXPECT_EQ(m.parameter_count(), 260032);
  EXPECT_EQ(m.tokenizer_path, test::shared_path("models/stories260K/tok512.bin"));
  // The embedding is a view of the file right after the 28-byte header.
  std::ifstream f(stories_model(), std::ios::binary);
  std::vector<char> head(28 + 64 * 4);
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  const std::vector<float> emb = m.get("model.embed_tokens.weight").to_f32();
  EXPECT_EQ(std::memcmp(emb.data(), head.data() + 28, 64 * 4), 0);
}

TEST(Llama2cModel, LoadModelDispatchesOnBinSuffix) {
  FT_REQUIRE_FILE(stories_model());
  EXPECT_EQ(load_model(stories_model()).format, "llama2c");
}

// A directory holding single-file checkpoints but no config.json (e.g. ../shared/models/stories260K) gets an error that
// names the files to pass instead, not only the missing config.json.
TEST(Llama2cModel, DirectoryOfSingleFileModelsNamesThem) {
  const std::string dir = test::make_temp_dir("model-dir");
  expect_error([&] { load_model(dir); }, dir, "config.json");  // nothing in it: the Hugging Face loader's message
  write_file(dir + "/tok512.bin", std::vector<uint8_t>(16, 1));
  write_file(dir + "/notes.txt", std::vector<uint8_t>(16, 1));
  expect_error([&] { load_model(dir); }, dir, "it holds tok512.bin: pass the model file itself as --model");
  write_file(dir + "/stories260K.bin", std::vector<uint8_t>(16, 1));
  write_file(dir + "/a.gguf", std::vector<uint8_t>(16, 1));
  expect_error([&] { load_model(dir); }, dir, "it holds a.gguf, stories260K.bin, tok512.bin: pass the model file");
}

// ---------------------------------------------------------------------------------------------------------------
// Malformed checkpoints, each written to disk so the Error must name the file.
class Llama2cMalformed : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_temp_dir("llama2c"); }
  void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& needle) {
    const std::string path = dir_ + "/bad" + std::to_string(counter_++) + ".bin";
    write_file(path, bytes);
    expect_error([&] { load_llama2c_model(path); }, path, needle);
  }
  std::vector<uint8_t> header(std::vector<int32_t> fields) {
    std::vector<uint8_t> out;
    for (int32_t f : fields) append(out, f);
    out.resize(out.size() + 4096);  // some weights, so header checks rather than the size check must fire
    return out;
  }
  std::string dir_;
  int counter_ = 0;
};

TEST_F(Llama2cMalformed, SizeMismatches) {
  std::map<std::string, std::vector<float>> v;
  const std::vector<uint8_t> good = Synthetic().build(v);
  std::vector<uint8_t> bytes = good;
  bytes.resize(bytes.size() - 4);
  expect_rejected(bytes, "truncated: expected " + std::to_string(good.size()) + " bytes");
  bytes = good;
  bytes.push_back(0);
  expect_rejected(bytes, "trailing");
  expect_rejected({}, "truncated");
  expect_rejected(std::vector<uint8_t>(good.begin(), good.begin() + 27), "truncated");
}

TEST_F(Llama2cMalformed, BadHeaderFields) {
  expect_rejected(header({0, 6, 2, 2, 1, 5, 4}), "'dim' = 0");
  expect_rejected(header({8, 6, -2, 2, 1, 5, 4}), "'n_layers' = -2");
  expect_rejected(header({8, 6, 2, 3, 1, 5, 4}), "not divisible by n_heads");
  expect_rejected(header({8, 6, 2, 2, 3, 5, 4}), "not a multiple of n_kv_heads");
  expect_rejected(header({6, 6, 2, 2, 1, 5, 4}), "is odd");
  expect_rejected(header({8, 6, 2, 2, 1, 0, 4}), "'vocab_size' = 0");
  expect_rejected(header({8, 6, 2, 2, 1, INT32_MIN, 4}), "'vocab_size'");
  expect_rejected(header({8, 6, 2, 2, 1, 5, INT32_MAX}), "'seq_len'");
  expect_rejected(header({0x616b3432, 2, 0, 0, 0, 0, 0}), "ak42");
}

TEST_F(Llama2cMalformed, SizeComputationOverflow) {
  const int32_t big = 1 << 20;
  // Every field at its limit (head size 2): each array fits 64 bits, the file size in bytes does not.
  expect_rejected(header({big, big, big, big / 2, big / 2, -big, big}), "overflow");
  // Fewer layers: the size fits and the file is reported as truncated, not wrapped around.
  expect_rejected(header({big, big, 1024, big / 2, big / 2, big, big}), "truncated: expected");
}

// ---------------------------------------------------------------------------------------------------------------
// Tokenizer.

// run.c's encode() written out naively (rescans every pair after each merge, linear lookup of the first
// matching piece), as the reference for the tokenizer on random text.
std::vector<int32_t> reference_encode(const std::vector<std::string>& pieces, const std::vector<float>& scores,
                                      const std::string& text) {
  auto find = [&](const std::string& s) {
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i] == s) return static_cast<int32_t>(i);
    return -1;
  };
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  ids.push_back(find(" "));
  std::string cp;
  for (size_t c = 0; c < text.size(); ++c) {
    if ((static_cast<unsigned char>(text[c]) & 0xC0) != 0x80) cp.clear();
    cp += text[c];
    if (c + 1 < text.size() && (static_cast<unsigned char>(text[c + 1]) & 0xC0) == 0x80 && cp.size() < 4) continue;
    const int32_t id = find(cp);
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (char ch : cp) ids.push_back(static_cast<unsigned char>(ch) + 3);
    }
    cp.clear();
  }
  while (true) {
    float best = -1e10f;
    int best_idx = -1, best_id = -1;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const int32_t id = find(pieces[static_cast<size_t>(ids[i])] + pieces[static_cast<size_t>(ids[i + 1])]);
      if (id >= 0 && scores[static_cast<size_t>(id)] > best) {
        best = scores[static_cast<size_t>(id)];
        best_idx = static_cast<int>(i);
        best_id = id;
      }
    }
    if (best_idx < 0) break;
    ids[static_cast<size_t>(best_idx)] = best_id;
    ids.erase(ids.begin() + best_idx + 1);
  }
  return ids;
}

void read_vocab(const std::string& path, std::vector<std::string>& pieces, std::vector<float>& scores) {
  std::ifstream f(path, std::ios::binary);
  int32_t max_len = 0;
  f.read(reinterpret_cast<char*>(&max_len), 4);
  float score;
  int32_t len;
  while (f.read(reinterpret_cast<char*>(&score), 4) && f.read(reinterpret_cast<char*>(&len), 4)) {
    std::string s(static_cast<size_t>(len), '\0');
    f.read(s.data(), len);
    pieces.push_back(s);
    scores.push_back(score);
  }
}

TEST(Llama2cTokenizer, OnceUponATime) {
  FT_REQUIRE_FILE(stories_tokenizer());
  const auto tok = load_llama2c_tokenizer(stories_tokenizer(), 512);
  // From the dummy prefix and one token per character, run.c merges (highest score first):
  // " "+"t" 259, " "+"a" 261, "i"+"m" 288, "o"+"n" 289, " "+"u" 318, " "+"O" 319, " O"+"n" 321, "c"+"e" 331,
  // " u"+"p" 350, "im"+"e" 369, " t"+"ime" 378, " On"+"ce" 403, " up"+"on" 407.
  EXPECT_EQ(tok->encode("Once upon a time"), (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_EQ(tok->piece(1, 403), "Once");   // after BOS the leading space goes
  EXPECT_EQ(tok->piece(407, 403), " Once");
  const std::vector<int32_t> with_bos = {1, 403, 407, 261, 378};
  EXPECT_EQ(tok->decode(with_bos), "Once upon a time");
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(Llama2cTokenizer, ByteFallbackRoundTrip) {
  FT_REQUIRE_FILE(stories_tokenizer());
  const auto tok = load_llama2c_tokenizer(stories_tokenizer(), 512);
  // '{', '}' and '#' have no piece in tok512: they become <0x7B>, <0x7D>, <0x23> (byte + 3).
  const std::vector<int32_t> ids = tok->encode("a{b}#");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0x7B + 3), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0x7D + 3), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0x23 + 3), 1);
  EXPECT_EQ(tok->piece(5, 0x7B + 3), "{");
  for (const std::string text : {"Hello, world! Zebra {x} #42 ~", "Tabs\tand\nnewlines\r\n", "`quoted` [x] ^_^ |\\|",
                                  "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80"}) {
    std::vector<int32_t> seq = {1};
    for (int32_t id : tok->encode(text)) seq.push_back(id);
    EXPECT_EQ(tok->decode(seq), text);
    EXPECT_EQ(tok->decode(std::vector<int32_t>(seq.begin() + 1, seq.end())), " " + text);  // no BOS: space stays
  }
}

TEST(Llama2cTokenizer, SpecialTokensDecode) {
  FT_REQUIRE_FILE(stories_tokenizer());
  const auto tok = load_llama2c_tokenizer(stories_tokenizer(), 512);
  const std::vector<int32_t> ids = {1, 403, 2};
  EXPECT_EQ(tok->decode(ids), "Once");
  EXPECT_EQ(tok->decode(ids, true), "\n<s>\nOnce\n</s>\n");
  EXPECT_TRUE(tok->is_end_of_generation(1));
  EXPECT_FALSE(tok->is_end_of_generation(403));
  const std::vector<int32_t> bad = {1, 512};
  expect_error([&] { tok->decode(bad); }, stories_tokenizer(), "token id 512");
  expect_error([&] { tok->piece(1, -1); }, stories_tokenizer(), "token id -1");
}

TEST(Llama2cTokenizer, MatchesRunCEncodeOnRandomText) {
  FT_REQUIRE_FILE(stories_tokenizer());
  const auto tok = load_llama2c_tokenizer(stories_tokenizer(), 512);
  std::vector<std::string> pieces;
  std::vector<float> scores;
  read_vocab(stories_tokenizer(), pieces, scores);
  ASSERT_EQ(pieces.size(), 512u);
  // Letters and spaces (many merges), punctuation, multi-byte UTF-8 and raw bytes (stray continuation bytes,
  // lone lead bytes, over-long continuation runs).
  const std::vector<std::string> alphabet = {"e", "t", "a", "o", " ", " ", "h", "n", "s", "i", "d", "l", ".", ",",
                                             "!", "{", "\n", "\xC3\xA9", "\xE2\x82\xAC", "\x80", "\xC3", "\xFF",
                                             "\xF0\x9F\x98\x80\x80\x80", "T", "w"};
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(tok->encode(text), reference_encode(pieces, scores, text)) << "text: " << text;
  }
}

// With duplicate pieces, run.c returns whichever id its bsearch lands on in the qsort-ed vocabulary; the
// tokenizer must pick the same one, checked against this C library's own qsort and bsearch.
struct TokenIndex {
  const char* str;
  int id;
};
int compare_tokens(const void* a, const void* b) {
  return std::strcmp(static_cast<const TokenIndex*>(a)->str, static_cast<const TokenIndex*>(b)->str);
}

std::vector<uint8_t> tokenizer_file(const std::vector<std::string>& pieces, const std::vector<float>& scores,
                                    int32_t max_len) {
  std::vector<uint8_t> out;
  append(out, max_len);
  for (size_t i = 0; i < pieces.size(); ++i) {
    append(out, scores[i]);
    append(out, static_cast<int32_t>(pieces[i].size()));
    out.insert(out.end(), pieces[i].begin(), pieces[i].end());
  }
  return out;
}

TEST(Llama2cTokenizer, DuplicatePiecesResolveLikeRunC) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", " "};
  const std::vector<std::string> dups = {"a", "b", "c", "d", "e"};
  std::mt19937 rng(5);
  for (int copy = 0; copy < 5; ++copy)
    for (size_t d = 0; d <= static_cast<size_t>(copy) && d < dups.size(); ++d) pieces.push_back(dups[d]);
  std::shuffle(pieces.begin() + 4, pieces.end(), rng);
  const std::vector<float> scores(pieces.size(), 0.0f);
  const std::vector<uint8_t> file = tokenizer_file(pieces, scores, 5);
  const auto tok = parse_llama2c_tokenizer(file.data(), file.size(), static_cast<int32_t>(pieces.size()), "dups");
  std::vector<TokenIndex> sorted;
  for (size_t i = 0; i < pieces.size(); ++i) sorted.push_back({pieces[i].c_str(), static_cast<int>(i)});
  std::qsort(sorted.data(), sorted.size(), sizeof(TokenIndex), compare_tokens);
  for (const std::string& d : dups) {
    TokenIndex key{d.c_str(), -1};
    const auto* hit = static_cast<const TokenIndex*>(
        std::bsearch(&key, sorted.data(), sorted.size(), sizeof(TokenIndex), compare_tokens));
    ASSERT_NE(hit, nullptr);
    const std::vector<int32_t> ids = tok->encode(d);  // dummy prefix " ", then the piece; " a" is not a piece
    ASSERT_EQ(ids.size(), 2u) << d;
    EXPECT_EQ(ids[1], hit->id) << "piece '" << d << "'";
  }
}

TEST(Llama2cTokenizer, MalformedFiles) {
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", " ", "a", "ab"};
  const std::vector<float> scores = {0, 0, 0, -1, -2, -3};
  const std::vector<uint8_t> good = tokenizer_file(pieces, scores, 5);
  const std::string dir = test::make_temp_dir("llama2c-tok");
  int counter = 0;
  auto rejected = [&](const std::vector<uint8_t>& bytes, int32_t vocab, const std::string& needle) {
    const std::string path = dir + "/tok" + std::to_string(counter++) + ".bin";
    write_file(path, bytes);
    expect_error([&] { load_llama2c_tokenizer(path, vocab); }, path, needle);
  };
  EXPECT_EQ(parse_llama2c_tokenizer(good.data(), good.size(), 6, "good")->vocab_size(), 6);
  rejected({}, 6, "truncated");
  rejected(std::vector<uint8_t>(good.begin(), good.end() - 1), 6, "truncated: token 5");
  rejected(good, 7, "truncated: token 6");
  rejected(good, 5, "bytes follow");
  rejected(good, 2, "at least 3 tokens");
  auto with_max_len = [&](int32_t m) {
    std::vector<uint8_t> b = good;
    std::memcpy(b.data(), &m, 4);
    return b;
  };
  rejected(with_max_len(0), 6, "max_token_length = 0");
  rejected(with_max_len(-3), 6, "max_token_length = -3");
  rejected(with_max_len(INT32_MAX), 6, "max_token_length");
  rejected(tokenizer_file(pieces, scores, 1), 6, "token 0 has length 5");  // "<unk>" longer than declared
  for (int32_t len : {0, -1, INT32_MIN, INT32_MAX}) {
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + 8, &len, 4);  // token 0's length
    rejected(b, 6, "token 0 has length");
  }
  std::vector<std::string> with_nul = pieces;
  with_nul[4] = std::string("x\0y", 3);
  rejected(tokenizer_file(with_nul, scores, 5), 6, "NUL");
}

TEST(Llama2cTokenizer, ByteFallbackOutsideSmallVocabulary) {
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", " ", "a"};
  const std::vector<uint8_t> file = tokenizer_file(pieces, {0, 0, 0, 0, 0}, 5);
  const auto tok = parse_llama2c_tokenizer(file.data(), file.size(), 5, "small.bin");
  EXPECT_EQ(tok->encode("aa"), (std::vector<int32_t>{3, 4, 4}));
  expect_error([&] { tok->encode("z"); }, "small.bin", "byte-fallback id 125");
}

}  // namespace
}  // namespace futransformer
