// The reference engine under low-precision recipes: paged KV stores hold exactly the bytes of formats/kv_cache.h,
// int4-hadamard attention (rotated queries, un-rotated outputs) equals attention over un-rotated decoded keys and
// values computed independently in fp64, and act-fp8 perturbs logits by a bounded amount.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/hadamard.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/reference_engine.h"
#include "ref/kv_cache.h"
#include "ref/ops.h"
#include "ref/ref_model.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {

using formats::KvFormat;
using formats::KvPart;

constexpr KvFormat kFormats[] = {KvFormat::BF16, KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD};

// The attention output (fp32 math, different operation order) vs an fp64 computation of the same values.
constexpr double kAttentionTolerance = 1e-5;
// act-fp8 rounds each projection input to 3 mantissa bits: relative error at most 2^-4 per value, about 2% RMS.
// Fourteen projections in series, and attention sharpened by the tiny model's large q/k weights, amplify that to
// ~16% on the logits (measured): far more than fp32 rounding (< 1e-5), well below the O(1) change of a broken
// quantiser. The exact per-projection rule is checked separately below.
constexpr double kActFp8MinChange = 1e-3;
constexpr double kActFp8MaxChange = 0.3;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class PagedStore : public ::testing::TestWithParam<KvFormat> {};

TEST_P(PagedStore, ReadsAndPagesEqualEncodeThenDecode) {
  const KvFormat f = GetParam();
  const int64_t heads = 3, hd = 64, w = heads * hd, total = 150;  // 150 tokens: pages 0, 1 full, page 2 partial
  std::mt19937 rng(11 + static_cast<int>(f));
  const std::vector<float> k = random_vector(static_cast<size_t>(total * w), rng, 2.0f);
  const std::vector<float> v = random_vector(static_cast<size_t>(total * w), rng);
  ref::PagedKvStore store(f, heads, hd);
  int64_t done = 0;
  for (int64_t chunk : {1, 62, 2, 70, 15}) {  // crosses page boundaries inside and between appends
    store.append(&k[done * w], &v[done * w], chunk);
    done += chunk;
  }
  ASSERT_EQ(done, total);
  ASSERT_EQ(store.size(), total);
  ASSERT_EQ(store.pages_per_head(), 3);

  // Independent pages: every token encoded into a fresh page per (head, page index). For int4-hadamard the keys
  // carry the anchor of the first append, here one token: its rotated key rounded to fp16.
  const formats::KvPageLayout L = formats::kv_page_layout(f, hd);
  std::vector<float> want_k(static_cast<size_t>(total * w)), want_v(static_cast<size_t>(total * w));
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<uint16_t> anchor;
    if (f == KvFormat::INT4_HADAMARD) {
      std::vector<float> first(k.begin() + h * hd, k.begin() + (h + 1) * hd);
      formats::hadamard_blocks(first.data(), hd, formats::hadamard_block_for(hd));
      for (float x : first) anchor.push_back(f32_to_f16(x));
    }
    EXPECT_TRUE(std::equal(anchor.begin(), anchor.end(), store.key_anchor(h).begin(), store.key_anchor(h).end()))
        << "head " << h;
    for (int64_t p = 0; p < 3; ++p) {
      std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes), 0);
      for (int64_t s = 0; s < L.page_tokens && p * L.page_tokens + s < total; ++s) {
        const size_t off = static_cast<size_t>((p * L.page_tokens + s) * w + h * hd);
        formats::kv_encode_token(L, page.data(), s, KvPart::K, std::span<const float>(&k[off], hd), anchor);
        formats::kv_encode_token(L, page.data(), s, KvPart::V, std::span<const float>(&v[off], hd));
        formats::kv_decode_token(L, page.data(), s, KvPart::K, std::span<float>(&want_k[off], hd));
        formats::kv_decode_token(L, page.data(), s, KvPart::V, std::span<float>(&want_v[off], hd));
      }
      EXPECT_EQ(std::memcmp(store.page(h, p), page.data(), page.size()), 0) << "head " << h << " page " << p;
    }
  }
  std::vector<float> got_k(static_cast<size_t>(total * w)), got_v(static_cast<size_t>(total * w));
  store.read_keys(total, got_k.data());
  store.read_values(total, got_v.data());
  EXPECT_EQ(std::memcmp(got_k.data(), want_k.data(), got_k.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got_v.data(), want_v.data(), got_v.size() * 4), 0);
  // A prefix read returns the prefix.
  std::vector<float> prefix(static_cast<size_t>(5 * w));
  store.read_keys(5, prefix.data());
  EXPECT_EQ(std::memcmp(prefix.data(), want_k.data(), prefix.size() * 4), 0);
  EXPECT_THROW(store.read_keys(total + 1, got_k.data()), Error);
}

