// `futransformer report`: for each precision configuration, prefill and decode latency and (with --data) perplexity,
// KL divergence from full precision and top-1 agreement over the same text; writes report.json, report.md and
// report.svg. Every flag, file and fit check runs before any weights are quantised or uploaded.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_choice.h"
#include "cli/recipe_engine.h"
#include "futransformer/cuda_engine.h"
#include "futransformer/device.h"
#include "futransformer/error.h"
#include "futransformer/eval/device_quality.h"
#include "futransformer/eval/perplexity.h"
#include "futransformer/eval/report.h"
#include "futransformer/io/synthetic.h"
#include "futransformer/model.h"
#include "futransformer/progress.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"
#include "futransformer/reference_engine.h"
#include "futransformer/tokenizer.h"

namespace futransformer::cli {
namespace {

// Room on the GPU beyond what estimate_gpu_memory counts: the CUDA context (~0.5 GiB), the cuBLAS workspace,
// the W4A16 split-K and attention split workspaces, allocator rounding.
constexpr int64_t kGpuHeadroomBytes = int64_t{2} << 30;
constexpr int64_t kDefaultCtx = 2048;

struct ReportArgs {
  std::string model;
  std::string synthetic;  // --config
  std::string tokenizer;
  std::string data;
  std::string out = "report";
  std::string device = "auto";
  int64_t prompt_len = 2048;
  std::vector<std::string> batches{"1,8,32"};
  int64_t decode_steps = 128;
  int64_t prefill_runs = 3;
  int64_t ctx = 0;
  int64_t max_windows = 0;
  std::vector<std::string> configs;
  bool cpu_fallback = false;
  bool host_logits = false;  // --host-logits: quality passes download the logits (the CPU formulas) on the GPU too
  std::string gptq_device = "auto";  // --gptq-device: auto = where the report runs
  RecipeEngineArgs calibration;
};

std::vector<std::string> split_list(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const std::string& item : in) {
    std::stringstream ss(item);
    std::string part;
    while (std::getline(ss, part, ','))
      if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::vector<int64_t> parse_batches(const std::vector<std::string>& in) {
  std::vector<int64_t> out;
  for (const std::string& s : split_list(in)) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == s.size() && v >= 1 && v <= 4096, "--batch: '", s, "' is not a batch size (expected positive ",
          "integers up to 4096, comma-separated, e.g. 1,8,32)");
    out.push_back(v);
  }
  check(!out.empty(), "--batch: no batch size given");
  return out;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string git_commit() {
  if (const char* env = std::getenv("FT_GIT_COMMIT"); env && *env) return env;
  // The tree the executable was built in (build/ sits inside it), whatever the working directory.
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string dir = ec ? std::string(".") : exe.parent_path().string();
  if (dir.find('\'') != std::string::npos) return "unknown";
  std::string out;
  auto run = [](const std::string& cmd) {
    std::string text;
    if (std::FILE* p = popen(cmd.c_str(), "r")) {
      char buf[256];
      while (std::fgets(buf, sizeof buf, p)) text += buf;
      pclose(p);
    }
    return text;
  };
  out = run("git -C '" + dir + "' rev-parse --short HEAD 2>/dev/null");
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (out.empty()) return "unknown";
  // Tracked files that differ from HEAD: the commit alone does not name the tree that ran (a copied working tree
  // over an older checkout, as on the lent GPU machine, looks exactly like this).
  if (!run("git -C '" + dir + "' status --porcelain --untracked-files=no 2>/dev/null").empty()) out += "+dirty";
  return out;
}

// The process's own command line (Linux), for the report's reproduction line.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    std::string arg = all.substr(start, end - start);
    if (arg.find_first_of(" \t'\"$") != std::string::npos) arg = "'" + arg + "'";
    out += (out.empty() ? "" : " ") + arg;
    start = end + 1;
  }
  return out.empty() ? "futransformer report" : out;
}

