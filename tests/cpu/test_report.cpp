// The report's engine-agnostic parts: KL / top-1 agreement, latency measurement, the GPU fit estimate, and the
// report's Markdown / JSON / SVG forms.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/eval/perplexity.h"
#include "futransformer/eval/report.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/io/synthetic.h"

namespace futransformer::eval {
namespace {

// Logits are read as fp32: a value like ln 2 is off by up to 2^-24 relative, which moves a KL of O(1) by ~1e-8.
constexpr double kFloatLogitTolerance = 1e-7;

// A scripted engine: each token's logits favour (token + step) mod vocab by `margin` above 0, plus `shift` on every
// logit, so every NLL and KL between two such engines has a closed form. Counts its forward calls.
class ScriptedEngine final : public Engine {
 public:
  ScriptedEngine(int64_t vocab, int step, float margin, float shift) : step_(step), margin_(margin), shift_(shift) {
    config_.vocab_size = vocab;
  }
  const ModelConfig& config() const override { return config_; }
  std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits) override {
    ++forward_calls;
    std::vector<std::vector<float>> out;
    const auto v = static_cast<size_t>(config_.vocab_size);
    for (const SequenceChunk& c : batch) {
      lengths_[c.seq_id] += static_cast<int64_t>(c.tokens.size());
      EXPECT_LE(lengths_[c.seq_id], max_sequence_length());
      const size_t rows = all_logits ? c.tokens.size() : 1;
      std::vector<float> logits(rows * v, shift_);
      for (size_t r = 0; r < rows; ++r) {
        const int32_t t = c.tokens[all_logits ? r : c.tokens.size() - 1];
        logits[r * v + static_cast<size_t>((t + step_) % config_.vocab_size)] = margin_ + shift_;
      }
      out.push_back(std::move(logits));
    }
    return out;
  }
  int64_t sequence_length(int32_t seq) const override {
    auto it = lengths_.find(seq);
    return it == lengths_.end() ? 0 : it->second;
  }
  void reset(int32_t seq) override { lengths_.erase(seq); }
  int64_t max_sequence_length() const override { return 256; }

  int forward_calls = 0;

 private:
  ModelConfig config_;
  int step_;
  float margin_, shift_;
  std::map<int32_t, int64_t> lengths_;
};

TEST(ReportKl, IdenticalAndShiftedLogitsGiveZero) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> a(1000), shifted(1000);
  for (size_t i = 0; i < a.size(); ++i) {
    // Multiples of 1/64 below 2^10: adding 16 is exact in fp32, so the shifted row is exactly a + 16.
    a[i] = std::round(d(rng) * 64.0f) / 64.0f;
    shifted[i] = a[i] + 16.0f;
  }
  EXPECT_EQ(kl_divergence(a, a), 0.0);
  EXPECT_EQ(kl_divergence(a, shifted), 0.0);
  EXPECT_EQ(kl_divergence(shifted, a), 0.0);
}

TEST(ReportKl, HandMadeThreeTokenDistributions) {
  // P = (1/2, 1/4, 1/4) from logits (ln 2, 0, 0); Q uniform.
  const std::vector<float> p{std::log(2.0f), 0.0f, 0.0f}, q{0.0f, 0.0f, 0.0f};
  EXPECT_NEAR(kl_divergence(p, q), 0.5 * std::log(1.5) + 0.5 * std::log(0.75), kFloatLogitTolerance);
  // KL is not symmetric: KL(Q || P) = 1/3 ln(2/3) + 2/3 ln(4/3) = 1/3 ln(32/27).
  EXPECT_NEAR(kl_divergence(q, p), std::log(32.0 / 27.0) / 3.0, kFloatLogitTolerance);
  EXPECT_GT(std::abs(kl_divergence(p, q) - kl_divergence(q, p)), 1e-3);
  EXPECT_THROW(kl_divergence(p, std::vector<float>{0.0f, 1.0f}), Error);
  EXPECT_THROW(kl_divergence(std::vector<float>{}, std::vector<float>{}), Error);
  EXPECT_THROW(kl_divergence(p, std::vector<float>{0.0f, NAN, 1.0f}), Error);
}

TEST(ReportKl, ArgmaxTakesTheFirstOfTies) {
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 3.0f, -1.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-2.0f}), 0);
}

