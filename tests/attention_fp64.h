// Test helpers shared by the KV-format tests: fp64 attention of one GQA group and the relative L2 error metric.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace futransformer::test {

// n_heads query heads (q: [n_heads, head_dim]) over the keys/values of one KV head (k, v: [tokens, head_dim]), in
// fp64: softmax(q·kᵀ / sqrt(head_dim)) · v, with max subtraction.
inline std::vector<double> attention_fp64(const std::vector<float>& q, const std::vector<float>& k,
                                          const std::vector<float>& v, int64_t n_heads, int64_t head_dim) {
  const int64_t tokens = static_cast<int64_t>(k.size()) / head_dim;
  std::vector<double> out(static_cast<size_t>(n_heads * head_dim), 0.0), p(static_cast<size_t>(tokens));
  for (int64_t h = 0; h < n_heads; ++h) {
    double mx = -INFINITY, z = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      double s = 0;
      for (int64_t i = 0; i < head_dim; ++i)
        s += double(q[static_cast<size_t>(h * head_dim + i)]) * k[static_cast<size_t>(t * head_dim + i)];
      p[static_cast<size_t>(t)] = s / std::sqrt(double(head_dim));
      mx = std::max(mx, p[static_cast<size_t>(t)]);
    }
    for (auto& e : p) z += (e = std::exp(e - mx));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < head_dim; ++i)
        out[static_cast<size_t>(h * head_dim + i)] += p[static_cast<size_t>(t)] / z * v[static_cast<size_t>(t * head_dim + i)];
  }
  return out;
}

// ‖got − want‖₂ / ‖want‖₂ in double.
template <typename A, typename B>
double rel_l2(const A& got, const B& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - double(want[i])) * (double(got[i]) - double(want[i]));
    den += double(want[i]) * double(want[i]);
  }
  return std::sqrt(num / den);
}

}  // namespace futransformer::test
