// The reference ops against the formulas written out again here in fp64, on fresh seeded random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <random>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/dtype.h"
#include "ref/kv_cache.h"
#include "ref/linear.h"
#include "ref/ops.h"

namespace futransformer {
namespace {

// fp32 unit roundoff: every tolerance below is a small multiple of it, scaled by what the op sums.
constexpr double kU = 0x1.0p-24;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(RefOps, MatmulNtMatchesFp64Sum) {
  std::mt19937 rng(101);
  for (int64_t m : {1, 3, 17}) {
    for (int64_t n : {1, 5, 67}) {
      for (int64_t k : {1, 13, 67, 259}) {
        const auto x = random_vector(m * k, rng), w = random_vector(n * k, rng);
        std::vector<float> y(m * n, -7.0f);
        ref::matmul_nt(x.data(), w.data(), y.data(), m, n, k);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (int64_t t = 0; t < k; ++t) {
              ref += double(x[i * k + t]) * w[j * k + t];
              mag += std::fabs(double(x[i * k + t]) * w[j * k + t]);
            }
            // Worst-case bound of a k-term fp32 dot product: k·u·Σ|x·w| (plus one rounding of the result).
            const double tol = (k + 1) * kU * mag;
            EXPECT_NEAR(y[i * n + j], ref, tol) << "m " << m << " n " << n << " k " << k << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

TEST(RefOps, MatmulNtRejectsNegativeSizes) {
  float a = 1, b = 1, c = 0;
  EXPECT_THROW(ref::matmul_nt(&a, &b, &c, -1, 1, 1), Error);
}

TEST(RefOps, RmsNormMatchesFormula) {
  std::mt19937 rng(202);
  for (int64_t n : {1, 7, 64, 577}) {
    for (float eps : {1e-5f, 1e-6f}) {
      const auto x = random_vector(n, rng, -3.0f, 3.0f), w = random_vector(n, rng, 0.5f, 1.5f);
      std::vector<float> y(n);
      ref::rmsnorm(x.data(), w.data(), y.data(), n, eps);
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double inv = 1.0 / std::sqrt(ss / n + eps);
      for (int64_t i = 0; i < n; ++i) {
        const double ref = x[i] * inv * w[i];
        // Three fp32 roundings (scale, scale·x, ·w) after an fp64 mean.
        EXPECT_NEAR(y[i], ref, 4 * kU * std::fabs(ref)) << "n " << n << " i " << i;
      }
      // In place gives the same values.
      std::vector<float> z = x;
      ref::rmsnorm(z.data(), w.data(), z.data(), n, eps);
      EXPECT_EQ(z, y);
    }
  }
}

TEST(RefOps, RopeInvFreqPlain) {
  for (int64_t d : {8, 64, 128}) {
    for (double theta : {10000.0, 500000.0}) {
      const auto f = ref::rope_inv_freq(d, theta, RopeScaling{});
      ASSERT_EQ(f.size(), size_t(d / 2));
      for (int64_t i = 0; i < d / 2; ++i) {
        const double ref = std::pow(theta, -2.0 * i / d);
        EXPECT_NEAR(f[i], ref, kU * ref) << "d " << d << " i " << i;  // one rounding to fp32
      }
    }
  }
}

TEST(RefOps, RopeInvFreqLlama3MatchesLlama31_8B) {
  // Llama-3.1-8B: head_dim 128, rope_theta 500000, factor 8, low 1, high 4, original context 8192. Values worked
  // out by hand from HF's formula: i <= 28 keep f (wavelength < 2048), i >= 35 get f/8 (wavelength > 8192), and
  // 29..34 are interpolated.
  RopeScaling s;
  s.type = "llama3";
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 8192;
  const auto f = ref::rope_inv_freq(128, 500000.0, s);
  ASSERT_EQ(f.size(), 64u);
  const std::pair<int, double> expected[] = {
      {0, 1.0},
      {10, 0.12868737343265052},
      {28, 0.0032114459947525913},
      {29, 0.002166570763503359},
      {31, 0.0008567514129196321},
      {34, 0.00017850781276799638},
      {35, 9.556212353964683e-05},
      {63, 3.068925988914511e-07},
  };
  for (const auto& [i, want] : expected) EXPECT_NEAR(f[i], want, 2 * kU * want) << "index " << i;
}

TEST(RefOps, RopeInvFreqRejectsBadInput) {
  EXPECT_THROW(ref::rope_inv_freq(7, 10000.0, RopeScaling{}), Error);
  EXPECT_THROW(ref::rope_inv_freq(8, 0.0, RopeScaling{}), Error);
  RopeScaling s;
  s.type = "yarn";
  EXPECT_THROW(ref::rope_inv_freq(8, 10000.0, s), Error);
}

TEST(RefOps, ApplyRopeIsComplexRotationOfHalfPairs) {
  std::mt19937 rng(303);
  for (int64_t d : {64, 128}) {
    const auto inv_freq = ref::rope_inv_freq(d, 500000.0, RopeScaling{});
    for (int64_t pos : {0, 1, 17, 4095}) {
      const int64_t heads = 3;
      const auto x = random_vector(heads * d, rng);
      std::vector<float> y = x;
      ref::apply_rope(y.data(), heads, d, pos, inv_freq.data());
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < d / 2; ++i) {
          const double a = double(pos) * inv_freq[i];
          const std::complex<double> z =
              std::complex<double>(x[h * d + i], x[h * d + i + d / 2]) * std::polar(1.0, a);
          // cos/sin rounded to fp32, two products and a sum: a few roundings of |x0| + |x1|.
          const double tol = 4 * kU * (std::fabs(x[h * d + i]) + std::fabs(x[h * d + i + d / 2]));
          EXPECT_NEAR(y[h * d + i], z.real(), tol) << "d " << d << " pos " << pos << " i " << i;
          EXPECT_NEAR(y[h * d + i + d / 2], z.imag(), tol) << "d " << d << " pos " << pos << " i " << i;
        }
      }
    }
  }
}

TEST(RefOps, SoftmaxMatchesFormulaWithLargeOffsets) {
  std::mt19937 rng(404);
  for (int64_t n : {1, 5, 97, 2049}) {
    // An offset of 1000 would overflow exp without the max subtraction.
    auto x = random_vector(n, rng, 970.0f, 1030.0f);
    const auto in = x;
    ref::softmax(x.data(), n);
    double mx = in[0];
    for (float v : in) mx = std::max(mx, double(v));
    double sum = 0;
    for (float v : in) sum += std::exp(v - mx);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double ref = std::exp(in[i] - mx) / sum;
      // fp32 exp (about 2 ulp), the fp32 reciprocal and one product.
      EXPECT_NEAR(x[i], ref, 4 * kU * ref + 1e-30) << "n " << n << " i " << i;
      total += x[i];
    }
    EXPECT_NEAR(total, 1.0, 4 * kU * n);
  }
}

TEST(RefOps, SiluAndSwiglu) {
  std::mt19937 rng(505);
  const int64_t n = 1001;
  const auto gate = random_vector(n, rng, -20.0f, 20.0f), up = random_vector(n, rng, -3.0f, 3.0f);
  std::vector<float> out(n);
  ref::swiglu(gate.data(), up.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = double(gate[i]) / (1.0 + std::exp(-double(gate[i])));
    EXPECT_NEAR(ref::silu(gate[i]), s, 4 * kU * std::fabs(s) + 1e-37) << "x " << gate[i];
    EXPECT_NEAR(out[i], s * up[i], 5 * kU * std::fabs(s * up[i]) + 1e-37) << "i " << i;
  }
  // Saturation: no NaN from exp overflow.
  EXPECT_EQ(ref::silu(100.0f), 100.0f);
  EXPECT_FLOAT_EQ(ref::silu(-100.0f), 0.0f);
  EXPECT_FALSE(std::isnan(ref::silu(-1000.0f)));
}

// Causal GQA attention straight from the definition, in fp64.
std::vector<double> attention_fp64(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                   int64_t n_q, int64_t q_pos0, int64_t nh, int64_t nkv, int64_t d) {
  std::vector<double> out(n_q * nh * d, 0.0);
  for (int64_t i = 0; i < n_q; ++i) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / (nh / nkv);
      const int64_t len = q_pos0 + i + 1;
      std::vector<double> s(len);
      double mx = -INFINITY;
      for (int64_t t = 0; t < len; ++t) {
        double acc = 0;
        for (int64_t j = 0; j < d; ++j) acc += double(q[(i * nh + h) * d + j]) * k[(t * nkv + g) * d + j];
        s[t] = acc / std::sqrt(double(d));
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t j = 0; j < d; ++j) out[(i * nh + h) * d + j] += s[t] / sum * v[(t * nkv + g) * d + j];
      }
    }
  }
  return out;
}