// The quantised formats reject non-finite values (bf16 stores them, so it is not in this suite).
class QuantisedPagedStore : public ::testing::TestWithParam<KvFormat> {};

TEST_P(QuantisedPagedStore, RejectedTokensLeaveTheStoreUnchanged) {
  const KvFormat f = GetParam();
  const int64_t heads = 2, hd = 32, w = heads * hd;
  std::mt19937 rng(5);
  std::vector<float> k = random_vector(static_cast<size_t>(70 * w), rng), v = random_vector(k.size(), rng);
  ref::PagedKvStore store(f, heads, hd);
  store.append(k.data(), v.data(), 63);
  std::vector<float> before(static_cast<size_t>(63 * w));
  store.read_keys(63, before.data());
  k[static_cast<size_t>(65 * w + 3)] = std::nanf("");
  EXPECT_THROW(store.append(&k[63 * w], &v[63 * w], 5), Error);
  EXPECT_EQ(store.size(), 63);
  EXPECT_EQ(store.pages_per_head(), 1);
  store.append(&k[63 * w], &v[63 * w], 2);  // the valid tokens still go in afterwards
  std::vector<float> after(static_cast<size_t>(65 * w));
  store.read_keys(65, after.data());
  EXPECT_EQ(std::memcmp(after.data(), before.data(), before.size() * 4), 0);
}

std::string format_test_name(const ::testing::TestParamInfo<KvFormat>& info) {
  std::string n = formats::kv_format_name(info.param);
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedStore, ::testing::ValuesIn(kFormats), format_test_name);
INSTANTIATE_TEST_SUITE_P(Formats, QuantisedPagedStore,
                         ::testing::Values(KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD), format_test_name);

TEST(PagedStoreFactory, Fp32WhenNoFormatAndClearErrorsForBadHeads) {
  EXPECT_NE(dynamic_cast<ref::F32KvStore*>(ref::make_kv_store(std::nullopt, 2, 8).get()), nullptr);
  EXPECT_NE(dynamic_cast<ref::PagedKvStore*>(ref::make_kv_store(KvFormat::FP8, 2, 64).get()), nullptr);
  try {
    ref::make_kv_store(KvFormat::INT4, 4, 8);
    FAIL() << "int4 with head_dim 8 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 8"), std::string::npos) << e.what();
  }
}

// One decoder layer run by RefModel with a KV format; the hook captures the q/k/v input (xn) and the o input (the
// attention output). The test recomputes q, k, v with the same fp32 projections and RoPE (bit-identical, so the KV
// encoder sees the same values), then does attention its own way: keys and values decoded from independently
// encoded pages, rotated back by H for int4-hadamard (instead of rotating q) after adding back the key anchor
// (computed here by hand from the one appended chunk), softmax and sums in fp64.
struct LayerCapture {
  std::vector<float> xn, att;
};

LayerCapture run_layer0(const Model& m, std::optional<KvFormat> kv, const std::vector<int32_t>& tokens) {
  ref::RefModelOptions opt;
  opt.kv = kv;
  ref::RefModel rm(m, opt);
  const int64_t n = static_cast<int64_t>(tokens.size()), h = m.config.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * h));
  rm.embed(tokens, x.data());
  auto store = rm.make_kv_store();
  const ref::SequenceRows seq{0, n, 0, store.get()};
  LayerCapture cap;
  rm.run_layer(0, x.data(), n, std::span<const ref::SequenceRows>(&seq, 1),
               [&](int64_t, ref::ProjectionInput g, const float* in, int64_t rows, int64_t cols) {
                 if (g == ref::ProjectionInput::Qkv) cap.xn.assign(in, in + rows * cols);
                 if (g == ref::ProjectionInput::O) cap.att.assign(in, in + rows * cols);
               });
  return cap;
}

