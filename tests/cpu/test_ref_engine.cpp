// The reference engine on tiny random models built in memory, against a naive fp64 forward written here from the
// Llama definition (full recompute, no cache), and against itself across prefill/decode/batching.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/reference_engine.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {

struct TinySpec {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, head_dim, inter, vocab;
  bool tied;
  bool llama3;  // llama3 RoPE scaling with a short original context so every band of the formula is used
};

void PrintTo(const TinySpec& s, std::ostream* os) { *os << s.name; }

const TinySpec kSpecs[] = {
    {"untied", 48, 3, 6, 2, 8, 80, 97, false, false},
    {"tied", 48, 3, 6, 2, 8, 80, 97, true, false},
    // head_dim·heads (64) != hidden: the engine must not assume they match. GQA ratio 4.
    {"wide_heads_llama3", 48, 2, 4, 1, 16, 72, 97, false, true},
    {"mha", 40, 2, 4, 4, 10, 64, 53, true, false},
};

// The shared tiny Llama (same weights for the same seed), with this spec's name, context and RoPE scaling.
Model make_tiny_model(const TinySpec& s, uint32_t seed) {
  test::TinyLlama t;
  t.hidden = s.hidden;
  t.layers = s.layers;
  t.heads = s.heads;
  t.kv_heads = s.kv_heads;
  t.head_dim = s.head_dim;
  t.inter = s.inter;
  t.vocab = s.vocab;
  t.tied = s.tied;
  Model m = test::make_tiny_llama(t, seed);
  m.source = std::string("synthetic:") + s.name;
  ModelConfig& c = m.config;
  c.max_position_embeddings = 64;
  if (s.llama3) {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 4;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_position_embeddings = 64;
  }
  m.validate();
  return m;
}

using test::random_token_ids;

// --- The naive fp64 forward: every position recomputed from scratch, no cache. ---

using Vec = std::vector<double>;

Vec weights(const Model& m, const std::string& name) {
  const auto f = m.get(name).to_f32();
  return Vec(f.begin(), f.end());
}

Vec linear64(const Vec& w, const Vec& x, int64_t out, int64_t in) {
  Vec y(out, 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) y[o] += w[o * in + i] * x[i];
  return y;
}

Vec rmsnorm64(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

double inv_freq64(const ModelConfig& c, int64_t i) {
  double f = std::pow(c.rope_theta, -2.0 * double(i) / double(c.head_dim));
  if (c.rope_scaling.type == "llama3") {
    const RopeScaling& s = c.rope_scaling;
    const double orig = double(s.original_max_position_embeddings);
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > orig / s.low_freq_factor) {
      f /= s.factor;
    } else if (wavelen >= orig / s.high_freq_factor) {
      const double smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1 - smooth) * f / s.factor + smooth * f;
    }
  }
  return f;
}

// Rotates each head's (i, i + d/2) pairs by pos·inv_freq[i].
void rope64(Vec& x, int64_t heads, const ModelConfig& c, int64_t pos) {
  const int64_t d = c.head_dim;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = double(pos) * inv_freq64(c, i);
      double& x0 = x[h * d + i];
      double& x1 = x[h * d + i + d / 2];
      const double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x1 * std::cos(a) + x0 * std::sin(a);
      x0 = r0;
      x1 = r1;
    }
  }
}

