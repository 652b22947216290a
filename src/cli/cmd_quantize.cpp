// `futransformer quantize`: a model in, a quantised checkpoint directory out (GPTQ/RTN INT4 or FP8 projections,
// optionally an INT4 LM head).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/device_choice.h"
#include "cli/progress.h"
#include "futransformer/error.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"
#include "futransformer/tokenizer.h"

namespace futransformer::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct QuantizeArgs {
  std::string model;
  std::string out;
  std::string weights = "int4-gptq";
  std::string group_size = "128";
  std::string recipe;
  std::string head = "full";
  std::string tokenizer;
  std::string calibration;
  std::string device = "auto";
  int64_t samples = 32;
  int64_t sample_tokens = 512;
  uint64_t seed = 0;
  double damp = 0.01;
  bool act_order = true;
  bool quiet = false;
};

PrecisionRecipe recipe_from_args(const QuantizeArgs& a, bool weights_given, bool group_given, bool head_given) {
  if (!a.recipe.empty()) {
    check(!weights_given && !group_given && !head_given, "--recipe gives the weight format, group size and head ",
          "format (head-int4); drop --weights, --group-size and --head");
    return PrecisionRecipe::parse(a.recipe);
  }
  std::string text = a.weights;
  if (a.weights != "fp8") {
    text += "-g" + a.group_size;
  } else {
    check(!group_given, "--group-size applies to int4 weights; fp8 has one scale per output channel");
  }
  if (a.head == "int4") text += "+head-int4";
  return PrecisionRecipe::parse(text);
}

int run_quantize(const QuantizeArgs& a, bool weights_given, bool group_given, bool head_given) {
  const PrecisionRecipe recipe = recipe_from_args(a, weights_given, group_given, head_given);
  check(recipe.quantises_weights(), "recipe ", recipe.name(), " quantises no weights; nothing to write");
  const auto t0 = std::chrono::steady_clock::now();
  const Model model = load_model(a.model);
  const double load_s = seconds_since(t0);
  check(model.format != "quantized", a.model, ": is already a quantised checkpoint; quantise its source model");
  quant::QuantizeOptions opt;
  opt.recipe = recipe;
  opt.calibration_path = a.calibration;
  opt.samples = a.samples;
  opt.sample_tokens = a.sample_tokens;
  opt.seed = a.seed;
  opt.damp_percent = a.damp;
  opt.act_order = a.act_order;

  std::unique_ptr<Tokenizer> tokenizer;
  if (recipe.weights == WeightFormat::Int4Gptq) {
    // The calibration forward, the Hessians and GPTQ all run on the chosen device.
    opt.gptq_device = choose_backend(a.device) == Backend::Cuda ? quant::GptqDevice::Cuda : quant::GptqDevice::Cpu;
    if (!a.quiet)
      std::fprintf(stderr, "GPTQ on %s (calibration forward, Hessians and column loop)\n",
                   quant::gptq_device_name(opt.gptq_device));
    tokenizer = load_tokenizer_for_model(model, a.tokenizer);
  }
  ProgressLine progress(!a.quiet);
  const quant::QuantizedModel q =
      tokenizer ? quant::quantize_model(model, *tokenizer, opt, progress.callback())
                : quant::quantize_model(model, quant::CalibrationSet{}, opt, progress.callback());
  progress.finish();
  const auto w0 = std::chrono::steady_clock::now();
  quant::write_quantized_checkpoint(q, a.out, a.tokenizer);
  const double write_s = seconds_since(w0);
  const double s = seconds_since(t0);
  if (!a.quiet) {
    const quant::QuantizeTimings& t = q.timings;
    std::fprintf(stderr,
                 "times (s): load %.2f, calibration text %.2f, weight upload %.2f, calibration forward %.2f, "
                 "Hessians %.2f, quantise %.2f, other %.2f, write %.2f, total %.2f\n",
                 load_s, t.calibration_text_s, t.weight_load_s, t.calibration_forward_s, t.hessian_s, t.gptq_s,
                 t.total_s - t.calibration_text_s - t.weight_load_s - t.calibration_forward_s - t.hessian_s - t.gptq_s,
                 write_s, s);
  }
  const size_t heads = recipe.head == HeadFormat::Int4 ? 1 : 0;
  std::printf("wrote %s (%s, %zu projections%s) in %.1f s\n", a.out.c_str(), recipe.name().c_str(),
              q.int4.size() + q.fp8.size() - heads, heads ? " + INT4 LM head" : "", s);
  return 0;
}

}  // namespace

Command add_quantize_command(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "Quantise a model's projections and write a quantised checkpoint");
  sub->add_option("-m,--model", args->model, "HF directory, .gguf file, or llama2.c .bin")->required();
  sub->add_option("-o,--out", args->out, "Output directory (created; files of the same names are replaced)")
      ->required();
  CLI::Option* weights = sub->add_option("--weights", args->weights, "Weight format")
                             ->capture_default_str()
                             ->check(CLI::IsMember({"int4-gptq", "int4-rtn", "fp8"}));
  CLI::Option* group = sub->add_option("--group-size", args->group_size,
                                       "INT4 group: 32, 64, 128, or ch (per-channel); must divide every input size")
                           ->capture_default_str()
                           ->check(CLI::IsMember({"32", "64", "128", "ch"}));
  sub->add_option("--recipe", args->recipe,
                  "A whole precision recipe instead of --weights/--group-size, e.g. int4-gptq-g64-asym or "
                  "fp8+act-fp8+kv-fp8 (activation and KV formats are recorded and applied when the checkpoint runs)");
  CLI::Option* head = sub->add_option("--head", args->head,
                                      "LM head: full (as stored) or int4 (RTN, symmetric, BF16 scales, group 128 or "
                                      "the largest of 64, 32 dividing the hidden size; a tied head gets its own copy)")
                          ->capture_default_str()
                          ->check(CLI::IsMember({"full", "int4"}));
  sub->add_option("--tokenizer", args->tokenizer, "Tokenizer file, if the model has none of its own (copied along)");
  sub->add_option("--calibration", args->calibration,
                  "GPTQ calibration text (default: The Devil's Dictionary, from scripts/fetch_calibration.sh)");
  sub->add_option("--device", args->device,
                  "Where GPTQ's calibration forward, Hessians and column loop run: cuda, cpu, or auto (cuda when this "
                  "build has CUDA and a Hopper GPU is present)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  sub->add_option("--samples", args->samples, "GPTQ calibration windows")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--sample-tokens", args->sample_tokens, "Tokens per calibration window")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  sub->add_option("--seed", args->seed, "Seed for the calibration windows' offsets")->capture_default_str();
  sub->add_option("--damp", args->damp, "GPTQ damping, a fraction of the mean Hessian diagonal")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--act-order,!--no-act-order", args->act_order,
                "GPTQ: quantise columns by descending Hessian diagonal, static groups (default on)");
  sub->add_flag("-q,--quiet", args->quiet, "No progress line on stderr");
  return {sub, [args, weights, group, head] {
            return run_quantize(*args, weights->count() > 0, group->count() > 0, head->count() > 0);
          }};
}

}  // namespace futransformer::cli