TEST(RefOps, AttentionMatchesFp64CausalGqa) {
  // Inputs in [-1, 1]: fp32 dot products of d terms are off by about sqrt(d)·u·|q||k|/sqrt(d) in the scores, which the
  // softmax turns into a relative error of the weights of the same size; outputs are averages of |v| <= 1.
  constexpr double kAttentionAbsTol = 2e-6;
  std::mt19937 rng(606);
  for (int64_t d : {64, 128}) {
    for (auto [nh, nkv] : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}, {8, 2}}) {
      for (int64_t n_q : {1, 3, 17}) {
        for (int64_t q_pos0 : {0, 5}) {
          const int64_t n_kv = q_pos0 + n_q;
          const auto q = random_vector(n_q * nh * d, rng);
          // Keys twice the size of the queries so the scores spread and the softmax is not near uniform.
          const auto k = random_vector(n_kv * nkv * d, rng, -2.0f, 2.0f);
          const auto v = random_vector(n_kv * nkv * d, rng);
          std::vector<float> out(n_q * nh * d);
          ref::attention(q.data(), k.data(), v.data(), out.data(), n_q, q_pos0, n_kv, nh, nkv, d);
          const auto want = attention_fp64(q, k, v, n_q, q_pos0, nh, nkv, d);
          double max_err = 0;
          for (size_t i = 0; i < out.size(); ++i) max_err = std::max(max_err, std::fabs(out[i] - want[i]));
          EXPECT_LE(max_err, kAttentionAbsTol) << "d " << d << " heads " << nh << "/" << nkv << " n_q " << n_q
                                               << " q_pos0 " << q_pos0;
        }
      }
    }
  }
}