// A synthetic model's tensors made in host memory (the CPU reference engine's input); the CUDA engine makes its own.
Model synthetic_host_model(const std::string& name) {
  Model m;
  m.config = synthetic_config(name);
  m.source = "synthetic:" + name;
  m.format = "synthetic";
  std::vector<std::string> names{"model.embed_tokens.weight", "model.norm.weight"};
  if (!m.config.tie_word_embeddings) names.push_back("lm_head.weight");
  for (int64_t i = 0; i < m.config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* t : {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                          "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      names.push_back(p + t + ".weight");
  }
  for (const std::string& n : names) m.tensors.emplace(n, synthetic_tensor(m.config, n, 0, 0));
  m.validate();
  return m;
}

std::vector<std::string> default_configs(int64_t group) {
  const std::string g = group > 0 ? "g" + std::to_string(group) : "gch";
  return {"full", "fp8+act-fp8", "int4-gptq-" + g, "int4-gptq-" + g + "+kv-int4",
          "int4-gptq-" + g + "+kv-int4-hadamard"};
}

bool int4(const PrecisionRecipe& r) {
  return r.weights == WeightFormat::Int4Rtn || r.weights == WeightFormat::Int4Gptq;
}

bool fp8_prefill(const PrecisionRecipe& r) { return runs_as_fp8_prefill(r); }

struct Built {
  std::unique_ptr<Engine> engine;
  CudaEngine* cuda = nullptr;  // the same engine, when it is a CUDA engine
  std::string device;
};

struct Plan {
  PrecisionRecipe recipe;
  eval::ReportRow* row = nullptr;
  int64_t gpu_bytes = 0;      // estimate (CUDA only)
  bool device_refused = false;  // the CUDA engine does not run the recipe (a CPU fallback may measure quality)
};

class ReportRun {
 public:
  explicit ReportRun(const ReportArgs& a) : a_(a) {}
  int run();

 private:
  void validate_and_plan();
  // Builds (quantising first when the recipe asks) and records the time taken as a phase.
  Built build(const PrecisionRecipe& recipe, Backend backend);
  Built build_engine(const PrecisionRecipe& recipe, Backend backend);
  void run_latency(Plan& p, Built& b);
  void run_latency_phase(Plan& p, Built& b);
  // Wall-clock seconds of one phase (build, latency, quality) for report.extra["phase_seconds"].
  void record_phase(const std::string& phase, std::chrono::steady_clock::time_point start);
  void run_quality_group(Built& base, Plan* base_plan, std::vector<std::pair<Plan*, Built*>>& group,
                         const std::string& quality_device);
  void write_outputs();

  const ReportArgs& a_;
  Backend backend_ = Backend::Cpu;
  DeviceInfo device_;
  Model model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<RecipeEngineFactory> factory_;
  std::map<std::string, quant::QuantizedModel> synthetic_quantised_;  // CPU synthetic runs, by weight format
  std::vector<int32_t> tokens_;
  bool quality_ = false;
  eval::LatencyOptions latency_;
  eval::PerplexityOptions quality_opt_;
  int64_t max_len_ = 0;
  int64_t max_batch_ = 0;
  eval::Report report_;
  std::vector<Plan> plans_;
  nlohmann::json phases_ = nlohmann::json::array();
};

void ReportRun::record_phase(const std::string& phase, std::chrono::steady_clock::time_point start) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  phases_.push_back({{"phase", phase}, {"seconds", seconds}});
}

Built ReportRun::build(const PrecisionRecipe& recipe, Backend backend) {
  const auto start = std::chrono::steady_clock::now();
  Built b = build_engine(recipe, backend);
  record_phase("build " + recipe.name() + (backend == Backend::Cuda ? " (cuda)" : " (cpu)"), start);
  return b;
}

void ReportRun::run_latency(Plan& p, Built& b) {
  const auto start = std::chrono::steady_clock::now();
  run_latency_phase(p, b);
  record_phase("latency " + p.recipe.name(), start);
}