std::vector<double> attention_by_hand(const Model& m, std::optional<KvFormat> kv, const LayerCapture& cap,
                                      int64_t n) {
  const ModelConfig& c = m.config;
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t qw = nh * hd, kvw = nkv * hd;
  ref::RefModel rm(m, {});
  std::vector<float> q(static_cast<size_t>(n * qw)), k(static_cast<size_t>(n * kvw)), v(k.size());
  rm.projection(0, ref::Projection::Q).forward(cap.xn.data(), n, q.data());
  rm.projection(0, ref::Projection::K).forward(cap.xn.data(), n, k.data());
  rm.projection(0, ref::Projection::V).forward(cap.xn.data(), n, v.data());
  const std::vector<float> inv_freq = ref::rope_inv_freq(hd, c.rope_theta, c.rope_scaling);
  for (int64_t t = 0; t < n; ++t) {
    ref::apply_rope(&q[t * qw], nh, hd, t, inv_freq.data());
    ref::apply_rope(&k[t * kvw], nkv, hd, t, inv_freq.data());
  }
  if (kv) {  // the cache's values, back in the model's basis
    const formats::KvPageLayout L = formats::kv_page_layout(*kv, hd);
    std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes));
    const int64_t block = formats::kv_hadamard_block(*kv, hd);
    // int4-hadamard's key anchor: the whole prompt is the first chunk, so c = fp16(mean over it of H·k).
    std::vector<std::vector<uint16_t>> anchor(static_cast<size_t>(nkv));
    if (*kv == KvFormat::INT4_HADAMARD) {
      for (int64_t g = 0; g < nkv; ++g) {
        std::vector<double> sum(static_cast<size_t>(hd), 0.0);
        for (int64_t t = 0; t < n; ++t) {
          std::vector<float> r(&k[t * kvw + g * hd], &k[t * kvw + g * hd] + hd);
          formats::hadamard_blocks(r.data(), hd, block);
          for (int64_t j = 0; j < hd; ++j) sum[static_cast<size_t>(j)] += r[static_cast<size_t>(j)];
        }
        for (double s : sum) anchor[static_cast<size_t>(g)].push_back(f32_to_f16(static_cast<float>(s / double(n))));
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t g = 0; g < nkv; ++g) {
        const std::vector<uint16_t>& c = anchor[static_cast<size_t>(g)];
        float* key = &k[t * kvw + g * hd];
        formats::kv_encode_token(L, page.data(), 0, KvPart::K, std::span<const float>(key, hd), c);
        formats::kv_decode_token(L, page.data(), 0, KvPart::K, std::span<float>(key, hd));
        for (size_t j = 0; j < c.size(); ++j) key[j] += f16_to_f32(c[j]);
        float* value = &v[t * kvw + g * hd];
        formats::kv_encode_token(L, page.data(), 0, KvPart::V, std::span<const float>(value, hd));
        formats::kv_decode_token(L, page.data(), 0, KvPart::V, std::span<float>(value, hd));
        for (float* x : {key, value})
          if (block > 0) formats::hadamard_blocks(x, hd, block);
      }
    }
  }
  std::vector<double> out(static_cast<size_t>(n * qw), 0.0);
  const int64_t group = nh / nkv;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t hh = 0; hh < nh; ++hh) {
      const int64_t g = hh / group;
      std::vector<double> s(static_cast<size_t>(i + 1));
      double mx = -1e300, sum = 0;
      for (int64_t t = 0; t <= i; ++t) {
        double d = 0;
        for (int64_t j = 0; j < hd; ++j) d += double(q[i * qw + hh * hd + j]) * double(k[t * kvw + g * hd + j]);
        s[t] = d / std::sqrt(double(hd));
        mx = std::max(mx, s[t]);
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t t = 0; t <= i; ++t)
        for (int64_t j = 0; j < hd; ++j) out[i * qw + hh * hd + j] += s[t] / sum * double(v[t * kvw + g * hd + j]);
    }
  }
  return out;
}

