#include "futransformer/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/sampling_exp.h"
#include "futransformer/error.h"

namespace futransformer {

namespace {

// NaN or +inf logits have no meaningful probability; -inf is a masked token and is allowed.
void check_logits(std::span<const float> logits) {
  check(!logits.empty(), "sampling: empty logits");
  for (size_t i = 0; i < logits.size(); ++i) {
    check(!std::isnan(logits[i]), "sampling: logits[", i, "] is NaN");
  }
}

// A uniform double in [0, 1) from the top 53 bits, so a seed gives the same draws with every standard library
// (std::uniform_real_distribution's algorithm is implementation-defined).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

void check_params(const SamplingParams& params) {
  check(std::isfinite(params.temperature) && params.temperature >= 0.0f, "sampling: temperature ", params.temperature,
        " must be finite and >= 0");
  check(params.top_p > 0.0f && params.top_p <= 1.0f, "sampling: top_p ", params.top_p, " must be in (0, 1]");
  check(params.top_k >= 0, "sampling: top_k ", params.top_k, " must be >= 0 (0 disables it)");
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  check_logits(logits);
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { check_params(params); }

int32_t Sampler::sample(std::span<const float> logits) {
  // Greedy draws nothing, so a seeded sampler's sequence is the same as before the draw became an argument.
  if (params_.temperature == 0.0f) return argmax(logits);
  return sample_with_uniform(logits, params_, uniform01(rng_));
}

int32_t sample_with_uniform(std::span<const float> logits, const SamplingParams& params, double u01) {
  check_params(params);
  check(u01 >= 0.0 && u01 < 1.0, "sampling: the uniform draw ", u01, " must be in [0, 1)");
  if (params.temperature == 0.0f) return argmax(logits);
  check_logits(logits);
  const size_t n = logits.size();
  const float mx = *std::max_element(logits.begin(), logits.end());
  check(std::isfinite(mx), "sampling: the largest logit is ", mx, "; expected a finite value");

  // Unnormalised softmax(logits / T) in fp64; the cuts below only need ratios. The largest logit's p is exactly 1.
  std::vector<double> prob(n);
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  for (size_t i = 0; i < n; ++i)
    prob[i] = sampling_detail::sampling_exp((static_cast<double>(logits[i]) - mx) * inv_t);

  // Tokens by decreasing probability; ties keep the lower id first so the order (and the draw) is deterministic.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });

  size_t keep = n;
  if (params.top_k > 0) keep = std::min(keep, static_cast<size_t>(params.top_k));
  if (params.top_p < 1.0f) {
    // Nucleus over the distribution that survives top-k (renormalised, as HF chains the two warpers).
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += prob[order[i]];
    const double target = static_cast<double>(params.top_p) * total;
    double mass = 0.0;
    size_t cut = 0;
    while (cut < keep) {
      mass += prob[order[cut++]];
      if (mass >= target) break;
    }
    keep = cut;
  }

  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += prob[order[i]];
  const double u = u01 * total;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob[order[i]];
    if (u < acc) return order[i];
  }
  return order[keep - 1];  // u within rounding of the total
}

}  // namespace futransformer