void ReportRun::validate_and_plan() {
  // Flags first, then files, then the model's shape and the GPU's memory: each a clear Error before any work.
  check(a_.model.empty() != a_.synthetic.empty(), a_.model.empty() ? "give --model PATH or --config NAME"
                                                                   : "--model and --config exclude each other");
  latency_.prompt_len = a_.prompt_len;
  latency_.decode_steps = a_.decode_steps;
  latency_.prefill_runs = a_.prefill_runs;
  latency_.batches = parse_batches(a_.batches);
  eval::check_latency_options(latency_);
  max_batch_ = *std::max_element(latency_.batches.begin(), latency_.batches.end());
  std::vector<std::string> names = split_list(a_.configs);
  const bool default_list = names.empty();
  std::vector<PrecisionRecipe> recipes;
  for (const std::string& n : names) recipes.push_back(PrecisionRecipe::parse(n));
  backend_ = choose_backend(a_.device);
  device_ = query_device();
  std::string text;
  if (!a_.data.empty()) text = eval::read_eval_text(a_.data);

  const bool synthetic = !a_.synthetic.empty();
  if (synthetic) {
    model_.config = synthetic_config(a_.synthetic);
    model_.source = "synthetic:" + a_.synthetic;
  } else {
    check(!quant::is_quantized_checkpoint(a_.model), a_.model, ": is a quantised checkpoint; report quantises each ",
          "configuration itself from the full-precision model");
    model_ = load_model(a_.model);
  }
  const ModelConfig& c = model_.config;
  if (default_list)
    for (const std::string& n : default_configs(eval::int4_group_for(c))) recipes.push_back(PrecisionRecipe::parse(n));
  // Full precision is the KL / agreement baseline: always measured, first.
  auto full = std::find_if(recipes.begin(), recipes.end(), [](const PrecisionRecipe& r) { return r.name() == "full"; });
  if (full == recipes.end()) {
    recipes.insert(recipes.begin(), PrecisionRecipe{});
  } else {
    std::rotate(recipes.begin(), full, full + 1);
  }
  for (size_t i = 0; i < recipes.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      check(recipes[i].name() != recipes[j].name(), "--configs: '", recipes[i].name(), "' is given twice");

  const int64_t context = c.max_position_embeddings;
  check(eval::latency_sequence_length(latency_) <= context, "--prompt-len ", a_.prompt_len, " + ",
        latency_.warmup_steps, " warm-up steps + --decode-steps ", a_.decode_steps, " = ",
        eval::latency_sequence_length(latency_), " tokens exceed the model's context of ", context, " tokens");
  quality_ = !text.empty() && !synthetic;
  quality_opt_.ctx = a_.ctx > 0 ? a_.ctx : std::min(kDefaultCtx, context);
  quality_opt_.max_windows = a_.max_windows;
  check(!quality_ || quality_opt_.ctx <= context, "--ctx ", quality_opt_.ctx, " exceeds the model's context of ",
        context, " tokens");
  max_len_ = std::max(eval::latency_sequence_length(latency_), quality_ ? quality_opt_.ctx : int64_t{0});

  report_.rows.resize(recipes.size());
  for (size_t i = 0; i < recipes.size(); ++i) {
    Plan p;
    p.recipe = recipes[i];
    p.row = &report_.rows[i];
    p.row->config = recipes[i].name();
    const std::string mismatch = eval::recipe_model_mismatch(c, recipes[i]);
    check(mismatch.empty() || default_list, "--configs: ", recipes[i].name(), ": ", mismatch);
    if (!mismatch.empty()) p.row->not_run = "not run on this model: " + mismatch;
    if (synthetic) p.row->quality_note = "n/a (synthetic weights)";
    else if (text.empty()) p.row->quality_note = "n/a (no --data)";
    if (p.row->not_run.empty() && backend_ == Backend::Cuda) {
      try {
        recipe_cuda_engine_options(recipes[i], CudaEngineOptions{});
        if (synthetic && int4(recipes[i]) && recipes[i].int4.group_size == 0)
          fail("the synthetic CUDA engine makes grouped INT4 weights only (g32, g64, g128)");
      } catch (const Error& e) {
        p.row->not_run = std::string("not run on this device: ") + e.what();
        p.device_refused = true;
      }
    }
    if (p.row->not_run.empty() && backend_ == Backend::Cuda) {
      eval::GpuMemoryEstimate m = eval::estimate_gpu_memory(
          c, fp8_prefill(recipes[i]) ? fp8_prefill_decode_half(recipes[i]) : recipes[i], max_batch_, max_len_);
      if (fp8_prefill(recipes[i])) m.weights += eval::fp8_prefill_copy_bytes(c);
      p.gpu_bytes = m.total() + kGpuHeadroomBytes;
      const auto device_bytes = static_cast<int64_t>(device_.memory_gib * 1024.0 * 1024.0 * 1024.0);
      if (p.gpu_bytes > device_bytes) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "does not fit the GPU: needs about %.1f GiB (weights %.1f, KV cache %.1f for "
                      "%lld × %lld tokens), the device has %.1f GiB", p.gpu_bytes / 1073741824.0,
                      m.weights / 1073741824.0, m.kv_cache / 1073741824.0, static_cast<long long>(max_batch_),
                      static_cast<long long>(max_len_), device_.memory_gib);
        p.row->not_run = std::string("not run on this device: ") + buf;
      }
    }
    plans_.push_back(p);
  }
  bool any = false;
  for (const Plan& p : plans_) any = any || p.row->not_run.empty();
  if (!any) {
    std::string why;
    for (const Plan& p : plans_) why += "\n  " + p.recipe.name() + ": " + p.row->not_run;
    fail("no configuration can run:", why);
  }
  if (!synthetic) {
    tokenizer_ = load_tokenizer_for_model(model_, a_.tokenizer);
    std::vector<PrecisionRecipe> quantised;
    for (const Plan& p : plans_)
      if (p.row->not_run.empty() || (p.device_refused && a_.cpu_fallback)) quantised.push_back(p.recipe);
    check_recipe_engine_args(a_.calibration, quantised);
    RecipeEngineArgs recipe_args = a_.calibration;
    // On the GPU, GPTQ (calibration forward, Hessians, column loop) runs there too unless --gptq-device cpu:
    // minutes instead of hours on large models.
    const bool gptq_cuda = a_.gptq_device == "cuda" || (a_.gptq_device == "auto" && backend_ == Backend::Cuda);
    check(!gptq_cuda || backend_ == Backend::Cuda, "--gptq-device cuda needs the report to run on the GPU (--device cuda)");
    recipe_args.gptq_device = gptq_cuda ? quant::GptqDevice::Cuda : quant::GptqDevice::Cpu;
    factory_ = std::make_unique<RecipeEngineFactory>(model_, *tokenizer_, recipe_args);
  }
  if (quality_) {
    tokens_ = tokenizer_->encode(text);
    report_.quality_windows = eval::perplexity_windows(static_cast<int64_t>(tokens_.size()), quality_opt_);
    report_.text_tokens = static_cast<int64_t>(tokens_.size());
  }
  std::filesystem::create_directories(a_.out);
  check(std::filesystem::is_directory(a_.out), a_.out, ": cannot create the output directory");

  report_.command_line = command_line();
  report_.model = synthetic ? model_.source : a_.model;
  report_.synthetic = synthetic;
  report_.data = a_.data;
  report_.commit = git_commit();
  report_.date = utc_now();
  report_.latency = latency_;
  report_.quality = quality_opt_;
  if (backend_ == Backend::Cuda) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "cuda (%s, %d SMs, %.1f GiB)", device_.name.c_str(), device_.sm_count,
                  device_.memory_gib);
    report_.device = buf;
  } else {
    report_.device = "cpu reference engine (fp32)";
  }
}