double max_rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::abs(double(got[i]) - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

TEST(RefPrecision, AttentionWithEachKvFormatEqualsIndependentComputation) {
  const Model m = test::make_tiny_llama({}, 21);
  std::mt19937 rng(3);
  const std::vector<int32_t> tokens = test::random_token_ids(80, m.config.vocab_size, rng);  // two pages
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<std::optional<KvFormat>> formats_to_test = {std::nullopt};
  for (KvFormat f : kFormats) formats_to_test.push_back(f);
  const LayerCapture fp32 = run_layer0(m, std::nullopt, tokens);
  for (const auto& kv : formats_to_test) {
    const std::string what = kv ? formats::kv_format_name(*kv) : "fp32";
    const LayerCapture cap = run_layer0(m, kv, tokens);
    ASSERT_EQ(cap.xn, fp32.xn) << what;  // the layer's input does not depend on the cache
    EXPECT_LT(max_rel_error(cap.att, attention_by_hand(m, kv, cap, n)), kAttentionTolerance) << what;
    if (kv) EXPECT_GT(test::relative_l2(cap.att, fp32.att), 0.0) << what << " must round the cache";
  }
  // Rotation matters: int4-hadamard's output is not int4's, and both are a visible but bounded change from fp32.
  const LayerCapture int4 = run_layer0(m, KvFormat::INT4, tokens);
  const LayerCapture had = run_layer0(m, KvFormat::INT4_HADAMARD, tokens);
  EXPECT_GT(test::relative_l2(had.att, int4.att), 1e-3);
  EXPECT_LT(test::relative_l2(had.att, fp32.att), 0.5);
}

std::vector<float> logits_of(const Model& m, const ReferenceOptions& o, const std::vector<int32_t>& tokens) {
  auto engine = make_reference_engine(m, o);
  const SequenceChunk chunk{0, tokens};
  return engine->forward(std::span<const SequenceChunk>(&chunk, 1), /*all_logits=*/true)[0];
}

TEST(RefPrecision, KvFormatsPrefillThenDecodeEqualsOnePass) {
  // The cache holds what a prefill wrote; decoding token by token reads the same bytes back as one 10-token chunk
  // after the same prefill. (Both start with the same 60-token prefill because int4-hadamard's key anchor is fixed
  // by the first chunk: a 70-token single pass would anchor, hence round, the keys differently.)
  const Model m = test::make_tiny_llama({}, 8);
  std::mt19937 rng(4);
  const std::vector<int32_t> tokens = test::random_token_ids(70, m.config.vocab_size, rng);
  const SequenceChunk prefill{0, std::vector<int32_t>(tokens.begin(), tokens.begin() + 60)};
  const SequenceChunk rest{0, std::vector<int32_t>(tokens.begin() + 60, tokens.end())};
  for (KvFormat f : kFormats) {
    ReferenceOptions o;
    o.kv = f;
    auto chunked = make_reference_engine(m, o);
    chunked->forward(std::span<const SequenceChunk>(&prefill, 1));
    const std::vector<float> all = chunked->forward(std::span<const SequenceChunk>(&rest, 1), true)[0];
    auto engine = make_reference_engine(m, o);
    engine->forward(std::span<const SequenceChunk>(&prefill, 1));
    for (size_t i = 60; i < tokens.size(); ++i) {
      const SequenceChunk step{0, {tokens[i]}};
      const std::vector<float> got = engine->forward(std::span<const SequenceChunk>(&step, 1))[0];
      const size_t r = i - 60;
      const std::vector<float> want(all.begin() + r * m.config.vocab_size, all.begin() + (r + 1) * m.config.vocab_size);
      // Different query block sizes take different attention code (BLAS blocks vs loops): fp32 rounding only.
      EXPECT_LT(test::relative_l2(got, want), 1e-5) << formats::kv_format_name(f) << " token " << i;
    }
  }
}

TEST(RefPrecision, KvFormatErrorsNameTheModel) {
  test::TinyLlama s;
  s.heads = 8;
  s.kv_heads = 4;
  s.head_dim = 8;
  const Model m = test::make_tiny_llama(s, 1);
  ReferenceOptions o;
  o.kv = KvFormat::INT4;
  try {
    make_reference_engine(m, o);
    FAIL() << "int4 KV with head_dim 8 must be rejected";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("synthetic:tiny-llama"), std::string::npos) << msg;
    EXPECT_NE(msg.find("head_dim 8"), std::string::npos) << msg;
  }
  o.kv = KvFormat::BF16;  // bf16 needs a multiple of 8 only
  EXPECT_NO_THROW(make_reference_engine(m, o));
}

