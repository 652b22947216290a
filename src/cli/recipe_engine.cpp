#include "cli/recipe_engine.h"

#include <fstream>

#include "cli/progress.h"
#include "futransformer/error.h"
#include "futransformer/reference_engine.h"

namespace futransformer::cli {

void add_recipe_engine_options(CLI::App& sub, RecipeEngineArgs& a) {
  sub.add_option("--calibration", a.calibration,
                 "GPTQ calibration text (default: The Devil's Dictionary, see scripts/fetch_calibration.sh)");
  sub.add_option("--samples", a.samples, "GPTQ calibration windows")->capture_default_str()->check(CLI::Range(1, 4096));
  sub.add_option("--sample-tokens", a.sample_tokens, "Tokens per calibration window")
      ->capture_default_str()
      ->check(CLI::Range(8, 1 << 16));
  sub.add_option("--calibration-seed", a.seed, "Seed for the calibration windows' offsets")->capture_default_str();
  sub.add_flag("--act-order,!--no-act-order", a.act_order, "GPTQ with act-order, static groups (default on)");
  sub.add_flag("-q,--quiet", a.quiet, "No progress output");
}

void check_recipe_engine_args(const RecipeEngineArgs& a, const std::vector<PrecisionRecipe>& recipes) {
  bool gptq = false;
  for (const PrecisionRecipe& r : recipes) gptq = gptq || r.weights == WeightFormat::Int4Gptq;
  if (!gptq) return;
  const std::string path = a.calibration.empty() ? quant::default_calibration_path() : a.calibration;
  std::ifstream in(path);
  check(in.good(), path, ": GPTQ calibration text not found",
        a.calibration.empty() ? " (run scripts/fetch_calibration.sh, or pass --calibration FILE)" : "");
}

nlohmann::json recipe_engine_args_json(const RecipeEngineArgs& a) {
  return {{"calibration", a.calibration.empty() ? quant::default_calibration_path() : a.calibration},
          {"samples", a.samples},
          {"sample_tokens", a.sample_tokens},
          {"seed", a.seed},
          {"act_order", a.act_order},
          {"gptq_device", quant::gptq_device_name(a.gptq_device)}};
}

std::unique_ptr<Engine> RecipeEngineFactory::make(const PrecisionRecipe& recipe, int64_t max_sequence_length) {
  if (!recipe.quantises_weights())
    return make_reference_engine(model_, quant::reference_options(recipe, max_sequence_length));
  return make_reference_engine(quantised(recipe).model, quant::reference_options(recipe, max_sequence_length));
}

const quant::QuantizedModel& RecipeEngineFactory::quantised(const PrecisionRecipe& recipe) {
  check(recipe.quantises_weights(), "recipe ", recipe.name(), ": full-precision weights are not quantised");
  PrecisionRecipe weights_only = recipe;
  weights_only.activations = ActivationFormat::Fp32;
  weights_only.kv.reset();
  const std::string key = weights_only.name();
  auto it = quantised_.find(key);
  if (it == quantised_.end()) {
    quant::QuantizeOptions q;
    q.recipe = weights_only;
    q.calibration_path = args_.calibration;
    q.samples = args_.samples;
    q.sample_tokens = args_.sample_tokens;
    q.seed = args_.seed;
    q.act_order = args_.act_order;
    q.gptq_device = args_.gptq_device;
    ProgressLine progress(!args_.quiet);
    it = quantised_.emplace(key, quant::quantize_model(model_, tokenizer_, q, progress.callback())).first;
    progress.finish();
  }
  return it->second;
}

bool runs_as_fp8_prefill(const PrecisionRecipe& recipe) { return recipe.weights == WeightFormat::Fp8; }

PrecisionRecipe fp8_prefill_decode_half(const PrecisionRecipe& recipe) {
  PrecisionRecipe d;
  d.kv = recipe.kv;
  d.head = recipe.head;
  return d;
}

CudaEngineOptions recipe_cuda_engine_options(const PrecisionRecipe& recipe, const CudaEngineOptions& base) {
  CudaEngineOptions o =
      cuda_engine_options(runs_as_fp8_prefill(recipe) ? fp8_prefill_decode_half(recipe) : recipe, base);
  // act-fp8-block-bf16 names the FP8 prefill whose down input is quantised per 128 channels.
  if (runs_as_fp8_prefill(recipe) && recipe.activations == ActivationFormat::Fp8BlockOverBf16)
    o.fp8_block_swiglu = true;
  return o;
}

std::unique_ptr<CudaEngine> RecipeEngineFactory::make_cuda(const PrecisionRecipe& recipe,
                                                           const CudaEngineOptions& base) {
  const CudaEngineOptions o = recipe_cuda_engine_options(recipe, base);
  if (runs_as_fp8_prefill(recipe)) {
    const PrecisionRecipe decode = fp8_prefill_decode_half(recipe);
    if (decode.quantises_weights()) return make_cuda_engine(quantised(decode), quantised(recipe), o);
    if (!full_) {
      full_ = std::make_unique<quant::QuantizedModel>();
      full_->model = model_;
    }
    return make_cuda_engine(*full_, quantised(recipe), o);
  }
  if (recipe.quantises_weights()) return make_cuda_engine(quantised(recipe), o);
  return make_cuda_engine(model_, o);
}

nlohmann::json RecipeEngineFactory::quantisation_records() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, q] : quantised_) j[name] = q.recipe_json;
  return j;
}

}  // namespace futransformer::cli