Built ReportRun::build_engine(const PrecisionRecipe& recipe, Backend backend) {
  Built b;
  if (backend == Backend::Cuda) {
    CudaEngineOptions base;
    base.max_sequence_length = max_len_;
    base.max_sequences = std::max<int64_t>(max_batch_, 1);
    std::unique_ptr<CudaEngine> e;
    if (report_.synthetic) {
      // FP8 prefill rows: random FP8 copies beside BF16 decode projections (group 0), as bench_prefill makes them.
      CudaEngineOptions so = recipe_cuda_engine_options(recipe, base);
      so.synthetic_fp8_prefill = fp8_prefill(recipe);
      e = make_synthetic_cuda_engine(model_.config, int4(recipe) ? recipe.int4.group_size : 0, so);
    } else {
      e = factory_->make_cuda(recipe, base);
    }
    b.cuda = e.get();
    b.device = "cuda: " + e->description();
    b.engine = std::move(e);
    return b;
  }
  b.device = "cpu reference";
  if (!report_.synthetic) {
    b.engine = factory_->make(recipe, max_len_);
    return b;
  }
  // A synthetic model on the CPU: random weights made in host memory once; INT4 recipes round them to nearest
  // (GPTQ would calibrate on meaningless outputs; the latency is the same).
  if (model_.tensors.empty()) model_ = synthetic_host_model(a_.synthetic);
  if (!recipe.quantises_weights()) {
    b.engine = make_reference_engine(model_, quant::reference_options(recipe, max_len_));
    return b;
  }
  PrecisionRecipe weights = recipe;
  weights.activations = ActivationFormat::Fp32;
  weights.kv.reset();
  if (weights.weights == WeightFormat::Int4Gptq) weights.weights = WeightFormat::Int4Rtn;
  auto it = synthetic_quantised_.find(weights.name());
  if (it == synthetic_quantised_.end()) {
    quant::QuantizeOptions q;
    q.recipe = weights;
    it = synthetic_quantised_.emplace(weights.name(), quant::quantize_model(model_, quant::CalibrationSet{}, q)).first;
  }
  b.engine = make_reference_engine(it->second.model, quant::reference_options(recipe, max_len_));
  return b;
}