TEST(RefPrecision, ActFp8RoundsEveryProjectionInput) {
  const Model m = test::make_tiny_llama({}, 5);
  std::mt19937 rng(6);
  const std::vector<int32_t> tokens = test::random_token_ids(24, m.config.vocab_size, rng);
  ReferenceOptions o;
  o.activations = ActivationFormat::Fp8PerToken;
  const double change = test::relative_l2(logits_of(m, o, tokens), logits_of(m, {}, tokens));
  EXPECT_GT(change, kActFp8MinChange);
  EXPECT_LT(change, kActFp8MaxChange);

  // Each projection multiplies the fp8-rounded input: check one group by hand (decode(code) · scale).
  ref::RefModelOptions ro;
  ro.activations = ActivationFormat::Fp8PerToken;
  ref::RefModel rm(m, ro);
  const int64_t n = static_cast<int64_t>(tokens.size()), h = m.config.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * h));
  rm.embed(tokens, x.data());
  auto store = rm.make_kv_store();
  const ref::SequenceRows seq{0, n, 0, store.get()};
  std::vector<float> down_in, rounded;
  rm.run_layer(0, x.data(), n, std::span<const ref::SequenceRows>(&seq, 1),
               [&](int64_t, ref::ProjectionInput g, const float* in, int64_t rows, int64_t cols) {
                 if (g == ref::ProjectionInput::Down) down_in.assign(in, in + rows * cols);
               });
  const int64_t inter = m.config.intermediate_size;
  const formats::Fp8Matrix q = formats::fp8_quantize_per_token(down_in, n, inter, "test");
  rounded = formats::fp8_dequantize(q);
  std::vector<float> got(static_cast<size_t>(n * h)), want(got.size());
  rm.projection(0, ref::Projection::Down).forward(down_in.data(), n, got.data());
  ref::RefModel plain(m, {});
  plain.projection(0, ref::Projection::Down).forward(rounded.data(), n, want.data());
  EXPECT_EQ(got, want);
}

// act-bf16 (the CUDA engine's activations): every projection input is BF16-representable, the logits move by
// about the BF16 rounding (2^-9 relative per element, accumulated over the layers) and no more.
TEST(RefPrecision, ActBf16RoundsProjectionInputsAndOutputs) {
  const Model m = test::make_tiny_llama({}, 5);
  std::mt19937 rng(7);
  const std::vector<int32_t> tokens = test::random_token_ids(24, m.config.vocab_size, rng);
  ReferenceOptions o;
  o.activations = ActivationFormat::Bf16;
  const double change = test::relative_l2(logits_of(m, o, tokens), logits_of(m, {}, tokens));
  EXPECT_GT(change, 1e-5);  // it does round
  EXPECT_LT(change, 5e-2);  // and only that much
  ref::RefModelOptions ro;
  ro.activations = ActivationFormat::Bf16;
  ref::RefModel rm(m, ro);
  const int64_t n = static_cast<int64_t>(tokens.size()), h = m.config.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * h));
  rm.embed(tokens, x.data());
  auto store = rm.make_kv_store();
  const ref::SequenceRows seq{0, n, 0, store.get()};
  std::vector<float> o_in;
  rm.run_layer(0, x.data(), n, std::span<const ref::SequenceRows>(&seq, 1),
               [&](int64_t, ref::ProjectionInput g, const float* in, int64_t rows, int64_t cols) {
                 if (g == ref::ProjectionInput::O) o_in.assign(in, in + rows * cols);
               });
  // The attention output the O projection reads is made of the BF16-rounded values the GPU would pass.
  std::vector<float> got(static_cast<size_t>(n * h)), want(got.size()), rounded = o_in;
  for (float& v : rounded) v = bf16_to_f32(f32_to_bf16(v));
  rm.projection(0, ref::Projection::O).forward(o_in.data(), n, got.data());
  ref::RefModel plain(m, {});
  plain.projection(0, ref::Projection::O).forward(rounded.data(), n, want.data());
  EXPECT_EQ(got, want);
}