// Logits of every position, [tokens.size()][vocab].
std::vector<Vec> naive_forward(const Model& m, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = m.config;
  const int64_t h = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t n = int64_t(tokens.size());
  const Vec emb = weights(m, "model.embed_tokens.weight");
  std::vector<Vec> x(n);
  for (int64_t t = 0; t < n; ++t) x[t] = Vec(emb.begin() + tokens[t] * h, emb.begin() + (tokens[t] + 1) * h);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Vec wq = weights(m, p + "self_attn.q_proj.weight"), wk = weights(m, p + "self_attn.k_proj.weight"),
              wv = weights(m, p + "self_attn.v_proj.weight"), wo = weights(m, p + "self_attn.o_proj.weight"),
              wg = weights(m, p + "mlp.gate_proj.weight"), wu = weights(m, p + "mlp.up_proj.weight"),
              wd = weights(m, p + "mlp.down_proj.weight"), n1 = weights(m, p + "input_layernorm.weight"),
              n2 = weights(m, p + "post_attention_layernorm.weight");
    std::vector<Vec> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const Vec xn = rmsnorm64(x[t], n1, c.rms_norm_eps);
      q[t] = linear64(wq, xn, nh * d, h);
      k[t] = linear64(wk, xn, nkv * d, h);
      v[t] = linear64(wv, xn, nkv * d, h);
      rope64(q[t], nh, c, t);
      rope64(k[t], nkv, c, t);
    }
    for (int64_t t = 0; t < n; ++t) {
      Vec att(nh * d, 0.0);
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t g = hh / (nh / nkv);
        Vec s(t + 1);
        double mx = -INFINITY, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t j = 0; j < d; ++j) dot += q[t][hh * d + j] * k[u][g * d + j];
          s[u] = dot / std::sqrt(double(d));
          mx = std::max(mx, s[u]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t j = 0; j < d; ++j) att[hh * d + j] += s[u] / sum * v[u][g * d + j];
      }
      const Vec o = linear64(wo, att, h, nh * d);
      for (int64_t i = 0; i < h; ++i) x[t][i] += o[i];
      const Vec xn = rmsnorm64(x[t], n2, c.rms_norm_eps);
      const Vec gt = linear64(wg, xn, c.intermediate_size, h), up = linear64(wu, xn, c.intermediate_size, h);
      Vec act(c.intermediate_size);
      for (int64_t i = 0; i < c.intermediate_size; ++i) act[i] = gt[i] / (1 + std::exp(-gt[i])) * up[i];
      const Vec dn = linear64(wd, act, h, c.intermediate_size);
      for (int64_t i = 0; i < h; ++i) x[t][i] += dn[i];
    }
  }
  const Vec head = weights(m, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  const Vec fn = weights(m, "model.norm.weight");
  std::vector<Vec> logits(n);
  for (int64_t t = 0; t < n; ++t) logits[t] = linear64(head, rmsnorm64(x[t], fn, c.rms_norm_eps), c.vocab_size, h);
  return logits;
}

// Max |a − b| over a logits row, relative to the row's largest |b| (at least 1).
double row_error(const float* a, const double* b, int64_t n) {
  double err = 0, mag = 1;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    mag = std::max(mag, std::fabs(b[i]));
  }
  return err / mag;
}

double row_error(const float* a, const float* b, int64_t n) {
  const std::vector<double> bd(b, b + n);
  return row_error(a, bd.data(), n);
}

// fp32 engine vs fp64 definition: a few hundred roundings of 2^-24 along each logit's path (sums of <= 80 terms,
// 3 layers, norms, softmax), with margin for error growth through the residual stream.
constexpr double kVsFp64RelTol = 2e-5;
// The engine against itself computed differently (rows batched vs alone, cache vs one pass): both sides are fp32
// evaluations (measured within about 2e-6 of fp64 here) that differ only in summation order (BLAS kernels for other
// shapes, blocked sgemm attention for many queries vs the loops for one), so a fraction of kVsFp64RelTol.
constexpr double kSelfRelTol = 1e-5;

class RefEngineTiny : public ::testing::TestWithParam<TinySpec> {};

TEST_P(RefEngineTiny, AllLogitsMatchNaiveFp64Forward) {
  const Model m = make_tiny_model(GetParam(), 11);
  auto engine = make_reference_engine(m);
  std::mt19937 rng(12);
  const auto tokens = random_token_ids(23, m.config.vocab_size, rng);
  const auto out = engine->forward(std::vector<SequenceChunk>{{0, tokens}}, true);
  const int64_t vocab = m.config.vocab_size;
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].size(), tokens.size() * vocab);
  const auto want = naive_forward(m, tokens);
  for (size_t t = 0; t < tokens.size(); ++t) {
    EXPECT_LE(row_error(&out[0][t * vocab], want[t].data(), vocab), kVsFp64RelTol) << "position " << t;
  }
  EXPECT_EQ(engine->sequence_length(0), 23);
}