void ReportRun::run_latency_phase(Plan& p, Built& b) {
  eval::LatencyHooks hooks;
  if (b.cuda) {
    CudaEngine* e = b.cuda;
    hooks.decode_step = [e](std::span<const SequenceChunk> batch) { return e->forward_greedy(batch); };
    if (report_.synthetic)
      hooks.fill_context = [e](int32_t seq, std::span<const int32_t> prompt) {
        e->append_synthetic_context(seq, static_cast<int64_t>(prompt.size()));
      };
  }
  int64_t total = latency_.prefill_runs;
  for (size_t i = 0; i < latency_.batches.size(); ++i) total += latency_.warmup_steps + latency_.decode_steps;
  ProgressBar bar("latency " + p.recipe.name(), total, !a_.calibration.quiet);
  p.row->latency = eval::measure_latency(*b.engine, latency_, hooks, [&](int64_t done, int64_t) { bar.update(done); });
  bar.finish();
  if (b.cuda) {
    const CudaEngineMemory m = b.cuda->memory();
    p.row->gpu_memory_bytes = m.total();
    p.row->gpu_memory_detail = {{"weights", m.weights},
                                {"kv_cache", m.kv_cache},
                                {"activations", m.activations},
                                {"workspace", m.workspace},
                                {"estimate_with_headroom", p.gpu_bytes}};
  }
}