// The projection inputs of layer 0 (as the model's rounding leaves them) for one sequence of `tokens`.
struct LayerInputs {
  std::vector<float> qkv, o, gate_up, down;
};
LayerInputs layer0_inputs(ref::RefModel& rm, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> x(static_cast<size_t>(n * rm.config().hidden_size));
  rm.embed(tokens, x.data());
  auto store = rm.make_kv_store();
  const ref::SequenceRows seq{0, n, 0, store.get()};
  LayerInputs li;
  rm.run_layer(0, x.data(), n, std::span<const ref::SequenceRows>(&seq, 1),
               [&](int64_t, ref::ProjectionInput g, const float* in, int64_t rows, int64_t cols) {
                 std::vector<float> v(in, in + rows * cols);
                 if (g == ref::ProjectionInput::Qkv) li.qkv = v;
                 if (g == ref::ProjectionInput::O) li.o = v;
                 if (g == ref::ProjectionInput::GateUp) li.gate_up = v;
                 if (g == ref::ProjectionInput::Down) li.down = v;
               });
  return li;
}

// act-fp8-bf16 (the CUDA engine's FP8 prefill): projection inputs are FP8 per token — of the fp32 RMSNorm / SwiGLU
// values, and of the BF16-rounded attention output for o_proj — and projection outputs are BF16, so SwiGLU reads
// BF16 gate/up values. Each rule is checked exactly against the plain fp32 projection on hand-rounded inputs.
TEST(RefPrecision, ActFp8OverBf16RoundsAsTheFp8PrefillPasses) {
  const Model m = test::make_tiny_llama({}, 5);
  std::mt19937 rng(8);
  const std::vector<int32_t> tokens = test::random_token_ids(24, m.config.vocab_size, rng);
  ReferenceOptions o;
  o.activations = ActivationFormat::Fp8OverBf16;
  const std::vector<float> full = logits_of(m, {}, tokens), fp8_bf16 = logits_of(m, o, tokens);
  const double change = test::relative_l2(fp8_bf16, full);
  EXPECT_GT(change, kActFp8MinChange);
  EXPECT_LT(change, kActFp8MaxChange);
  ReferenceOptions fp8_only;
  fp8_only.activations = ActivationFormat::Fp8PerToken;
  EXPECT_NE(fp8_bf16, logits_of(m, fp8_only, tokens));  // the BF16 rounding points do change something

  ref::RefModelOptions ro;
  ro.activations = ActivationFormat::Fp8OverBf16;
  ref::RefModel rm(m, ro);
  const int64_t n = static_cast<int64_t>(tokens.size()), h = m.config.hidden_size;
  const int64_t inter = m.config.intermediate_size, qw = m.config.num_attention_heads * m.config.head_dim;
  const LayerInputs li = layer0_inputs(rm, tokens);
  const std::vector<float>&qkv_in = li.qkv, &o_in = li.o, &gate_up_in = li.gate_up, &down_in = li.down;
  ASSERT_EQ(qkv_in.size(), static_cast<size_t>(n * h));
  ASSERT_EQ(o_in.size(), static_cast<size_t>(n * qw));
  ASSERT_EQ(down_in.size(), static_cast<size_t>(n * inter));
  auto fp8 = [](std::vector<float> v, int64_t rows, int64_t cols) {
    ref::fp8_round_rows(v.data(), rows, cols);
    return v;
  };
  auto bf16 = [](std::vector<float> v) {
    for (float& e : v) e = bf16_to_f32(f32_to_bf16(e));
    return v;
  };
  ref::RefModel plain(m, {});
  auto expect_projection = [&](ref::Projection p, const std::vector<float>& in, const std::vector<float>& rounded,
                               int64_t out) {
    std::vector<float> got(static_cast<size_t>(n * out)), want(got.size());
    rm.projection(0, p).forward(in.data(), n, got.data());
    plain.projection(0, p).forward(rounded.data(), n, want.data());
    EXPECT_EQ(got, want) << "projection " << static_cast<int>(p);
  };
  // q/k/v and gate/up: FP8 of the fp32 RMSNorm output (rmsnorm_fp8 never rounds it to BF16).
  expect_projection(ref::Projection::Q, qkv_in, fp8(qkv_in, n, h), qw);
  expect_projection(ref::Projection::Up, gate_up_in, fp8(gate_up_in, n, h), inter);
  // o: FP8 of the BF16 attention output (quantize_rows_fp8 reads the BF16 the attention kernel wrote).
  const std::vector<float> o_rounded = fp8(bf16(o_in), n, qw);
  EXPECT_NE(o_rounded, fp8(o_in, n, qw));  // the BF16 step is not a no-op on these values
  expect_projection(ref::Projection::O, o_in, o_rounded, h);
  // down: FP8 of SwiGLU computed in fp32 from the BF16 gate/up outputs (swiglu_fp8).
  std::vector<float> gate(static_cast<size_t>(n * inter)), up(gate.size()), act(gate.size());
  rm.projection(0, ref::Projection::Gate).forward(gate_up_in.data(), n, gate.data());
  rm.projection(0, ref::Projection::Up).forward(gate_up_in.data(), n, up.data());
  gate = bf16(gate);
  up = bf16(up);
  ref::swiglu(gate.data(), up.data(), act.data(), n * inter);
  EXPECT_EQ(down_in, act);
  expect_projection(ref::Projection::Down, down_in, fp8(down_in, n, inter), h);
}

