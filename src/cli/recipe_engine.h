// Building a reference engine for each of several precision recipes (ppl, report), quantising each distinct weight
// format once: recipes that differ only in activations or KV cache share the quantised weights.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "futransformer/engine.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"
#include "futransformer/tokenizer.h"

namespace futransformer::cli {

struct RecipeEngineArgs {
  std::string calibration;   // "" = the default calibration text
  int64_t samples = 32;
  int64_t sample_tokens = 512;
  uint64_t seed = 0;
  bool act_order = true;
  bool quiet = false;
};

void add_recipe_engine_options(CLI::App& sub, RecipeEngineArgs& args);
// Fails before any work if a GPTQ recipe needs a calibration file that cannot be read.
void check_recipe_engine_args(const RecipeEngineArgs& args, const std::vector<PrecisionRecipe>& recipes);
nlohmann::json recipe_engine_args_json(const RecipeEngineArgs& args);

class RecipeEngineFactory {
 public:
  RecipeEngineFactory(const Model& model, const Tokenizer& tokenizer, const RecipeEngineArgs& args)
      : model_(model), tokenizer_(tokenizer), args_(args) {}
  std::unique_ptr<Engine> make(const PrecisionRecipe& recipe, int64_t max_sequence_length);
  // The recipe's weights quantised (once per weight format; its activation and KV parts are ignored), e.g. for a
  // CUDA engine. Error for full-precision weights (there is nothing to quantise).
  const quant::QuantizedModel& quantised(const PrecisionRecipe& recipe);
  // What quantising recorded (GPTQ losses, calibration hash) per weight format, for reports.
  nlohmann::json quantisation_records() const;

 private:
  const Model& model_;
  const Tokenizer& tokenizer_;
  RecipeEngineArgs args_;
  std::map<std::string, quant::QuantizedModel> quantised_;  // by weight-format name
};

}  // namespace futransformer::cli