void ReportRun::run_quality_group(Built& base, Plan* base_plan, std::vector<std::pair<Plan*, Built*>>& group,
                                  const std::string& quality_device) {
  std::vector<Engine*> others;
  std::vector<CudaEngine*> cuda_others;
  std::string label = "quality " + (base_plan ? base_plan->recipe.name() : std::string("full"));
  for (auto& [p, b] : group) {
    others.push_back(b->engine.get());
    cuda_others.push_back(b->cuda);
    label += ", " + p->recipe.name();
  }
  // CUDA engines keep the logits on the GPU and return per-row numbers (eval/device_quality.h).
  const bool on_device = !a_.host_logits && base.cuda &&
                         std::all_of(cuda_others.begin(), cuda_others.end(), [](CudaEngine* e) { return e; });
  if (others.empty() && base_plan && base_plan->row->ppl) return;  // nothing new to measure
  const int64_t total = report_.quality_windows * (quality_opt_.ctx - 1);
  ProgressBar bar(label, total, !a_.calibration.quiet);
  const auto start = std::chrono::steady_clock::now();
  struct PhaseRecord {  // records the phase however the function returns
    ReportRun* run;
    std::string name;
    std::chrono::steady_clock::time_point start;
    ~PhaseRecord() { run->record_phase(name, start); }
  } phase_record{this, label + " (" + std::to_string(report_.quality_windows) + " windows, " +
                           (on_device ? "scored on the GPU" : "scored on the host") + ")",
                 start};
  auto progress = [&](int64_t done, int64_t) { bar.update(done); };
  if (others.empty()) {
    const eval::PerplexityResult r =
        on_device ? eval::evaluate_perplexity_on_device(*base.cuda, tokens_, quality_opt_, progress)
                  : eval::evaluate_perplexity(*base.engine, tokens_, quality_opt_, progress);
    bar.finish();
    if (base_plan) {
      if (base_plan == &plans_.front()) base_plan->row->quality_note = "baseline";
      base_plan->row->ppl = r.ppl;
      base_plan->row->mean_nll = r.mean_nll;
      base_plan->row->predicted_tokens = r.predicted_tokens;
    }
    return;
  }
  const std::vector<eval::DistributionComparison> cmp =
      on_device ? eval::compare_distributions_on_device(*base.cuda, cuda_others, tokens_, quality_opt_, progress)
                : eval::compare_distributions(*base.engine, others, tokens_, quality_opt_, progress);
  bar.finish();
  if (base_plan && !base_plan->row->ppl) {
    base_plan->row->ppl = cmp[0].base.ppl;
    base_plan->row->mean_nll = cmp[0].base.mean_nll;
    base_plan->row->predicted_tokens = cmp[0].base.predicted_tokens;
    base_plan->row->quality_note = "baseline";
  }
  for (size_t k = 0; k < group.size(); ++k) {
    eval::ReportRow& row = *group[k].first->row;
    row.ppl = cmp[k].other.ppl;
    row.mean_nll = cmp[k].other.mean_nll;
    row.mean_kl = cmp[k].mean_kl;
    row.max_kl = cmp[k].max_kl;
    row.top1_agreement = cmp[k].top1_agreement;
    row.predicted_tokens = cmp[k].predicted_tokens;
    if (!quality_device.empty()) row.quality_device = quality_device;
  }
}