// act-fp8-block-bf16 (FP8 prefill with SwiGLU fused into the gate|up GEMM's epilogue): act-fp8-bf16 except the
// down projection's input, quantised with one scale per token per 128 channels. Intermediate 384 (three blocks) so
// the blocks differ from the per-token scale.
TEST(RefPrecision, ActFp8BlockOverBf16RoundsTheDownInputPer128Channels) {
  test::TinyLlama s;
  s.inter = 384;
  const Model m = test::make_tiny_llama(s, 5);
  std::mt19937 rng(9);
  const std::vector<int32_t> tokens = test::random_token_ids(24, m.config.vocab_size, rng);
  ReferenceOptions per_token, block;
  per_token.activations = ActivationFormat::Fp8OverBf16;
  block.activations = ActivationFormat::Fp8BlockOverBf16;
  const std::vector<float> full = logits_of(m, {}, tokens), per_token_logits = logits_of(m, per_token, tokens);
  const std::vector<float> block_logits = logits_of(m, block, tokens);
  const double change = test::relative_l2(block_logits, full);
  EXPECT_GT(change, kActFp8MinChange);
  EXPECT_LT(change, kActFp8MaxChange);
  // Only one of the seven projection inputs per layer is rounded differently: the two FP8 recipes differ, by less
  // than either differs from fp32.
  EXPECT_NE(block_logits, per_token_logits);
  EXPECT_LT(test::relative_l2(block_logits, per_token_logits), test::relative_l2(per_token_logits, full));

  ref::RefModelOptions bo, po;
  bo.activations = ActivationFormat::Fp8BlockOverBf16;
  po.activations = ActivationFormat::Fp8OverBf16;
  ref::RefModel rm(m, bo), rm_per_token(m, po);
  const int64_t n = static_cast<int64_t>(tokens.size()), h = m.config.hidden_size;
  const int64_t inter = m.config.intermediate_size, qw = m.config.num_attention_heads * m.config.head_dim;
  const int64_t kvw = m.config.num_key_value_heads * m.config.head_dim;
  const LayerInputs li = layer0_inputs(rm, tokens);
  const std::vector<float>&qkv_in = li.qkv, &o_in = li.o, &gate_up_in = li.gate_up, &down_in = li.down;
  ASSERT_EQ(qkv_in.size(), static_cast<size_t>(n * h));
  ASSERT_EQ(o_in.size(), static_cast<size_t>(n * qw));
  ASSERT_EQ(gate_up_in.size(), static_cast<size_t>(n * h));
  ASSERT_EQ(down_in.size(), static_cast<size_t>(n * inter));
  auto forward = [&](const ref::RefModel& model, ref::Projection p, const std::vector<float>& in, int64_t out) {
    std::vector<float> y(static_cast<size_t>(n * out));
    model.projection(0, p).forward(in.data(), n, y.data());
    return y;
  };
  // q/k/v, o and gate/up: exactly act-fp8-bf16's rounding.
  for (ref::Projection p : {ref::Projection::Q, ref::Projection::K, ref::Projection::V}) {
    const int64_t out = p == ref::Projection::Q ? qw : kvw;
    EXPECT_EQ(forward(rm, p, qkv_in, out), forward(rm_per_token, p, qkv_in, out)) << static_cast<int>(p);
  }
  EXPECT_EQ(forward(rm, ref::Projection::O, o_in, h), forward(rm_per_token, ref::Projection::O, o_in, h));
  for (ref::Projection p : {ref::Projection::Gate, ref::Projection::Up})
    EXPECT_EQ(forward(rm, p, gate_up_in, inter), forward(rm_per_token, p, gate_up_in, inter));
  // down: each 128-channel block of each token by hand — scale = amax / 448 of the block, value = decode(encode(x /
  // scale)) * scale — then the plain fp32 projection of those values.
  std::vector<float> want_in = down_in;
  int blocks_unlike_the_row = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = &down_in[static_cast<size_t>(r * inter)];
    float row_amax = 0;
    for (int64_t c = 0; c < inter; ++c) row_amax = std::max(row_amax, std::fabs(row[c]));
    for (int64_t b0 = 0; b0 < inter; b0 += 128) {
      float amax = 0;
      for (int64_t c = b0; c < b0 + 128; ++c) amax = std::max(amax, std::fabs(row[c]));
      ASSERT_GT(amax, 0.0f);
      blocks_unlike_the_row += amax != row_amax;
      const float scale = amax / formats::kFp8E4M3Max;
      for (int64_t c = b0; c < b0 + 128; ++c) {
        float& v = want_in[static_cast<size_t>(r * inter + c)];
        v = formats::fp8_e4m3_decode(formats::fp8_e4m3_encode(v / scale)) * scale;
      }
    }
  }
  EXPECT_GE(blocks_unlike_the_row, n);  // at least one block per token has its own scale
  std::vector<float> per_token_in = down_in;
  ref::fp8_round_rows(per_token_in.data(), n, inter);
  EXPECT_NE(want_in, per_token_in);
  std::vector<float> block_in = down_in;
  ref::fp8_block_round_rows(block_in.data(), n, inter);
  EXPECT_EQ(block_in, want_in);
  ref::RefModel plain(m, {});
  EXPECT_EQ(forward(rm, ref::Projection::Down, down_in, h), forward(plain, ref::Projection::Down, want_in, h));
}

TEST(RefPrecision, ActFp8BlockOverBf16RefusesAnIntermediateSizeNotAMultipleOf128) {
  test::TinyLlama s;
  s.inter = 192;
  const Model m = test::make_tiny_llama(s, 3);
  ReferenceOptions o;
  o.activations = ActivationFormat::Fp8BlockOverBf16;
  for (int dual = 0; dual < 2; ++dual) {
    try {
      if (dual) {
        make_prefill_decode_reference_engine(m, o, m, {});
      } else {
        make_reference_engine(m, o);
      }
      ADD_FAILURE() << "act-fp8-block-bf16 with intermediate_size 192 must be rejected";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const char* want :
           {"synthetic:tiny-llama", "act-fp8-block-bf16", "intermediate_size 192", "multiple of 128"})
        EXPECT_NE(msg.find(want), std::string::npos) << want << " not in: " << msg;
    }
  }
  o.activations = ActivationFormat::Fp8OverBf16;  // one scale per token: any size
  EXPECT_NO_THROW(make_reference_engine(m, o));
}

}  // namespace
}  // namespace futransformer