TEST_P(RefEngineTiny, PrefillThenDecodeEqualsOnePass) {
  const Model m = make_tiny_model(GetParam(), 21);
  const int64_t vocab = m.config.vocab_size;
  std::mt19937 rng(22);
  const auto tokens = random_token_ids(19, vocab, rng);
  auto whole = make_reference_engine(m);
  const auto all = whole->forward(std::vector<SequenceChunk>{{3, tokens}}, true)[0];

  auto stepped = make_reference_engine(m);
  const size_t prefill = 6;
  auto last = stepped->forward(
      std::vector<SequenceChunk>{{3, std::vector<int32_t>(tokens.begin(), tokens.begin() + prefill)}})[0];
  ASSERT_EQ(last.size(), size_t(vocab));
  EXPECT_LE(row_error(last.data(), &all[(prefill - 1) * vocab], vocab), kSelfRelTol);
  for (size_t t = prefill; t < tokens.size(); ++t) {
    last = stepped->forward(std::vector<SequenceChunk>{{3, {tokens[t]}}})[0];
    EXPECT_LE(row_error(last.data(), &all[t * vocab], vocab), kSelfRelTol) << "decode position " << t;
    EXPECT_EQ(stepped->sequence_length(3), int64_t(t + 1));
  }
}

TEST_P(RefEngineTiny, BatchOfThreeEqualsEachAlone) {
  const Model m = make_tiny_model(GetParam(), 31);
  const int64_t vocab = m.config.vocab_size;
  std::mt19937 rng(32);
  const auto history = random_token_ids(5, vocab, rng);  // sequence 7 already holds these
  const std::vector<SequenceChunk> batch = {
      {7, random_token_ids(3, vocab, rng)},
      {-2, random_token_ids(11, vocab, rng)},
      {40, random_token_ids(1, vocab, rng)}};

  auto batched = make_reference_engine(m);
  batched->forward(std::vector<SequenceChunk>{{7, history}});
  for (bool all_logits : {false, true}) {
    auto run_batch = make_reference_engine(m);
    run_batch->forward(std::vector<SequenceChunk>{{7, history}});
    const auto got = run_batch->forward(batch, all_logits);
    ASSERT_EQ(got.size(), 3u);
    for (size_t i = 0; i < batch.size(); ++i) {
      auto alone = make_reference_engine(m);
      if (batch[i].seq_id == 7) alone->forward(std::vector<SequenceChunk>{{7, history}});
      const auto want = alone->forward(std::vector<SequenceChunk>{batch[i]}, all_logits)[0];
      ASSERT_EQ(got[i].size(), want.size()) << "chunk " << i;
      for (size_t r = 0; r * vocab < want.size(); ++r) {
        EXPECT_LE(row_error(&got[i][r * vocab], &want[r * vocab], vocab), kSelfRelTol)
            << "chunk " << i << " row " << r << " all_logits " << all_logits;
      }
      EXPECT_EQ(run_batch->sequence_length(batch[i].seq_id), alone->sequence_length(batch[i].seq_id));
    }
  }
}

TEST_P(RefEngineTiny, LastLogitsAreTheLastAllLogitsRow) {
  const Model m = make_tiny_model(GetParam(), 41);
  const int64_t vocab = m.config.vocab_size;
  std::mt19937 rng(42);
  const auto tokens = random_token_ids(9, vocab, rng);
  auto a = make_reference_engine(m), b = make_reference_engine(m);
  const auto all = a->forward(std::vector<SequenceChunk>{{0, tokens}}, true)[0];
  const auto last = b->forward(std::vector<SequenceChunk>{{0, tokens}}, false)[0];
  ASSERT_EQ(all.size(), tokens.size() * vocab);
  ASSERT_EQ(last.size(), size_t(vocab));
  EXPECT_LE(row_error(last.data(), &all[(tokens.size() - 1) * vocab], vocab), kSelfRelTol);
}