TEST(ReportKl, CompareDistributionsOverWindowsMatchesClosedForms) {
  constexpr int64_t kVocab = 9;
  constexpr float kMargin = 2.5f;
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(700);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % kVocab);
  PerplexityOptions o;
  o.ctx = 64;
  o.chunk = 24;  // windows of 24 + 24 + 16 tokens
  ScriptedEngine base(kVocab, 1, kMargin, 0.0f), shifted(kVocab, 1, kMargin, 4.0f), other(kVocab, 2, kMargin, 0.0f);
  Engine* const others[] = {&shifted, &other};
  const std::vector<DistributionComparison> c = compare_distributions(base, others, tokens, o);
  ASSERT_EQ(c.size(), 2u);
  const int64_t windows = 700 / 64;
  EXPECT_EQ(c[0].predicted_tokens, windows * 63);
  // Each window runs once per engine, chunk by chunk.
  EXPECT_EQ(base.forward_calls, windows * 3);
  EXPECT_EQ(shifted.forward_calls, windows * 3);
  EXPECT_EQ(other.forward_calls, windows * 3);

  // The baseline's perplexity is evaluate_perplexity's, bit for bit.
  ScriptedEngine alone(kVocab, 1, kMargin, 0.0f);
  const PerplexityResult ref = evaluate_perplexity(alone, tokens, o);
  EXPECT_EQ(c[0].base.mean_nll, ref.mean_nll);
  EXPECT_EQ(c[1].base.mean_nll, ref.mean_nll);

  // Shifting every logit changes nothing.
  EXPECT_EQ(c[0].mean_kl, 0.0);
  EXPECT_EQ(c[0].max_kl, 0.0);
  EXPECT_EQ(c[0].top1_agreement, 1.0);
  EXPECT_NEAR(c[0].other.mean_nll, ref.mean_nll, 1e-12);  // the same up to rounding of log Σ + max

  // Another favourite token: P has e^m / Z at a, Q has it at b != a, 1 / Z elsewhere (Z = e^m + V − 1), so
  // KL = p_a·m − p_b·m = m (e^m − 1) / Z at every position, and the argmaxes never agree.
  const double z = std::exp(double{kMargin}) + kVocab - 1;
  const double kl = kMargin * (std::exp(double{kMargin}) - 1.0) / z;
  EXPECT_NEAR(c[1].mean_kl, kl, 1e-12);
  EXPECT_NEAR(c[1].max_kl, kl, 1e-12);
  EXPECT_EQ(c[1].top1_agreement, 0.0);
  ScriptedEngine other_alone(kVocab, 2, kMargin, 0.0f);
  EXPECT_EQ(c[1].other.mean_nll, evaluate_perplexity(other_alone, tokens, o).mean_nll);

  // The one-engine form is the same computation.
  ScriptedEngine b2(kVocab, 1, kMargin, 0.0f), o2(kVocab, 2, kMargin, 0.0f);
  const DistributionComparison one = compare_distributions(b2, o2, tokens, o);
  EXPECT_EQ(one.mean_kl, c[1].mean_kl);
  EXPECT_EQ(one.top1_agreement, 0.0);
}

TEST(ReportKl, RejectsMismatchedEngines) {
  std::vector<int32_t> tokens(300, 1);
  PerplexityOptions o;
  o.ctx = 32;
  ScriptedEngine base(5, 1, 1.0f, 0.0f), other(6, 1, 1.0f, 0.0f);
  EXPECT_THROW(compare_distributions(base, other, tokens, o), Error);  // vocabularies differ
  o.ctx = 300;
  ScriptedEngine same(5, 1, 1.0f, 0.0f);
  EXPECT_THROW(compare_distributions(base, same, tokens, o), Error);  // longer than the engines take
}