int ReportRun::run() {
  validate_and_plan();
  const bool quiet = a_.calibration.quiet;
  if (!quiet)
    std::fprintf(stderr, "report: %s on %s; %zu configurations%s\n", report_.model.c_str(), report_.device.c_str(),
                 plans_.size(),
                 quality_ ? (", quality over " + std::to_string(report_.quality_windows) + " windows of " +
                             std::to_string(quality_opt_.ctx) + " tokens").c_str()
                          : "");
  Plan& base_plan = plans_.front();  // "full"
  std::optional<Built> base;
  if (base_plan.row->not_run.empty()) {
    try {
      base = build(base_plan.recipe, backend_);
      base_plan.row->device = base->device;
    } catch (const Error& e) {
      base_plan.row->not_run = std::string(backend_ == Backend::Cuda ? "not run on this device: " : "not run: ") +
                               e.what();
    }
  }
  if (base) run_latency(base_plan, *base);
  // The baseline stays on the device only while other engines are compared with it.
  if (!quality_) base.reset();

  // The other configurations run in groups beside the baseline, so each quality window runs once per engine: on
  // the GPU a group holds what fits beside the baseline, on the CPU everything. Without a quality phase (or a
  // baseline) engines run one at a time. A configuration that cannot sit beside the baseline runs alone after it.
  const auto device_bytes = static_cast<int64_t>(device_.memory_gib * 1073741824.0);
  std::vector<std::vector<Plan*>> groups;
  std::vector<Plan*> alone;
  int64_t used = 0;
  for (size_t i = 1; i < plans_.size(); ++i) {
    Plan* p = &plans_[i];
    if (!p->row->not_run.empty()) continue;
    if (!base) {
      groups.push_back({p});
      continue;
    }
    auto fits = [&](int64_t already) {
      return backend_ != Backend::Cuda || already + p->gpu_bytes - kGpuHeadroomBytes <= device_bytes;
    };
    if (!fits(base_plan.gpu_bytes)) {
      alone.push_back(p);
      continue;
    }
    if (groups.empty() || !fits(used)) {
      groups.emplace_back();
      used = base_plan.gpu_bytes;
    }
    groups.back().push_back(p);
    used += p->gpu_bytes - kGpuHeadroomBytes;
  }
  auto run_group = [&](const std::vector<Plan*>& members, bool with_base) {
    std::vector<Built> built;
    built.reserve(members.size());
    std::vector<std::pair<Plan*, Built*>> group;
    for (Plan* p : members) {
      try {
        built.push_back(build(p->recipe, backend_));
        p->row->device = built.back().device;
        group.emplace_back(p, &built.back());
      } catch (const Error& e) {
        p->row->not_run = std::string(backend_ == Backend::Cuda ? "not run on this device: " : "not run: ") + e.what();
        // A shape the GPU refuses only when building (FP8 prefill GEMM shapes): the CPU fallback may measure it.
        p->device_refused = backend_ == Backend::Cuda;
      }
    }
    if (quality_ && with_base) {
      run_quality_group(*base, &base_plan, group, "");
    } else if (quality_) {
      // Without the baseline beside it a configuration's perplexity is still measured; KL needs the baseline.
      for (auto& member : group) {
        std::vector<std::pair<Plan*, Built*>> none;
        run_quality_group(*member.second, member.first, none, "");
        member.first->row->quality_note = base_plan.row->not_run.empty()
                                              ? "KL / agreement n/a: does not fit on the GPU beside the baseline"
                                              : "KL / agreement n/a: the full-precision baseline did not run";
      }
    }
    for (auto& [p, b] : group) run_latency(*p, *b);
  };
  if (quality_ && base && groups.empty()) {
    std::vector<std::pair<Plan*, Built*>> none;
    run_quality_group(*base, &base_plan, none, "");
  }
  for (const std::vector<Plan*>& g : groups) run_group(g, base.has_value());
  base.reset();
  for (Plan* p : alone) run_group({p}, false);

  // Configurations the CUDA engine does not run: their quality on the CPU reference engine, against the CPU's
  // full precision, when asked (the CPU reference engine is slow on large models).
  std::vector<Plan*> refused;
  for (Plan& p : plans_)
    if (p.device_refused) refused.push_back(&p);
  if (quality_ && !refused.empty()) {
    if (a_.cpu_fallback) {
      Built cpu_base = build(PrecisionRecipe{}, Backend::Cpu);
      std::vector<Built> built;
      built.reserve(refused.size());
      std::vector<std::pair<Plan*, Built*>> group;
      for (Plan* p : refused) {
        built.push_back(build(p->recipe, Backend::Cpu));
        group.emplace_back(p, &built.back());
      }
      run_quality_group(cpu_base, nullptr, group, "cpu reference (KL against the CPU's full precision)");
    } else {
      for (Plan* p : refused)
        p->row->quality_note = "skipped: not run on this device (--cpu-fallback measures it on the CPU reference)";
    }
  }
  write_outputs();
  return 0;
}

