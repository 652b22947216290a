// `futransformer report`: latency and quality of several precision recipes side by side. The parts that need no GPU
// live here so the CPU can test them:
//   - quality: each recipe's next-token distributions against the full-precision model's over the perplexity
//     windows (mean KL divergence, top-1 agreement), both perplexities from the same pass;
//   - latency: prefill and per-step decode timing through the Engine interface (any engine);
//   - the GPU memory a recipe's CUDA engine would need (checked before any weights are loaded);
//   - the report itself: report.json, report.md and report.svg (latency against perplexity).
// docs/design.md ("Report") describes the protocol.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "futransformer/engine.h"
#include "futransformer/eval/perplexity.h"
#include "futransformer/model.h"
#include "futransformer/recipe.h"

namespace futransformer::eval {

// ---------------------------------------------------------------------------------------------------------------
// Quality: distributions against a baseline.

// KL(P || Q) in nats, P = softmax(base_logits), Q = softmax(other_logits), both as log-softmax in double with max
// subtraction (terms with P = 0 contribute 0). Throws Error on different sizes, an empty vector or non-finite logits.
double kl_divergence(std::span<const float> base_logits, std::span<const float> other_logits);
// Index of the largest logit (the first one on ties: the choice of greedy sampling).
int64_t argmax(std::span<const float> logits);

struct DistributionComparison {
  PerplexityResult base;        // the baseline's perplexity over the same windows
  PerplexityResult other;       // the compared engine's perplexity
  double mean_kl = 0;           // mean over predicted tokens of KL(base || other), nats
  double max_kl = 0;            // the largest per-token KL (one badly damaged position shows here)
  double top1_agreement = 0;    // fraction of predicted tokens whose argmax is the same in both
  int64_t predicted_tokens = 0;
};

// One compared engine's running sums over a comparison pass (per predicted token: NLL, KL, agreement), and the
// comparisons they give beside the baseline's result.
struct ComparisonSums {
  double nll = 0, seconds = 0, kl_sum = 0, kl_max = 0;
  int64_t agree = 0;
};
std::vector<DistributionComparison> distribution_comparisons(const PerplexityResult& base,
                                                             const std::vector<ComparisonSums>& others);

// Runs the perplexity windows of `tokens` (evaluate_perplexity's windows, chunks and sequence id 0) through `base`
// and every engine of `others` chunk by chunk, so each window runs once per engine and only one chunk's logits per
// engine are held; returns one comparison per engine of `others` (each with the same `base`). `progress(done,
// total)` counts predicted tokens. Throws Error if an engine's vocabulary differs from the baseline's or ctx exceeds
// an engine's maximum sequence length. With no `others` it still evaluates the baseline and returns no comparison
// (use evaluate_perplexity for that).
std::vector<DistributionComparison> compare_distributions(Engine& base, std::span<Engine* const> others,
                                                          std::span<const int32_t> tokens,
                                                          const PerplexityOptions& options,
                                                          const std::function<void(int64_t, int64_t)>& progress = {});
// One engine against the baseline.
DistributionComparison compare_distributions(Engine& base, Engine& other, std::span<const int32_t> tokens,
                                             const PerplexityOptions& options,
                                             const std::function<void(int64_t, int64_t)>& progress = {});

// ---------------------------------------------------------------------------------------------------------------
// Latency.

// The q-quantile (0 < q <= 1) by nearest rank: the smallest sample with at least q of the samples at or below it
// (sorted[ceil(q·n) − 1]). q = 0.5 of an even count takes the lower middle; median() averages the two middles.
double percentile_nearest_rank(std::vector<double> samples, double q);
double median(std::vector<double> samples);

struct LatencyOptions {
  int64_t prompt_len = 2048;
  std::vector<int64_t> batches{1, 8, 32};
  int64_t decode_steps = 128;
  int64_t prefill_runs = 3;     // prefill latency = the median of this many runs, sequences reset between
  int64_t warmup_steps = 2;     // untimed decode steps first (a CUDA engine captures its step graph in these)
  uint64_t seed = 1;            // the prompts' token ids (uniform over the vocabulary)
};

// How a latency run drives the engine; empty members use Engine::forward.
struct LatencyHooks {
  // Brings sequence `seq_id` (new) to `tokens` cached tokens before decoding. Default: forward(prompt), untimed.
  // A synthetic CUDA engine appends context without running the model (append_synthetic_context).
  std::function<void(int32_t seq_id, std::span<const int32_t> prompt)> fill_context;
  // One decode step: returns each chunk's next token. Default: forward() and the argmax of each chunk's logits on
  // the host. A CUDA engine passes forward_greedy (ids only come back, as in real decoding).
  std::function<std::vector<int32_t>(std::span<const SequenceChunk>)> decode_step;
};

struct DecodeLatency {
  int64_t batch = 0;
  int64_t steps = 0;             // timed steps
  int64_t context = 0;           // tokens cached per sequence before the first timed step
  double median_ms = 0, p90_ms = 0, min_ms = 0;
  double tokens_per_s = 0;       // batch / median step time
  std::vector<double> step_ms;   // every timed step, in order
};

struct LatencyResult {
  double prefill_median_ms = 0;
  double prefill_tokens_per_s = 0;
  std::vector<double> prefill_ms;   // each run
  std::vector<DecodeLatency> decode;  // one per batch size, in the order given
};

// Longest sequence a latency run needs: prompt_len + warmup_steps + decode_steps.
int64_t latency_sequence_length(const LatencyOptions& options);
// Throws Error (naming the flag) for a non-positive prompt length, batch, step or run count.
void check_latency_options(const LatencyOptions& options);

// Prefill: `prefill_runs` times one prompt of prompt_len tokens on a fresh sequence (forward, last logits only),
// wall clock. Decode, per batch B: sequences 0 … B−1 filled to prompt_len (hooks.fill_context), warmup_steps
// untimed steps, then decode_steps steps each timed by wall clock (a step returns only after its results are on the
// host). Sequences are reset afterwards. `progress(done, total)` counts runs and steps.
LatencyResult measure_latency(Engine& engine, const LatencyOptions& options, const LatencyHooks& hooks = {},
                              const std::function<void(int64_t, int64_t)>& progress = {});

// ---------------------------------------------------------------------------------------------------------------
// GPU memory a CUDA engine for `recipe` would hold: weights (INT4 codes + fp16 scales, or BF16; embedding BF16; LM head
// BF16, or with head-int4 its own INT4 copy + BF16 scales; norms fp32), the paged KV cache for max_sequences ×
// max_sequence_length tokens in the recipe's format (the CUDA engine keeps bf16 when the recipe has none), and the
// per-pass activation buffers for max_batch_tokens rows, and — with INT4 projections and max_batch_tokens at least
// the engine's dequantise + cuBLAS threshold (FT_INT4_DEQUANT_MIN_ROWS, else 192) — the BF16 copy of the largest
// projection that path dequantises into (CudaEngineMemory::int4_dequant_scratch). The arithmetic of CudaEngineMemory,
// without the other workspaces (the caller adds headroom).
struct GpuMemoryEstimate {
  int64_t weights = 0, kv_cache = 0, activations = 0, int4_dequant_scratch = 0;
  int64_t total() const { return weights + kv_cache + activations + int4_dequant_scratch; }
};
GpuMemoryEstimate estimate_gpu_memory(const ModelConfig& config, const PrecisionRecipe& recipe, int64_t max_sequences,
                                      int64_t max_sequence_length, int64_t max_batch_tokens = 1024);

// Bytes of the CUDA engine's FP8 prefill copy of every projection (one byte per weight + an fp32 scale per output
// channel), which sits beside the decode weights.
int64_t fp8_prefill_copy_bytes(const ModelConfig& config);

// Why `recipe` cannot run on a model of `config` on any engine ("" when it can): an INT4 group that does not divide
// a projection's input size, head-int4 with no group dividing the hidden size, or a KV format that cannot hold
// head_dim.
std::string recipe_model_mismatch(const ModelConfig& config, const PrecisionRecipe& recipe);
// The largest of 128, 64, 32 that divides every projection's input size; 0 if none does.
int64_t int4_group_for(const ModelConfig& config);

// ---------------------------------------------------------------------------------------------------------------
// The report.

struct ReportRow {
  std::string config;               // recipe name
  std::string device;               // engine that ran it ("cuda: …", "cpu reference"); "" when not run
  std::string not_run;              // "" when it ran; else why ("not run on this device: …")
  // Quality over the evaluation text; empty with quality_note saying why.
  std::optional<double> ppl, mean_nll, mean_kl, max_kl, top1_agreement;
  int64_t predicted_tokens = 0;
  std::string quality_device;       // where quality was measured when it differs from `device`
  std::string quality_note;         // "n/a (synthetic weights)", "baseline", "skipped: …"
  std::optional<LatencyResult> latency;
  std::optional<int64_t> gpu_memory_bytes;   // what the CUDA engine held (CudaEngineMemory::total)
  nlohmann::json gpu_memory_detail;          // its parts, when known
  std::string latency_note;         // why latency is missing, when it is
};

struct Report {
  std::string command_line;
  std::string model;                // path or "synthetic:<config>"
  bool synthetic = false;
  std::string data;                 // evaluation text ("" = none)
  std::string device;               // e.g. "cuda (NVIDIA H200, 132 SMs, 139.8 GiB)" or "cpu reference"
  std::string commit;               // git commit ("unknown" if not known)
  std::string date;                 // UTC, ISO 8601
  LatencyOptions latency;
  PerplexityOptions quality;        // windows of the quality phase
  int64_t quality_windows = 0;      // windows evaluated (0 when no quality phase ran)
  int64_t text_tokens = 0;
  std::string baseline = "full";    // KL / agreement baseline configuration
  std::vector<ReportRow> rows;
  nlohmann::json extra = nlohmann::json::object();  // quantisation records, calibration, …
};

nlohmann::json report_json(const Report& report);
// Markdown: the command line and settings, then one table per metric family (quality; prefill; decode per batch
// size; memory) and notes for rows that did not run.
std::string report_markdown(const Report& report);

// One point of the plot: x = decode latency per token (ms), y = perplexity.
struct PlotPoint {
  double x = 0, y = 0;
  std::string label;   // "int4-gptq-g128 B=8"
  std::string series;  // points of one series share a colour (the configuration)
};
// The plot's points: one per (configuration, batch) with both a perplexity and a decode latency.
std::vector<PlotPoint> report_plot_points(const Report& report);
// A standalone SVG scatter plot (hand-written, valid XML): axes with "nice" ticks (1, 2 or 5 × 10^k steps), one
// labelled <circle> per point, a legend per series; `empty_note` is drawn instead when there are no points.
std::string svg_scatter_plot(const std::vector<PlotPoint>& points, const std::string& title, const std::string& x_label,
                             const std::string& y_label, const std::string& empty_note);
std::string report_svg(const Report& report);
// Tick positions covering [lo, hi] with a step of 1, 2 or 5 × 10^k, about `target` of them (lo < hi).
std::vector<double> nice_ticks(double lo, double hi, int target);
// Text escaped for XML character data and attribute values (& < > " ').
std::string xml_escape(const std::string& text);

}  // namespace futransformer::eval