TEST(RefOps, AttentionNeverReadsFutureKeys) {
  std::mt19937 rng(707);
  const int64_t d = 64, nh = 6, nkv = 2, n_q = 3, q_pos0 = 4, n_kv = q_pos0 + n_q;
  const auto q = random_vector(n_q * nh * d, rng);
  auto k = random_vector((n_kv + 2) * nkv * d, rng), v = random_vector((n_kv + 2) * nkv * d, rng);
  std::vector<float> a(n_q * nh * d), b(n_q * nh * d);
  ref::attention(q.data(), k.data(), v.data(), a.data(), n_q, q_pos0, n_kv, nh, nkv, d);
  // Changing the keys/values after each query's position (including two extra cache rows) changes nothing.
  for (int64_t t = q_pos0 + 1; t < n_kv + 2; ++t) {
    for (int64_t j = 0; j < nkv * d; ++j) {
      k[t * nkv * d + j] = 50.0f;
      v[t * nkv * d + j] = -50.0f;
    }
  }
  std::vector<float> q0(q.begin(), q.begin() + nh * d);
  ref::attention(q0.data(), k.data(), v.data(), b.data(), 1, q_pos0, n_kv + 2, nh, nkv, d);
  for (int64_t j = 0; j < nh * d; ++j) EXPECT_EQ(a[j], b[j]) << j;
}

TEST(RefOps, AttentionRejectsInconsistentShapes) {
  std::vector<float> buf(4 * 8 * 64, 0.5f), out(4 * 8 * 64);
  EXPECT_THROW(ref::attention(buf.data(), buf.data(), buf.data(), out.data(), 2, 3, 4, 8, 2, 64), Error);
  EXPECT_THROW(ref::attention(buf.data(), buf.data(), buf.data(), out.data(), 1, 0, 4, 6, 4, 64), Error);
}

