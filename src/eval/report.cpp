// The report's model-fit arithmetic and its JSON and Markdown forms.
#include "futransformer/eval/report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cuda/engine/int4_dequant_heuristics.h"
#include "futransformer/error.h"
#include "futransformer/formats/kv_cache.h"

namespace futransformer::eval {
namespace {

struct Projection {
  int64_t n, k;
};

// Every projection of one layer as the CUDA engine fuses them (q|k|v, o, gate|up, down): rows N, input K.
std::vector<Projection> layer_projections(const ModelConfig& c) {
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  return {{q + 2 * kv, c.hidden_size}, {c.hidden_size, q}, {2 * c.intermediate_size, c.hidden_size},
          {c.hidden_size, c.intermediate_size}};
}

bool int4_weights(const PrecisionRecipe& r) {
  return r.weights == WeightFormat::Int4Rtn || r.weights == WeightFormat::Int4Gptq;
}

std::string fmt(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string gib(int64_t bytes) { return fmt(static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), 2); }

nlohmann::json opt_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

const ReportRow* find_row(const Report& r, const std::string& config) {
  for (const ReportRow& row : r.rows)
    if (row.config == config) return &row;
  return nullptr;
}

// Markdown table cells must not contain '|' or line breaks.
std::string cell(std::string s) {
  for (char& ch : s)
    if (ch == '|' || ch == '\n') ch = ch == '|' ? '/' : ' ';
  return s;
}

}  // namespace

int64_t fp8_prefill_copy_bytes(const ModelConfig& c) {
  int64_t layer = 0;
  for (const Projection& p : layer_projections(c)) layer += p.n * p.k + p.n * 4;
  return c.num_hidden_layers * layer;
}

GpuMemoryEstimate estimate_gpu_memory(const ModelConfig& c, const PrecisionRecipe& recipe, int64_t max_sequences,
                                      int64_t max_sequence_length, int64_t max_batch_tokens) {
  check(max_sequences >= 1 && max_sequence_length >= 1 && max_batch_tokens >= 1,
        "GPU memory estimate: sequences, length and batch tokens must be positive");
  GpuMemoryEstimate m;
  const int64_t h = c.hidden_size, L = c.num_hidden_layers, V = c.vocab_size;
  int64_t layer = 0;
  for (const Projection& p : layer_projections(c)) {
    if (int4_weights(recipe)) {
      // Two codes per byte; one 2-byte scale per group of K (per channel: one per row).
      const int64_t group = recipe.int4.group_size > 0 ? recipe.int4.group_size : p.k;
      layer += p.n * p.k / 2 + p.n * ((p.k + group - 1) / group) * 2;
    } else if (recipe.weights == WeightFormat::Fp8) {
      layer += p.n * p.k + p.n * 4;  // one byte per weight + an fp32 scale per output channel
    } else {
      layer += p.n * p.k * 2;  // BF16
    }
  }
  int64_t head = c.tie_word_embeddings ? 0 : V * h * 2;  // BF16 LM head (a tied one reads the embedding)
  if (recipe.head == HeadFormat::Int4) {
    // Its own INT4 copy (also when tied) + BF16 group scales, rows padded to the W4A16 GEMM's 32 (as the engine
    // uploads it; recipe_model_mismatch says when no group fits).
    const int64_t g = h % 32 == 0 ? head_int4_spec(h, "GPU memory estimate").group_size : 32;
    const int64_t rows = (V + 31) / 32 * 32;
    head = rows * h / 2 + rows * ((h + g - 1) / g) * 2;
  }
  m.weights = L * layer + (2 * L + 1) * h * 4 /* fp32 norms */ + V * h * 2 /* BF16 embedding */ + head;

  const formats::KvFormat kv = recipe.kv.value_or(formats::KvFormat::BF16);
  const formats::KvPageLayout layout = formats::kv_page_layout(kv, c.head_dim);
  // The engine's default pool: whole pages for every sequence at max_sequence_length.
  const int64_t pages_per_seq = (max_sequence_length + formats::kKvPageTokens - 1) / formats::kKvPageTokens;
  const int64_t pages = std::max<int64_t>(max_sequences * pages_per_seq, 1);
  m.kv_cache = L * pages * c.num_key_value_heads * layout.page_bytes;
  if (kv == formats::KvFormat::INT4_HADAMARD) m.kv_cache += L * max_sequences * c.num_key_value_heads * c.head_dim * 2;

  // Per-pass buffers: fp32 residual rows, LM-head rows and logits; BF16 normalised rows, q|k|v, q, attention
  // output, projection output, gate|up and SwiGLU output.
  const int64_t R = max_batch_tokens, logit_rows = std::max<int64_t>(max_sequences, 16);
  const int64_t q = c.num_attention_heads * c.head_dim, kvw = c.num_key_value_heads * c.head_dim;
  m.activations = 4 * (R * h + logit_rows * h + logit_rows * V) +
                  (recipe.head == HeadFormat::Int4 ? 2 * logit_rows * ((V + 31) / 32 * 32) : 0) /* BF16 logits */ +
                  2 * (std::max(R, logit_rows) * h + R * (q + 2 * kvw) + 2 * R * q + R * h +
                       R * 3 * c.intermediate_size);
  // The dequantise + cuBLAS path of large passes: one BF16 copy of the largest INT4 projection.
  const int64_t dequant_rows = cuda::int4_dequant_min_rows(-1, std::getenv("FT_INT4_DEQUANT_MIN_ROWS"));
  if (int4_weights(recipe) && dequant_rows > 0 && R >= dequant_rows)
    for (const Projection& p : layer_projections(c))
      m.int4_dequant_scratch = std::max(m.int4_dequant_scratch, 2 * p.n * p.k);
  return m;
}

int64_t int4_group_for(const ModelConfig& c) {
  for (int64_t g : {128, 64, 32}) {
    bool ok = true;
    for (const Projection& p : layer_projections(c)) ok = ok && p.k % g == 0;
    if (ok) return g;
  }
  return 0;
}

std::string recipe_model_mismatch(const ModelConfig& c, const PrecisionRecipe& recipe) {
  if (int4_weights(recipe) && recipe.int4.group_size > 0) {
    for (const Projection& p : layer_projections(c))
      if (p.k % recipe.int4.group_size != 0)
        return "INT4 group " + std::to_string(recipe.int4.group_size) + " does not divide a projection input of " +
               std::to_string(p.k) + " (use -gch or a group that divides " + std::to_string(c.hidden_size) + ", " +
               std::to_string(c.num_attention_heads * c.head_dim) + " and " + std::to_string(c.intermediate_size) +
               ")";
  }
  if (recipe.head == HeadFormat::Int4) {
    if (c.hidden_size % 32 != 0)
      return "head-int4 needs a group of 128, 64 or 32 dividing the hidden size " + std::to_string(c.hidden_size);
  }
  if (recipe.kv) {
    try {
      formats::kv_page_layout(*recipe.kv, c.head_dim);
    } catch (const Error& e) {
      return std::string("KV cache ") + formats::kv_format_name(*recipe.kv) + " cannot hold head_dim " +
             std::to_string(c.head_dim) + ": " + e.what();
    }
  }
  return "";
}

nlohmann::json report_json(const Report& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ReportRow& row : r.rows) {
    nlohmann::json j = {{"config", row.config}, {"device", row.device}, {"not_run", row.not_run}};
    j["quality"] = {{"ppl", opt_json(row.ppl)},
                    {"mean_nll", opt_json(row.mean_nll)},
                    {"mean_kl_vs_baseline", opt_json(row.mean_kl)},
                    {"max_kl_vs_baseline", opt_json(row.max_kl)},
                    {"top1_agreement_vs_baseline", opt_json(row.top1_agreement)},
                    {"predicted_tokens", row.predicted_tokens},
                    {"device", row.quality_device.empty() ? row.device : row.quality_device},
                    {"note", row.quality_note}};
    if (row.latency) {
      const LatencyResult& l = *row.latency;
      nlohmann::json decode = nlohmann::json::array();
      for (const DecodeLatency& d : l.decode)
        decode.push_back({{"batch", d.batch},
                          {"context", d.context},
                          {"steps", d.steps},
                          {"median_ms", d.median_ms},
                          {"p90_ms", d.p90_ms},
                          {"min_ms", d.min_ms},
                          {"tokens_per_s", d.tokens_per_s},
                          {"step_ms", d.step_ms}});
      j["latency"] = {{"prefill", {{"median_ms", l.prefill_median_ms},
                                   {"tokens_per_s", l.prefill_tokens_per_s},
                                   {"runs_ms", l.prefill_ms}}},
                      {"decode", decode}};
    } else {
      j["latency"] = nullptr;
    }
    j["latency_note"] = row.latency_note;
    j["gpu_memory_bytes"] = row.gpu_memory_bytes ? nlohmann::json(*row.gpu_memory_bytes) : nlohmann::json(nullptr);
    if (!row.gpu_memory_detail.is_null()) j["gpu_memory_detail"] = row.gpu_memory_detail;
    rows.push_back(j);
  }
  nlohmann::json batches = r.latency.batches;
  return {{"command_line", r.command_line},
          {"model", r.model},
          {"synthetic", r.synthetic},
          {"data", r.data},
          {"device", r.device},
          {"commit", r.commit},
          {"date", r.date},
          {"baseline", r.baseline},
          {"latency_settings",
           {{"prompt_len", r.latency.prompt_len},
            {"batches", batches},
            {"decode_steps", r.latency.decode_steps},
            {"warmup_steps", r.latency.warmup_steps},
            {"prefill_runs", r.latency.prefill_runs},
            {"prompt_seed", r.latency.seed},
            {"timing", "wall clock per call; a step returns after its results are on the host"}}},
          {"quality_settings",
           {{"ctx", r.quality.ctx},
            {"max_windows", r.quality.max_windows},
            {"chunk", r.quality.chunk},
            {"windows", r.quality_windows},
            {"text_tokens", r.text_tokens},
            {"protocol", "lines joined with \\n\\n, tokenised once without BOS, non-overlapping windows; KL(baseline "
                         "|| config) per predicted token in nats, top-1 = argmax agreement"}}},
          {"rows", rows},
          {"extra", r.extra}};
}

