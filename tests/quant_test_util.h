// Helpers shared by the quantiser tests (CPU and GPU): random calibration windows, the per-layer output error
// that GPTQ minimises, byte comparison of packed INT4 weights, and error-message checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <random>
#include <span>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/formats/int4.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "ref/ref_model.h"
#include "tiny_llama.h"

namespace futransformer::test {

// `windows` windows of `tokens` uniformly random token ids below `vocab`.
inline quant::CalibrationSet random_calibration(int64_t windows, int64_t tokens, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  quant::CalibrationSet c;
  c.source = "random test windows";
  for (int64_t i = 0; i < windows; ++i) c.windows.push_back(random_token_ids(size_t(tokens), vocab, rng));
  return c;
}

// Relative L2 error of each quantised layer's output against the fp32 layer's, both fed the fp32 model's input of
// that layer on `windows` (held-out tokens), summed over layers (the quantity GPTQ minimises, per layer).
inline double layer_output_error(const Model& full, const Model& quantised,
                                 const std::vector<std::vector<int32_t>>& windows) {
  ref::RefModel a(full, {}), b(quantised, {});
  const int64_t h = full.config.hidden_size;
  double total = 0;
  for (const auto& w : windows) {
    const int64_t n = static_cast<int64_t>(w.size());
    std::vector<float> x(static_cast<size_t>(n * h));
    a.embed(w, x.data());
    for (int64_t i = 0; i < a.num_layers(); ++i) {
      std::vector<float> y = x;
      auto sa = a.make_kv_store(), sb = b.make_kv_store();
      ref::SequenceRows ra{0, n, 0, sa.get()}, rb{0, n, 0, sb.get()};
      a.run_layer(i, x.data(), n, std::span<const ref::SequenceRows>(&ra, 1));
      b.run_layer(i, y.data(), n, std::span<const ref::SequenceRows>(&rb, 1));
      total += relative_l2(y, x);
    }
  }
  return total;
}

// fn must throw futransformer::Error whose message contains every needle.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected futransformer::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

// The packed bytes, scales and zero-points of two INT4 weights are identical.
inline void expect_same_bytes(const formats::Int4Weight& a, const formats::Int4Weight& b, const std::string& what) {
  EXPECT_EQ(a.qweight, b.qweight) << what;
  EXPECT_EQ(a.scales, b.scales) << what;
  EXPECT_EQ(a.zeros, b.zeros) << what;
}

// Correlated calibration activations: x = z·A with a random mixing matrix A, and a few channels 8x larger — the
// structure of real LLM activations (shared directions, outlier channels) that makes GPTQ beat RTN.
inline std::vector<float> correlated_activations(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(k * k));
  for (float& v : a) v = nd(rng) / std::sqrt(static_cast<float>(k));
  for (int64_t i = 0; i < k; ++i) a[static_cast<size_t>(i * k + i)] += 0.5f;
  std::vector<float> z(static_cast<size_t>(n * k));
  for (float& v : z) v = nd(rng);
  std::vector<float> x(static_cast<size_t>(n * k), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < k; ++i) {
      const float zi = z[static_cast<size_t>(t * k + i)];
      for (int64_t j = 0; j < k; ++j) x[static_cast<size_t>(t * k + j)] += zi * a[static_cast<size_t>(i * k + j)];
    }
  for (int64_t c : {3, 41, 100}) {
    if (c >= k) continue;
    for (int64_t t = 0; t < n; ++t) x[static_cast<size_t>(t * k + c)] *= 8.0f;
  }
  return x;
}

// A [rows, cols] weight of N(0, 0.05²) values.
inline std::vector<float> random_weight(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = nd(rng);
  return w;
}

}  // namespace futransformer::test
