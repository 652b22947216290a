// `futransformer generate`: prompt in, continuation out (streamed), like llama.cpp's llama-cli.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "cli/commands.h"
#include "cli/device_choice.h"
#include "cli/progress.h"
#include "futransformer/cuda_engine.h"
#include "futransformer/engine.h"
#include "futransformer/error.h"
#include "futransformer/generate.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"
#include "futransformer/reference_engine.h"
#include "futransformer/tokenizer.h"

namespace futransformer::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  int64_t max_new_tokens = 128;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int32_t top_k = 40;
  int64_t seed = -1;
  std::string device = "auto";
  std::string recipe;
  bool no_bos = false;
  bool ignore_eos = false;
  bool quiet = false;
};

int run_generate(const GenerateArgs& a) {
  const Backend backend = choose_backend(a.device);
  const auto t_load = std::chrono::steady_clock::now();
  // A quantised checkpoint runs with the recipe it was made with; --recipe quantises a full model in memory.
  quant::QuantizedModel q;
  if (quant::is_quantized_checkpoint(a.model)) {
    q = quant::load_quantized_checkpoint(a.model);
    check(a.recipe.empty(), a.model, ": is already quantised (recipe ", q.recipe.name(), "); --recipe needs a ",
          "full-precision model");
  } else {
    q.model = load_model(a.model);
    if (!a.recipe.empty()) q.recipe = PrecisionRecipe::parse(a.recipe);
  }
  const PrecisionRecipe recipe = q.recipe;
  // Recipe parts the GPU does not run are refused before any quantising.
  const CudaEngineOptions cuda_options =
      backend == Backend::Cuda ? cuda_engine_options(recipe) : CudaEngineOptions{};
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer_for_model(q.model, a.tokenizer);
  check(tokenizer->vocab_size() <= q.model.config.vocab_size, a.model, ": tokenizer has ", tokenizer->vocab_size(),
        " tokens but the model's vocabulary has only ", q.model.config.vocab_size);
  if (!a.recipe.empty() && recipe.quantises_weights()) {
    quant::QuantizeOptions qopt;  // GPTQ with the default calibration text and settings
    qopt.recipe = recipe;
    ProgressLine progress(!a.quiet);
    q = quant::quantize_model(q.model, *tokenizer, qopt, progress.callback());
    progress.finish();
  }

  std::vector<int32_t> prompt;
  const bool bos = !a.no_bos && tokenizer->add_bos() && tokenizer->bos_id() >= 0;
  if (bos) prompt.push_back(tokenizer->bos_id());
  const std::vector<int32_t> text_ids = tokenizer->encode(a.prompt, /*parse_special=*/true);
  prompt.insert(prompt.end(), text_ids.begin(), text_ids.end());
  check(!prompt.empty(), "the prompt is empty and the tokenizer has no BOS token; give --prompt TEXT");

  std::unique_ptr<Engine> engine;
  std::string engine_desc = backend_name(backend);
  if (backend == Backend::Cuda) {
    std::unique_ptr<CudaEngine> cuda_engine = make_cuda_engine(q, cuda_options);
    engine_desc = "cuda: " + cuda_engine->description();
    engine = std::move(cuda_engine);
  } else {
    engine = make_engine(backend, q.model, quant::reference_options(recipe));
  }
  check(static_cast<int64_t>(prompt.size()) < engine->max_sequence_length(), "the prompt has ", prompt.size(),
        " tokens; this model's context is ", engine->max_sequence_length());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.sampling.temperature = a.temperature;
  opt.sampling.top_p = a.top_p;
  opt.sampling.top_k = a.top_k;
  opt.sampling.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  opt.stop_at_eos = !a.ignore_eos;

  // Echo the prompt as the tokenizer reads it back (llama.cpp does the same), then stream the continuation.
  std::string echoed;
  for (size_t i = bos ? 1 : 0; i < prompt.size(); ++i) echoed += tokenizer->piece(i ? prompt[i - 1] : -1, prompt[i]);
  std::fwrite(echoed.data(), 1, echoed.size(), stdout);
  std::fflush(stdout);

  int32_t prev = prompt.back();
  const auto t_gen = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point t_first{};
  int64_t produced = 0;
  generate(
      *engine, 0, prompt, opt,
      [&](int32_t tok) {
        if (produced++ == 0) t_first = std::chrono::steady_clock::now();
        if (!(opt.stop_at_eos && tokenizer->is_end_of_generation(tok))) {
          const std::string piece = tokenizer->piece(prev, tok);
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
        prev = tok;
        return true;
      },
      [&](int32_t tok) { return tokenizer->is_end_of_generation(tok); });
  std::fputc('\n', stdout);
  const auto t_end = std::chrono::steady_clock::now();
  if (!a.quiet) {
    const double prefill_s = std::chrono::duration<double>(t_first - t_gen).count();
    const double decode_s = std::chrono::duration<double>(t_end - t_first).count();
    std::fprintf(stderr,
                 "\n[%s engine, %s] load %.2f s | prompt %zu tokens, first token after %.1f ms | %lld new tokens, "
                 "%.1f tok/s decode | seed %llu\n",
                 engine_desc.c_str(), recipe.name().c_str(), load_s, prompt.size(), prefill_s * 1e3, static_cast<long long>(produced),
                 produced > 1 ? static_cast<double>(produced - 1) / decode_s : 0.0,
                 static_cast<unsigned long long>(opt.sampling.seed));
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Continue a prompt with a model");
  sub->add_option("-m,--model", args->model, "HF directory, .gguf file, or llama2.c .bin (with --tokenizer)")
      ->required();
  sub->add_option("-p,--prompt", args->prompt, "Prompt text")->required();
  sub->add_option("--tokenizer", args->tokenizer,
                  "Tokenizer file (tokenizer.json, tiktoken tokenizer.model, or llama2.c tokenizer.bin)");
  sub->add_option("-n,--max-new-tokens", args->max_new_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--temperature,--temp", args->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-p", args->top_p, "Nucleus sampling mass (1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--top-k", args->top_k, "Keep the k most likely tokens (0 = off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("-s,--seed", args->seed, "Random seed (-1 = random, printed at the end)")->capture_default_str();
  sub->add_option("--device", args->device, "cpu, cuda, or auto (cuda on a Hopper GPU, else cpu)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--recipe", args->recipe,
                  "Run a precision recipe, quantising in memory first (GPTQ calibrates on the default text), e.g. "
                  "fp8+act-fp8+kv-int4-hadamard or int4-gptq-g128+kv-fp8");
  sub->add_flag("--no-bos", args->no_bos, "Do not prepend the BOS token");
  sub->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past end-of-sequence tokens");
  sub->add_flag("-q,--quiet", args->quiet, "No statistics on stderr");
  return {sub, [args] { return run_generate(*args); }};
}

}  // namespace futransformer::cli