TEST(RefLinear, InputQuantizerRoundsACopyOfTheInput) {
  std::mt19937 rng(808);
  const int64_t rows = 3, in = 37, out = 11;
  const auto x = random_vector(rows * in, rng);
  const auto w = random_vector(out * in, rng);
  ref::RefLinear lin("test.weight", out, in, std::make_shared<const std::vector<float>>(w));
  std::vector<float> plain(rows * out), quant(rows * out), want(rows * out);
  lin.forward(x.data(), rows, plain.data());
  std::vector<float> expect_plain(rows * out);
  ref::matmul_nt(x.data(), w.data(), expect_plain.data(), rows, out, in);
  EXPECT_EQ(plain, expect_plain);

  int64_t seen_rows = 0, seen_cols = 0;
  lin.set_input_quantizer([&](float* v, int64_t r, int64_t c) {
    seen_rows = r;
    seen_cols = c;
    for (int64_t i = 0; i < r * c; ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
  });
  const auto x_before = x;
  lin.forward(x.data(), rows, quant.data());
  EXPECT_EQ(x, x_before);
  EXPECT_EQ(seen_rows, rows);
  EXPECT_EQ(seen_cols, in);
  std::vector<float> xq(x.size());
  for (size_t i = 0; i < x.size(); ++i) xq[i] = bf16_to_f32(f32_to_bf16(x[i]));
  ref::matmul_nt(xq.data(), w.data(), want.data(), rows, out, in);
  EXPECT_EQ(quant, want);
  EXPECT_NE(quant, plain);
}

TEST(RefLinear, RejectsMismatchedShapes) {
  EXPECT_THROW(ref::RefLinear("w", 3, 4, std::make_shared<const std::vector<float>>(11, 1.0f)), Error);
  EXPECT_THROW(ref::RefLinear("w", 0, 4, std::make_shared<const std::vector<float>>()), Error);
  EXPECT_THROW(ref::RefLinear::from_tensor(Tensor::from_f32("v", {4}, {1, 2, 3, 4})), Error);
}

TEST(KvStore, F32ReadsBackWhatWasAppended) {
  std::mt19937 rng(909);
  const int64_t width = 3 * 64;
  auto store = ref::make_f32_kv_store(width);
  const auto k = random_vector(7 * width, rng), v = random_vector(7 * width, rng);
  store->append(k.data(), v.data(), 5);
  store->append(k.data() + 5 * width, v.data() + 5 * width, 1);
  store->append(k.data() + 6 * width, v.data() + 6 * width, 1);
  EXPECT_EQ(store->size(), 7);
  EXPECT_EQ(store->width(), width);
  std::vector<float> kr(6 * width), vr(6 * width);
  store->read_keys(6, kr.data());
  store->read_values(6, vr.data());
  EXPECT_TRUE(std::equal(kr.begin(), kr.end(), k.begin()));
  EXPECT_TRUE(std::equal(vr.begin(), vr.end(), v.begin()));
  EXPECT_THROW(store->read_keys(8, kr.data()), Error);
  EXPECT_THROW(ref::make_f32_kv_store(0), Error);
}

}  // namespace
}  // namespace futransformer

namespace futransformer::ref {
namespace {

TEST(RefOps, RopeFrequencyDivisorsDivideEachInverseFrequency) {
  RopeScaling plain;
  RopeScaling divided;
  divided.freq_divisors = {1.0, 2.0, 4.0, 8.0};
  const std::vector<float> a = rope_inv_freq(8, 10000.0, plain);
  const std::vector<float> b = rope_inv_freq(8, 10000.0, divided);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_FLOAT_EQ(b[i], static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / 8.0) /
                                             divided.freq_divisors[i]));
  divided.freq_divisors.pop_back();
  EXPECT_THROW(rope_inv_freq(8, 10000.0, divided), Error);
}

}  // namespace
}  // namespace futransformer::ref