TEST(ReportLatency, PercentilesByNearestRank) {
  std::vector<double> v;
  for (int i = 10; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(percentile_nearest_rank(v, 0.9), 9.0);
  EXPECT_EQ(percentile_nearest_rank(v, 1.0), 10.0);
  EXPECT_EQ(percentile_nearest_rank(v, 0.01), 1.0);
  EXPECT_EQ(median(v), 5.5);
  EXPECT_EQ(median({3.0, 1.0, 2.0}), 2.0);
  std::vector<double> w(128);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(i);
  EXPECT_EQ(percentile_nearest_rank(w, 0.9), 115.0);  // ceil(0.9 · 128) = 116th smallest
  EXPECT_THROW(percentile_nearest_rank({}, 0.5), Error);
  EXPECT_THROW(percentile_nearest_rank(v, 0.0), Error);
}

TEST(ReportLatency, DrivesPrefillAndDecodeAsSpecified) {
  ScriptedEngine e(50, 1, 1.0f, 0.0f);
  LatencyOptions o;
  o.prompt_len = 12;
  o.batches = {1, 3};
  o.decode_steps = 5;
  o.prefill_runs = 3;
  o.warmup_steps = 2;
  int64_t last_done = 0, last_total = 0;
  const LatencyResult r = measure_latency(e, o, {}, [&](int64_t done, int64_t total) {
    EXPECT_EQ(done, last_done + 1);
    last_done = done;
    last_total = total;
  });
  EXPECT_EQ(last_total, 3 + 2 * (2 + 5));
  EXPECT_EQ(last_done, last_total);
  ASSERT_EQ(r.prefill_ms.size(), 3u);
  EXPECT_EQ(r.prefill_median_ms, median(r.prefill_ms));
  EXPECT_GT(r.prefill_tokens_per_s, 0.0);
  ASSERT_EQ(r.decode.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const DecodeLatency& d = r.decode[i];
    EXPECT_EQ(d.batch, o.batches[i]);
    EXPECT_EQ(d.steps, 5);
    EXPECT_EQ(d.context, 14);
    ASSERT_EQ(d.step_ms.size(), 5u);
    EXPECT_EQ(d.median_ms, median(d.step_ms));
    EXPECT_EQ(d.p90_ms, percentile_nearest_rank(d.step_ms, 0.9));
    EXPECT_DOUBLE_EQ(d.tokens_per_s, static_cast<double>(d.batch) / (d.median_ms * 1e-3));
  }
  // 3 prefills + per batch B: B context fills + 7 steps.
  EXPECT_EQ(e.forward_calls, 3 + (1 + 7) + (3 + 7));
  for (int32_t s = 0; s < 3; ++s) EXPECT_EQ(e.sequence_length(s), 0) << "sequence " << s << " was not reset";
}

TEST(ReportLatency, HooksReplaceForwardAndLengthsAreChecked) {
  ScriptedEngine e(50, 1, 1.0f, 0.0f);
  LatencyOptions o;
  o.prompt_len = 10;
  o.batches = {2};
  o.decode_steps = 3;
  o.prefill_runs = 1;
  int fills = 0, steps = 0;
  LatencyHooks h;
  // A fill that appends the context without logits (as append_synthetic_context does) and a step that returns ids.
  h.fill_context = [&](int32_t seq, std::span<const int32_t> prompt) {
    ++fills;
    const SequenceChunk c{seq, std::vector<int32_t>(prompt.begin(), prompt.end())};
    e.forward(std::span<const SequenceChunk>(&c, 1), false);
  };
  h.decode_step = [&](std::span<const SequenceChunk> batch) {
    ++steps;
    e.forward(batch, false);
    return std::vector<int32_t>(batch.size(), 7);
  };
  measure_latency(e, o, h);
  EXPECT_EQ(fills, 2);
  EXPECT_EQ(steps, 2 + 3);

  h.fill_context = [&](int32_t, std::span<const int32_t>) {};  // fills nothing: caught
  EXPECT_THROW(measure_latency(e, o, h), Error);
  o.prompt_len = 252;  // 252 + 2 warm-up + 3 > 256
  EXPECT_THROW(measure_latency(e, o), Error);
  o.prompt_len = 10;
  o.batches = {0};
  EXPECT_THROW(measure_latency(e, o), Error);
}

TEST(ReportFit, GpuMemoryEstimateOfLlama8B) {
  const ModelConfig c = synthetic_config("llama-3.1-8b");
  // Per layer: q|k|v 6144 x 4096, o 4096 x 4096, gate|up 28672 x 4096, down 4096 x 14336.
  const int64_t proj = 6144LL * 4096 + 4096LL * 4096 + 28672LL * 4096 + 4096LL * 14336;
  const int64_t rest = 65LL * 4096 * 4 + 2LL * 128256 * 4096 * 2;  // fp32 norms; BF16 embedding and LM head
  const GpuMemoryEstimate full = estimate_gpu_memory(c, PrecisionRecipe::parse("full"), 1, 64, 16);
  EXPECT_EQ(full.weights, 32 * proj * 2 + rest);
  // One 64-token page per layer and KV head, bf16 K and V: 64 · 128 · 2 bytes · 2.
  EXPECT_EQ(full.kv_cache, 32LL * 8 * 64 * 128 * 2 * 2);
  const GpuMemoryEstimate int4 = estimate_gpu_memory(c, PrecisionRecipe::parse("int4-gptq-g128+kv-int4"), 32, 2048);
  EXPECT_EQ(int4.weights, 32 * (proj / 2 + proj / 128 * 2) + rest);
  const formats::KvPageLayout l = formats::kv_page_layout(formats::KvFormat::INT4, 128);
  EXPECT_EQ(int4.kv_cache, 32LL * (32 * 2048 / 64) * 8 * l.page_bytes);
  const GpuMemoryEstimate had = estimate_gpu_memory(c, PrecisionRecipe::parse("int4-gptq-g128+kv-int4-hadamard"), 32,
                                                    2048);
  EXPECT_EQ(had.kv_cache, int4.kv_cache + 32LL * 32 * 8 * 128 * 2);  // + fp16 key anchors
  EXPECT_GT(full.activations, 0);
  // The 8B model in BF16 is about 16 GB.
  EXPECT_NEAR(static_cast<double>(full.weights) / 1e9, 16.06, 0.05);
}

TEST(ReportFit, GroupSizeAndRecipeMismatch) {
  const ModelConfig big = synthetic_config("llama-3.1-8b");
  EXPECT_EQ(int4_group_for(big), 128);
  ModelConfig smol = big;  // SmolLM2-135M's projection inputs: 576 and 1536
  smol.hidden_size = 576;
  smol.num_attention_heads = 9;
  smol.num_key_value_heads = 3;
  smol.head_dim = 64;
  smol.intermediate_size = 1536;
  EXPECT_EQ(int4_group_for(smol), 64);
  ModelConfig stories = smol;  // stories260K: 64 and 172, head_dim 8
  stories.hidden_size = 64;
  stories.num_attention_heads = 8;
  stories.num_key_value_heads = 4;
  stories.head_dim = 8;
  stories.intermediate_size = 172;
  EXPECT_EQ(int4_group_for(stories), 0);
  EXPECT_EQ(recipe_model_mismatch(stories, PrecisionRecipe::parse("int4-rtn-gch")), "");
  EXPECT_NE(recipe_model_mismatch(stories, PrecisionRecipe::parse("int4-rtn-g32")).find("172"), std::string::npos);
  EXPECT_NE(recipe_model_mismatch(stories, PrecisionRecipe::parse("full+kv-int4")).find("head_dim 8"),
            std::string::npos);
  EXPECT_EQ(recipe_model_mismatch(big, PrecisionRecipe::parse("int4-gptq-g128+kv-int4-hadamard")), "");
}

// Tags open and close in order (a small check that the SVG is well-formed XML).
bool balanced_tags(const std::string& s, std::string* why) {
  std::vector<std::string> stack;
  size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const size_t end = s.find('>', i);
    if (end == std::string::npos) return *why = "unterminated tag", false;
    const std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag.back() == '/') continue;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return *why = "</" + name + "> does not close the open tag", false;
      stack.pop_back();
      continue;
    }
    stack.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
  }
  if (!stack.empty()) return *why = "<" + stack.back() + "> is never closed", false;
  return true;
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t i = s.find(needle); i != std::string::npos; i = s.find(needle, i + 1)) ++n;
  return n;
}

