// Synthetic Llama checkpoints: real architectures (Llama-3.1 8B/70B shapes) with random BF16 weights at a
// realistic scale, written as Hugging Face directories, so the engines and quantisers can be exercised at full
// size without downloading weights. Optionally with outlier hidden channels like those of real Llama models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "futransformer/model.h"
#include "futransformer/tensor.h"

namespace futransformer {

// Hugging Face's default shard limit.
inline constexpr uint64_t kSyntheticMaxShardBytes = 5'000'000'000;

// "llama-3.1-8b", "llama-3.1-70b" (Meta's configs) or "tiny" (a 2-layer test model); Error lists the names.
ModelConfig synthetic_config(const std::string& name);
std::vector<std::string> synthetic_config_names();

// The `outlier_channels` hidden channels (sorted) and their scales that the rule in synthetic_model.cpp picks
// for `seed`. Fails if outlier_channels is negative or larger than hidden_size.
struct OutlierChannels {
  std::vector<int64_t> channels;
  std::vector<float> scales;  // same order, each in [20, 50]
};
OutlierChannels synthetic_outlier_channels(int64_t hidden_size, int outlier_channels, uint64_t seed);

// Writes config.json and BF16 safetensors (one model.safetensors, or shards of at most max_shard_bytes each
// with model.safetensors.index.json) to out_dir, generating one chunk of one tensor at a time. Creates out_dir;
// fails if out_dir/config.json exists or the disk lacks the space. Deterministic in (config, outliers, seed).
void write_synthetic_model(const ModelConfig& config, const std::string& out_dir, int outlier_channels,
                           uint64_t seed, uint64_t max_shard_bytes = kSyntheticMaxShardBytes);

// The tensor `name` exactly as write_synthetic_model writes it (BF16), held in memory; for tests and tools.
Tensor synthetic_tensor(const ModelConfig& config, const std::string& name, int outlier_channels, uint64_t seed);

}  // namespace futransformer