void ReportRun::write_outputs() {
  if (factory_) report_.extra["quantisation"] = factory_->quantisation_records();
  if (factory_) report_.extra["calibration"] = recipe_engine_args_json(factory_->args());
  report_.extra["device_memory_gib"] = device_.memory_gib;
  report_.extra["phase_seconds"] = phases_;
  const std::filesystem::path dir(a_.out);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = (dir / name).string();
    std::ofstream out(path, std::ios::binary);
    check(out.good(), path, ": cannot write");
    out << text;
    out.close();
    check(out.good(), path, ": write failed");
    if (!a_.calibration.quiet) std::fprintf(stderr, "wrote %s\n", path.c_str());
  };
  const std::string md = eval::report_markdown(report_);
  write("report.json", eval::report_json(report_).dump(2) + "\n");
  write("report.md", md);
  write("report.svg", eval::report_svg(report_));
  std::fwrite(md.data(), 1, md.size(), stdout);
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* sub = app.add_subcommand("report", "Latency and quality of several precision recipes side by side "
                                               "(report.md, report.json, report.svg)");
  sub->add_option("-m,--model", args->model, "HF directory, .gguf file or llama2.c .bin (full precision)");
  sub->add_option("--config", args->synthetic,
                  "Synthetic weights of a real architecture instead of --model (llama-3.1-8b, llama-3.1-70b, tiny): "
                  "latency only")
      ->check(CLI::IsMember(synthetic_config_names()));
  sub->add_option("--tokenizer", args->tokenizer, "Tokenizer file, if the model has none of its own");
  sub->add_option("--data", args->data, "Evaluation text for perplexity / KL / agreement (e.g. wiki.test.raw)");
  sub->add_option("--prompt-len", args->prompt_len, "Prompt tokens for prefill latency and the decode context")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--batch", args->batches, "Decode batch sizes, comma-separated")->capture_default_str();
  sub->add_option("--decode-steps", args->decode_steps, "Timed decode steps per batch size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--prefill-runs", args->prefill_runs, "Prefill latency is the median of this many runs")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  sub->add_option("--ctx", args->ctx, "Quality window length in tokens (default: min(2048, the model's context))")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  sub->add_option("--max-windows", args->max_windows, "Quality over at most this many windows (0 = the whole text)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--configs", args->configs,
                  "Precision recipes, comma-separated (as for ppl); full precision is always added as the baseline. "
                  "Default: full, fp8+act-fp8, int4-gptq-gG, int4-gptq-gG+kv-int4, int4-gptq-gG+kv-int4-hadamard "
                  "with G the largest of 128/64/32 dividing the model");
  sub->add_option("--device", args->device, "cpu, cuda, or auto (cuda on a Hopper GPU, else cpu)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_flag("--host-logits", args->host_logits,
                "On the GPU, download every logit row and compute perplexity / KL on the host (slower; the default keeps "
                "the logits on the GPU and downloads per-row numbers)");
  sub->add_option("--gptq-device", args->gptq_device,
                  "Where GPTQ runs for the GPTQ recipes: cpu, cuda, or auto (where the report runs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_flag("--cpu-fallback", args->cpu_fallback,
                "With --device cuda and --data: measure the quality of recipes the GPU does not run on the CPU "
                "reference engine (slow for large models)");
  sub->add_option("--out", args->out, "Output directory (created)")->capture_default_str();
  add_recipe_engine_options(*sub, args->calibration);
  return {sub, [args] { return ReportRun(*args).run(); }};
}

}  // namespace futransformer::cli