Report sample_report() {
  Report r;
  r.command_line = "futransformer report -m m.gguf --data wiki.txt";
  r.model = "m.gguf";
  r.data = "wiki.txt";
  r.device = "cpu reference engine (fp32)";
  r.commit = "abc1234";
  r.date = "2026-11-29T00:00:00Z";
  r.latency.batches = {1, 8};
  auto latency = [](double prefill, double d1, double d8) {
    LatencyResult l;
    l.prefill_ms = {prefill};
    l.prefill_median_ms = prefill;
    l.decode = {{1, 4, 2050, d1, d1 * 1.1, d1 * 0.9, 1e3 / d1, {d1}},
                {8, 4, 2050, d8, d8 * 1.1, d8 * 0.9, 8e3 / d8, {d8}}};
    return l;
  };
  ReportRow full;
  full.config = "full";
  full.device = "cpu reference";
  full.ppl = 10.5;
  full.quality_note = "baseline";
  full.latency = latency(100, 20, 30);
  ReportRow q;
  q.config = "int4-gptq-g128+kv-int4";
  q.device = "cpu reference";
  q.ppl = 11.25;
  q.mean_kl = 0.05;
  q.max_kl = 1.5;
  q.top1_agreement = 0.91;
  q.latency = latency(80, 8, 12);
  q.gpu_memory_bytes = int64_t{5} << 30;
  q.gpu_memory_detail = {{"weights", int64_t{4} << 30}, {"kv_cache", int64_t{1} << 30}, {"activations", 0},
                         {"workspace", 0}};
  ReportRow fp8;
  fp8.config = "fp8+act-fp8";
  fp8.not_run = "not run on this device: <fp8> & more";
  fp8.quality_note = "skipped: not run on this device";
  r.rows = {full, q, fp8};
  return r;
}