std::string report_markdown(const Report& r) {
  std::ostringstream md;
  md << "# futransformer report\n\n```\n" << r.command_line << "\n```\n\n";
  md << "- model: `" << r.model << "`" << (r.synthetic ? " (synthetic weights: latency only)" : "") << "\n";
  md << "- device: " << r.device << "\n- commit: " << r.commit << "\n- date: " << r.date << "\n";
  md << "- latency: prompt " << r.latency.prompt_len << " tokens (median of " << r.latency.prefill_runs
     << " prefills); decode " << r.latency.decode_steps << " timed steps after " << r.latency.warmup_steps
     << " warm-up steps at batch";
  for (size_t i = 0; i < r.latency.batches.size(); ++i) md << (i ? ", " : " ") << r.latency.batches[i];
  md << "; wall clock per call\n";
  if (!r.data.empty())
    md << "- quality: `" << r.data << "`, " << r.text_tokens << " tokens, " << r.quality_windows << " windows of "
       << r.quality.ctx << " tokens; KL and top-1 agreement against `" << r.baseline << "`\n";
  else
    md << "- quality: not measured (no --data)\n";

  const ReportRow* base = find_row(r, r.baseline);
  md << "\n## Quality\n\n| configuration | perplexity | vs " << r.baseline
     << " | mean KL (nats) | max KL | top-1 agreement | measured on |\n|---|---|---|---|---|---|---|\n";
  for (const ReportRow& row : r.rows) {
    md << "| " << cell(row.config) << " | ";
    if (row.ppl) {
      md << fmt(*row.ppl, 4) << " | ";
      if (base && base->ppl && &row != base)
        md << (*row.ppl >= *base->ppl ? "+" : "") << fmt(*row.ppl - *base->ppl, 4) << " ("
           << (*row.ppl >= *base->ppl ? "+" : "") << fmt(100.0 * (*row.ppl / *base->ppl - 1.0), 2) << "%) | ";
      else
        md << "— | ";
    } else {
      md << cell(row.quality_note.empty() ? "—" : row.quality_note) << " | — | ";
    }
    md << (row.mean_kl ? fmt(*row.mean_kl, 5) : "—") << " | " << (row.max_kl ? fmt(*row.max_kl, 4) : "—") << " | "
       << (row.top1_agreement ? fmt(*row.top1_agreement, 4) : "—") << " | "
       << cell(row.quality_device.empty() ? (row.ppl ? row.device : "—") : row.quality_device) << " |\n";
  }

  md << "\n## Prefill\n\n| configuration | prompt tokens | median ms | tokens/s | runs (ms) |\n|---|---|---|---|---|\n";
  for (const ReportRow& row : r.rows) {
    if (!row.latency) continue;
    std::string runs;
    for (double v : row.latency->prefill_ms) runs += (runs.empty() ? "" : ", ") + fmt(v, 2);
    md << "| " << cell(row.config) << " | " << r.latency.prompt_len << " | " << fmt(row.latency->prefill_median_ms, 2)
       << " | " << fmt(row.latency->prefill_tokens_per_s, 1) << " | " << runs << " |\n";
  }

  md << "\n## Decode\n\n| configuration | batch | context | median ms/step | p90 ms/step | tokens/s |\n"
        "|---|---|---|---|---|---|\n";
  for (const ReportRow& row : r.rows) {
    if (!row.latency) continue;
    for (const DecodeLatency& d : row.latency->decode)
      md << "| " << cell(row.config) << " | " << d.batch << " | " << d.context << " | " << fmt(d.median_ms, 3)
         << " | " << fmt(d.p90_ms, 3) << " | " << fmt(d.tokens_per_s, 1) << " |\n";
  }

  bool any_gpu = false;
  for (const ReportRow& row : r.rows) any_gpu = any_gpu || row.gpu_memory_bytes.has_value();
  md << "\n## Memory\n\n";
  if (!any_gpu) md << "GPU memory: n/a (no configuration ran on the GPU).\n";
  else
    md << "| configuration | GPU memory held (GiB) | weights | KV cache | activations | workspace |\n"
          "|---|---|---|---|---|---|\n";
  for (const ReportRow& row : r.rows) {
    if (!row.gpu_memory_bytes) continue;
    const nlohmann::json& d = row.gpu_memory_detail;
    auto part = [&](const char* k) { return d.is_object() && d.contains(k) ? gib(d[k].get<int64_t>()) : "—"; };
    md << "| " << cell(row.config) << " | " << gib(*row.gpu_memory_bytes) << " | " << part("weights") << " | "
       << part("kv_cache") << " | " << part("activations") << " | " << part("workspace") << " |\n";
  }
  bool any_missing = false;
  for (const ReportRow& row : r.rows) any_missing = any_missing || !row.not_run.empty() || !row.latency_note.empty();
  if (any_missing) {
    md << "\n## Not run\n\n";
    for (const ReportRow& row : r.rows) {
      if (!row.not_run.empty()) md << "- `" << row.config << "`: " << row.not_run << "\n";
      if (!row.latency_note.empty()) md << "- `" << row.config << "` latency: " << row.latency_note << "\n";
    }
  }
  // Wall clock of each phase (recorded by the report command in extra.phase_seconds).
  if (r.extra.is_object() && r.extra.contains("phase_seconds") && r.extra["phase_seconds"].is_array() &&
      !r.extra["phase_seconds"].empty()) {
    md << "\n## Time taken\n\n| phase | seconds |\n|---|---|\n";
    for (const nlohmann::json& ph : r.extra["phase_seconds"]) {
      if (!ph.is_object() || !ph.contains("phase") || !ph.contains("seconds")) continue;
      md << "| " << cell(ph["phase"].get<std::string>()) << " | " << fmt(ph["seconds"].get<double>(), 2) << " |\n";
    }
  }
  md << "\nPlot: report.svg (decode latency per token against perplexity, one point per configuration and batch).\n";
  return md.str();
}

std::vector<PlotPoint> report_plot_points(const Report& r) {
  std::vector<PlotPoint> points;
  for (const ReportRow& row : r.rows) {
    if (!row.ppl || !row.latency) continue;
    for (const DecodeLatency& d : row.latency->decode)
      points.push_back({d.median_ms, *row.ppl, row.config + " B=" + std::to_string(d.batch), row.config});
  }
  return points;
}

}  // namespace futransformer::eval
