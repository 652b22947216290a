// `futransformer make-model`: a Hugging Face checkpoint with random weights at a real model's shapes, for speed
// work where the real weights can't be had.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "futransformer/io/synthetic.h"
#include "futransformer/model.h"

namespace futransformer::cli {
namespace {

struct MakeModelArgs {
  std::string config;
  std::string out;
  int outlier_channels = 0;
  uint64_t seed = 0;
};

int run_make_model(const MakeModelArgs& a) {
  const ModelConfig config = synthetic_config(a.config);
  const auto t0 = std::chrono::steady_clock::now();
  write_synthetic_model(config, a.out, a.outlier_channels, a.seed);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s (%s, %d outlier channels, seed %llu) in %.1f s\n", a.out.c_str(), a.config.c_str(),
              a.outlier_channels, static_cast<unsigned long long>(a.seed), s);
  return 0;
}

}  // namespace

Command add_make_model_command(CLI::App& app) {
  auto args = std::make_shared<MakeModelArgs>();
  CLI::App* sub = app.add_subcommand("make-model", "Write a synthetic HF checkpoint with a real model's shapes");
  sub->add_option("--config", args->config, "llama-3.1-8b, llama-3.1-70b or tiny")
      ->required()
      ->check(CLI::IsMember({"llama-3.1-8b", "llama-3.1-70b", "tiny"}));
  sub->add_option("--out", args->out, "Output directory (created)")->required();
  sub->add_option("--outlier-channels", args->outlier_channels,
                  "Hidden channels given large magnitudes, as real Llama activations have")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  sub->add_option("--seed", args->seed, "Random seed")->capture_default_str();
  return {sub, [args] { return run_make_model(*args); }};
}

}  // namespace futransformer::cli