INSTANTIATE_TEST_SUITE_P(Specs, RefEngineTiny, ::testing::ValuesIn(kSpecs),
                         [](const auto& info) { return std::string(info.param.name); });

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RefEngine, RejectsBadTokenIdsWithoutChangingState) {
  const Model m = make_tiny_model(kSpecs[0], 51);
  auto engine = make_reference_engine(m);
  engine->forward(std::vector<SequenceChunk>{{1, {1, 2, 3}}});
  for (int32_t bad : {-1, 97, 1 << 30}) {
    const std::string msg = error_of([&] { engine->forward(std::vector<SequenceChunk>{{5, {4}}, {1, {2, bad}}}); });
    EXPECT_NE(msg.find("sequence 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find("97"), std::string::npos) << msg;
  }
  EXPECT_EQ(engine->sequence_length(1), 3);
  EXPECT_EQ(engine->sequence_length(5), 0);  // the valid chunk of the rejected batch did not run either
}

TEST(RefEngine, RejectsSequencesPastTheMaximumLength) {
  const Model m = make_tiny_model(kSpecs[1], 52);
  ReferenceOptions opt;
  opt.max_sequence_length = 10;
  auto engine = make_reference_engine(m, opt);
  EXPECT_EQ(engine->max_sequence_length(), 10);
  engine->forward(std::vector<SequenceChunk>{{9, {1, 2, 3, 4, 5, 6, 7, 8}}});
  const std::string msg = error_of([&] { engine->forward(std::vector<SequenceChunk>{{9, {1, 2, 3}}}); });
  EXPECT_NE(msg.find("sequence 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("10"), std::string::npos) << msg;
  EXPECT_EQ(engine->sequence_length(9), 8);
  engine->forward(std::vector<SequenceChunk>{{9, {1, 2}}});  // exactly up to the limit is fine
  EXPECT_EQ(engine->sequence_length(9), 10);
  EXPECT_THROW(engine->forward(std::vector<SequenceChunk>{{9, {1}}}), Error);
  EXPECT_THROW(engine->forward(std::vector<SequenceChunk>{{2, std::vector<int32_t>(11, 1)}}), Error);
  // Default: the model's max_position_embeddings.
  EXPECT_EQ(make_reference_engine(m)->max_sequence_length(), 64);
  opt.max_sequence_length = -1;
  EXPECT_THROW(make_reference_engine(m, opt), Error);
}

TEST(RefEngine, RejectsEmptyChunksAndDuplicateSequences) {
  const Model m = make_tiny_model(kSpecs[0], 53);
  auto engine = make_reference_engine(m);
  EXPECT_THROW(engine->forward(std::vector<SequenceChunk>{{1, {}}}), Error);
  EXPECT_THROW(engine->forward(std::vector<SequenceChunk>{{1, {3}}, {1, {4}}}), Error);
  EXPECT_EQ(engine->sequence_length(1), 0);
  EXPECT_TRUE(engine->forward(std::vector<SequenceChunk>{}).empty());
}

TEST(RefEngine, RejectsAnIncompleteModel) {
  Model m = make_tiny_model(kSpecs[0], 54);
  m.tensors.erase("model.layers.2.mlp.up_proj.weight");
  const std::string msg = error_of([&] { make_reference_engine(m); });
  EXPECT_NE(msg.find("model.layers.2.mlp.up_proj.weight"), std::string::npos) << msg;
}

TEST(RefEngine, ResetFreesTheSequenceAndTheIdCanBeReused) {
  const Model m = make_tiny_model(kSpecs[2], 55);
  std::mt19937 rng(56);
  const auto a = random_token_ids(7, m.config.vocab_size, rng), b = random_token_ids(4, m.config.vocab_size, rng);
  auto engine = make_reference_engine(m), fresh = make_reference_engine(m);
  engine->forward(std::vector<SequenceChunk>{{4, a}});
  engine->reset(4);
  EXPECT_EQ(engine->sequence_length(4), 0);
  engine->reset(123);  // unknown id: nothing to do
  const auto got = engine->forward(std::vector<SequenceChunk>{{4, b}})[0];
  const auto want = fresh->forward(std::vector<SequenceChunk>{{4, b}})[0];
  EXPECT_EQ(got, want);
}

TEST(RefEngine, Bf16WeightsAreConvertedOnce) {
  // The same model with every tensor stored as bf16 gives the logits of the fp32 model holding the bf16 values.
  Model m = make_tiny_model(kSpecs[0], 57);
  Model rounded = m, as_bf16 = m;
  for (auto& [name, t] : m.tensors) {
    const auto f = t.to_f32();
    std::vector<float> r(f.size());
    std::vector<uint8_t> bytes(f.size() * 2);
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t b = f32_to_bf16(f[i]);
      r[i] = bf16_to_f32(b);
      std::memcpy(&bytes[2 * i], &b, 2);
    }
    rounded.tensors[name] = Tensor::from_f32(name, t.shape, r);
    as_bf16.tensors[name] = Tensor::from_bytes(name, DType::BF16, t.shape, bytes);
  }
  const std::vector<SequenceChunk> batch = {{0, {5, 9, 13, 2}}};
  EXPECT_EQ(make_reference_engine(as_bf16)->forward(batch, true), make_reference_engine(rounded)->forward(batch, true));
}

}  // namespace
}  // namespace futransformer
