// Building a reference engine for each of several precision recipes (ppl, report), quantising each distinct weight
// format once: recipes that differ only in activations or KV cache share the quantised weights.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "futransformer/cuda_engine.h"
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
  // Where GPTQ's Hessians and column loop run (the report sets Cuda when it runs on the GPU).
  quant::GptqDevice gptq_device = quant::GptqDevice::Cpu;
};

void add_recipe_engine_options(CLI::App& sub, RecipeEngineArgs& args);
// Fails before any work if a GPTQ recipe needs a calibration file that cannot be read.
void check_recipe_engine_args(const RecipeEngineArgs& args, const std::vector<PrecisionRecipe>& recipes);
nlohmann::json recipe_engine_args_json(const RecipeEngineArgs& args);

// On the GPU an FP8 recipe is FP8 prefill: its FP8 weights serve every prompt chunk (act-fp8-bf16's roundings; with
// act-fp8-block-bf16, CudaEngineOptions::fp8_block_swiglu: the down input per 128 channels) beside a decode copy of the checkpoint (full weights, the recipe's KV cache and LM head) that serves
// decode steps. Quality windows run as prompt chunks, so they price the FP8 prefill.
bool runs_as_fp8_prefill(const PrecisionRecipe& recipe);
// The decode half of an FP8-prefill recipe: full weights, the recipe's KV cache and LM head.
PrecisionRecipe fp8_prefill_decode_half(const PrecisionRecipe& recipe);
// The CUDA engine options of `recipe` (of its decode half for FP8 prefill) on top of `base`; Error where the GPU
// cannot run it.
CudaEngineOptions recipe_cuda_engine_options(const PrecisionRecipe& recipe, const CudaEngineOptions& base);

class RecipeEngineFactory {
 public:
  RecipeEngineFactory(const Model& model, const Tokenizer& tokenizer, const RecipeEngineArgs& args)
      : model_(model), tokenizer_(tokenizer), args_(args) {}
  std::unique_ptr<Engine> make(const PrecisionRecipe& recipe, int64_t max_sequence_length);
  const RecipeEngineArgs& args() const { return args_; }
  // The recipe's weights quantised (once per weight format; its activation and KV parts are ignored), e.g. for a
  // CUDA engine. Error for full-precision weights (there is nothing to quantise).
  const quant::QuantizedModel& quantised(const PrecisionRecipe& recipe);
  // The CUDA engine that runs `recipe` on the model (recipe_cuda_engine_options on top of `base`): the checkpoint in
  // BF16, the quantised weights, or FP8 prefill beside a decode copy.
  std::unique_ptr<CudaEngine> make_cuda(const PrecisionRecipe& recipe, const CudaEngineOptions& base);
  // What quantising recorded (GPTQ losses, calibration hash) per weight format, for reports.
  nlohmann::json quantisation_records() const;

 private:
  const Model& model_;
  const Tokenizer& tokenizer_;
  RecipeEngineArgs args_;
  std::map<std::string, quant::QuantizedModel> quantised_;  // by weight-format name
  std::unique_ptr<quant::QuantizedModel> full_;              // the checkpoint as a "full" QuantizedModel, made once
};

}  // namespace futransformer::cli
