// `futransformer ppl`: perplexity of one model under several precision recipes, one table row per recipe with its
// difference from full precision, plus the same as JSON.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_choice.h"
#include "cli/recipe_engine.h"
#include "futransformer/error.h"
#include "futransformer/eval/device_quality.h"
#include "futransformer/eval/perplexity.h"
#include "futransformer/model.h"
#include "futransformer/progress.h"
#include "futransformer/recipe.h"
#include "futransformer/tokenizer.h"

namespace futransformer::cli {
namespace {

struct PplArgs {
  std::string model;
  std::string tokenizer;
  std::string data;
  int64_t ctx = 2048;
  int64_t max_windows = 0;
  std::vector<std::string> configs{"full"};
  std::string json_path;
  std::string device = "cpu";
  RecipeEngineArgs calibration;
};

std::vector<std::string> split_configs(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const std::string& item : in) {
    std::stringstream ss(item);
    std::string part;
    while (std::getline(ss, part, ','))
      if (!part.empty()) out.push_back(part);
  }
  return out;
}

int run_ppl(const PplArgs& a) {
  // Every flag and file is checked before any work starts.
  std::vector<PrecisionRecipe> recipes;
  for (const std::string& c : split_configs(a.configs)) recipes.push_back(PrecisionRecipe::parse(c));
  check(!recipes.empty(), "--configs: no configuration given");
  const std::string text = eval::read_eval_text(a.data);
  const Model model = load_model(a.model);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer_for_model(model, a.tokenizer);
  check_recipe_engine_args(a.calibration, recipes);
  const Backend backend = choose_backend(a.device);
  if (backend == Backend::Cuda)
    for (const PrecisionRecipe& r : recipes) {
      try {
        recipe_cuda_engine_options(r, CudaEngineOptions{});
      } catch (const Error& e) {
        fail("--device cuda: ", e.what());
      }
    }

  const std::vector<int32_t> tokens = tokenizer->encode(text);
  eval::PerplexityOptions opt;
  opt.ctx = a.ctx;
  opt.max_windows = a.max_windows;
  const int64_t windows = eval::perplexity_windows(static_cast<int64_t>(tokens.size()), opt);
  const int64_t available = static_cast<int64_t>(tokens.size()) / a.ctx;
  std::fprintf(stderr, "%s: %zu tokens, %lld windows of %lld (of %lld available)\n", a.data.c_str(), tokens.size(),
               static_cast<long long>(windows), static_cast<long long>(a.ctx), static_cast<long long>(available));

  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::pair<std::string, eval::PerplexityResult>> results;
  RecipeEngineFactory factory(model, *tokenizer, a.calibration);
  for (const PrecisionRecipe& recipe : recipes) {
    ProgressBar bar("ppl " + recipe.name(), windows * (a.ctx - 1), !a.calibration.quiet);
    auto progress = [&](int64_t done, int64_t) { bar.update(done); };
    eval::PerplexityResult r;
    if (backend == Backend::Cuda) {
      // The GPU's own rounding (BF16 activations; FP8 recipes as FP8 prefill), the logits kept on the device.
      CudaEngineOptions base;
      base.max_sequence_length = a.ctx;
      base.max_sequences = 1;
      std::unique_ptr<CudaEngine> engine = factory.make_cuda(recipe, base);
      r = eval::evaluate_perplexity_on_device(*engine, tokens, opt, progress);
    } else {
      std::unique_ptr<Engine> engine = factory.make(recipe, a.ctx);
      r = eval::evaluate_perplexity(*engine, tokens, opt, progress);
    }
    bar.finish();
    results.emplace_back(recipe.name(), r);
  }

  const double* full = nullptr;
  for (const auto& [name, r] : results)
    if (name == "full") full = &r.ppl;
  std::printf("\nperplexity of %s on %s: ctx %lld, %lld windows (%lld predicted tokens each row)\n", a.model.c_str(),
              a.data.c_str(), static_cast<long long>(a.ctx), static_cast<long long>(windows),
              static_cast<long long>(results.front().second.predicted_tokens));
  std::printf("%-40s %10s %12s %10s\n", "configuration", "ppl", "vs full", "time s");
  for (const auto& [name, r] : results) {
    char delta[64] = "-";
    if (full != nullptr && name != "full")
      std::snprintf(delta, sizeof(delta), "%+.4f (%+.2f%%)", r.ppl - *full, 100.0 * (r.ppl / *full - 1.0));
    std::printf("%-40s %10.4f %12s %10.1f\n", name.c_str(), r.ppl, delta, r.seconds);
    nlohmann::json row = {{"config", name},           {"ppl", r.ppl},         {"mean_nll", r.mean_nll},
                          {"windows", r.windows},     {"predicted_tokens", r.predicted_tokens},
                          {"seconds", r.seconds}};
    if (full != nullptr) row["delta_vs_full"] = r.ppl - *full;
    rows.push_back(row);
  }
  if (!a.json_path.empty()) {
    nlohmann::json j = {{"model", a.model},
                        {"data", a.data},
                        {"ctx", a.ctx},
                        {"device", backend_name(backend)},
                        {"windows", windows},
                        {"windows_available", available},
                        {"text_tokens", tokens.size()},
                        {"protocol", "lines joined with \\n\\n, tokenised once without BOS, non-overlapping windows"},
                        {"calibration", recipe_engine_args_json(a.calibration)},
                        {"quantisation", factory.quantisation_records()},
                        {"rows", rows}};
    std::ofstream out(a.json_path);
    check(out.good(), a.json_path, ": cannot write JSON");
    out << j.dump(2) << "\n";
    check(out.good(), a.json_path, ": write failed");
    std::fprintf(stderr, "wrote %s\n", a.json_path.c_str());
  }
  return 0;
}

}  // namespace

Command add_ppl_command(CLI::App& app) {
  auto args = std::make_shared<PplArgs>();
  CLI::App* sub = app.add_subcommand("ppl", "Perplexity under several precision recipes (WikiText-2 protocol)");
  sub->add_option("-m,--model", args->model, "HF directory, .gguf file, llama2.c .bin, or quantised checkpoint")
      ->required();
  sub->add_option("--data", args->data, "Evaluation text (e.g. wiki.test.raw)")->required();
  sub->add_option("--tokenizer", args->tokenizer, "Tokenizer file, if the model has none of its own");
  sub->add_option("--ctx", args->ctx, "Window length in tokens")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  sub->add_option("--max-windows", args->max_windows, "Evaluate at most this many windows (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--configs", args->configs,
                  "Precision recipes, comma-separated: full, fp8+act-fp8, int4-rtn-g128, int4-gptq-g64+kv-int4, ...")
      ->capture_default_str();
  sub->add_option("--json", args->json_path, "Also write the table as JSON here");
  sub->add_option("--device", args->device,
                  "cpu (the fp32 reference engine), cuda (the CUDA engine: BF16 activations, FP8 recipes as FP8 "
                  "prefill, logits scored on the GPU) or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  add_recipe_engine_options(*sub, args->calibration);
  return {sub, [args] { return run_ppl(*args); }};
}

}  // namespace futransformer::cli
