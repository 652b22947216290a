// Next-token sampling: greedy (temperature 0), temperature, top-k, top-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace futransformer {

struct SamplingParams {
  float temperature = 0.0f;   // 0: greedy (argmax, first index on ties)
  int32_t top_k = 0;          // 0: no top-k cut
  float top_p = 1.0f;         // 1: no nucleus cut
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // throws Error on temperature < 0, top_p outside (0, 1], top_k < 0
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace futransformer
