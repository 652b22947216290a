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

// The sampler's choice for one row given its uniform draw u in [0, 1) (Sampler::sample draws u from its generator
// and calls this; the GPU sampler, futransformer/cuda/sampling.h, makes the same choice from the same u):
//   temperature 0: argmax (u unused). Otherwise p[i] = exp((double(logits[i]) - max) / T) in fp64 (the exp of
//   src/engine/sampling_exp.h, bit-identical on host and GPU); tokens ordered by p descending, equal p by id
//   ascending; keep the first min(top_k, n) (top_k > 0); if top_p < 1, keep the shortest prefix whose running sum
//   (fp64, in that order) reaches top_p * (sum of the kept); then the first token whose running sum exceeds
//   u * (sum of the kept). Throws Error for invalid params (as Sampler's constructor), u outside [0, 1), empty
//   logits, a NaN logit, or (temperature > 0) a largest logit that is not finite.
int32_t sample_with_uniform(std::span<const float> logits, const SamplingParams& params, double u);

}  // namespace futransformer