TEST(ReportOutput, MarkdownHasEveryTable) {
  const std::string md = report_markdown(sample_report());
  for (const char* h : {"| configuration | perplexity | vs full | mean KL (nats) | max KL | top-1 agreement |",
                        "| configuration | prompt tokens | median ms | tokens/s |",
                        "| configuration | batch | context | median ms/step | p90 ms/step | tokens/s |",
                        "| configuration | GPU memory held (GiB) |", "## Not run", "futransformer report -m m.gguf",
                        "+0.7500 (+7.14%)", "0.9100", "| int4-gptq-g128+kv-int4 | 5.00 | 4.00 | 1.00 |"})
    EXPECT_NE(md.find(h), std::string::npos) << "missing '" << h << "' in\n" << md;
  EXPECT_NE(md.find("skipped: not run on this device"), std::string::npos);
}

TEST(ReportOutput, JsonHoldsEveryRow) {
  const nlohmann::json j = nlohmann::json::parse(report_json(sample_report()).dump());
  ASSERT_EQ(j["rows"].size(), 3u);
  EXPECT_EQ(j["commit"], "abc1234");
  EXPECT_EQ(j["rows"][1]["quality"]["top1_agreement_vs_baseline"], 0.91);
  EXPECT_TRUE(j["rows"][0]["quality"]["mean_kl_vs_baseline"].is_null());
  EXPECT_TRUE(j["rows"][2]["latency"].is_null());
  EXPECT_EQ(j["rows"][1]["latency"]["decode"][1]["batch"], 8);
  EXPECT_EQ(j["latency_settings"]["batches"], nlohmann::json({1, 8}));
}

TEST(ReportOutput, SvgIsWellFormedWithOnePointPerConfigAndBatch) {
  const Report r = sample_report();
  const std::string svg = report_svg(r);
  std::string why;
  EXPECT_TRUE(balanced_tags(svg, &why)) << why << "\n" << svg;
  EXPECT_EQ(count(svg, "<circle"), 4u);  // 2 configurations with a perplexity × 2 batch sizes
  EXPECT_NE(svg.find("int4-gptq-g128+kv-int4 B=8"), std::string::npos);
  EXPECT_EQ(report_plot_points(r).size(), 4u);

  Report synthetic = r;
  synthetic.synthetic = true;
  for (ReportRow& row : synthetic.rows) row.ppl.reset();
  const std::string empty = report_svg(synthetic);
  EXPECT_TRUE(balanced_tags(empty, &why)) << why;
  EXPECT_EQ(count(empty, "<circle"), 0u);
  EXPECT_NE(empty.find("synthetic"), std::string::npos);

  // Labels with XML metacharacters stay well-formed.
  const std::string odd = svg_scatter_plot({{1, 2, "a<b & \"c\"", "s"}}, "t", "x", "y", "");
  EXPECT_TRUE(balanced_tags(odd, &why)) << why;
  EXPECT_NE(odd.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
}

TEST(ReportOutput, NiceTicks) {
  const std::vector<double> a = nice_ticks(0.0, 1.0, 6);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_DOUBLE_EQ(a[1], 0.2);
  EXPECT_DOUBLE_EQ(a.back(), 1.0);
  const std::vector<double> b = nice_ticks(113.0, 147.0, 6);  // step 10, widened to whole ticks
  EXPECT_EQ(b.front(), 110.0);
  EXPECT_EQ(b.back(), 150.0);
  EXPECT_EQ(b.size(), 5u);
  EXPECT_THROW(nice_ticks(1.0, 1.0, 5), Error);
  EXPECT_EQ(xml_escape("<&>'\""), "&lt;&amp;&gt;&apos;&quot;");
}

}  // namespace
}  // namespace futransformer::eval
