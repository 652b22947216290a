// Prefill and decode latency through the Engine interface.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "futransformer/error.h"
#include "futransformer/eval/report.h"

namespace futransformer::eval {

double percentile_nearest_rank(std::vector<double> samples, double q) {
  check(!samples.empty(), "percentile: no samples");
  check(q > 0.0 && q <= 1.0, "percentile: q must be in (0, 1], got ", q);
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(q * static_cast<double>(samples.size()));
  const size_t idx = static_cast<size_t>(std::max(rank, 1.0)) - 1;
  return samples[std::min(idx, samples.size() - 1)];
}

double median(std::vector<double> samples) {
  check(!samples.empty(), "median: no samples");
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

int64_t latency_sequence_length(const LatencyOptions& o) { return o.prompt_len + o.warmup_steps + o.decode_steps; }

void check_latency_options(const LatencyOptions& o) {
  check(o.prompt_len >= 1, "--prompt-len must be at least 1, got ", o.prompt_len);
  check(o.decode_steps >= 1, "--decode-steps must be at least 1, got ", o.decode_steps);
  check(o.prefill_runs >= 1, "latency: prefill_runs must be at least 1, got ", o.prefill_runs);
  check(o.warmup_steps >= 0, "latency: warmup_steps must be >= 0, got ", o.warmup_steps);
  check(!o.batches.empty(), "--batch: no batch size given");
  for (int64_t b : o.batches) check(b >= 1, "--batch: batch sizes must be positive, got ", b);
}

LatencyResult measure_latency(Engine& engine, const LatencyOptions& o, const LatencyHooks& hooks,
                              const std::function<void(int64_t, int64_t)>& progress) {
  check_latency_options(o);
  check(latency_sequence_length(o) <= engine.max_sequence_length(), "latency: --prompt-len ", o.prompt_len,
        " + warm-up ", o.warmup_steps, " + --decode-steps ", o.decode_steps, " tokens exceed the engine's maximum ",
        "sequence length ", engine.max_sequence_length());
  const int64_t vocab = engine.config().vocab_size;
  const int64_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  // One prompt per sequence, drawn once: every run and batch size sees the same ids.
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(max_batch));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(o.prompt_len));
    for (int32_t& t : p) t = token(rng);
  }
  const int64_t total =
      o.prefill_runs + static_cast<int64_t>(o.batches.size()) * (o.warmup_steps + o.decode_steps);
  int64_t done = 0;
  auto tick = [&] {
    ++done;
    if (progress) progress(done, total);
  };
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };

  LatencyResult r;
  for (int64_t run = 0; run < o.prefill_runs; ++run) {
    engine.reset(0);
    const SequenceChunk chunk{0, prompts[0]};
    const auto t0 = clock::now();
    const std::vector<std::vector<float>> out = engine.forward(std::span<const SequenceChunk>(&chunk, 1), false);
    r.prefill_ms.push_back(ms_since(t0));
    check(out.size() == 1 && static_cast<int64_t>(out[0].size()) == vocab, "latency: prefill returned ",
          out.empty() ? 0 : out[0].size(), " logits, expected ", vocab);
    engine.reset(0);
    tick();
  }
  r.prefill_median_ms = median(r.prefill_ms);
  r.prefill_tokens_per_s = static_cast<double>(o.prompt_len) / (r.prefill_median_ms * 1e-3);

  auto fill = [&](int32_t seq, std::span<const int32_t> prompt) {
    if (hooks.fill_context) return hooks.fill_context(seq, prompt);
    const SequenceChunk chunk{seq, std::vector<int32_t>(prompt.begin(), prompt.end())};
    engine.forward(std::span<const SequenceChunk>(&chunk, 1), false);
  };
  auto step = [&](std::span<const SequenceChunk> batch) {
    if (hooks.decode_step) return hooks.decode_step(batch);
    const std::vector<std::vector<float>> out = engine.forward(batch, false);
    std::vector<int32_t> ids;
    for (const std::vector<float>& l : out) ids.push_back(static_cast<int32_t>(argmax(l)));
    return ids;
  };
  for (int64_t b : o.batches) {
    for (int32_t s = 0; s < b; ++s) {
      engine.reset(s);
      fill(s, prompts[static_cast<size_t>(s)]);
      check(engine.sequence_length(s) == o.prompt_len, "latency: sequence ", s, " holds ", engine.sequence_length(s),
            " tokens after its context fill, expected ", o.prompt_len);
    }
    std::vector<SequenceChunk> batch(static_cast<size_t>(b));
    for (int32_t s = 0; s < b; ++s) batch[static_cast<size_t>(s)] = {s, {prompts[static_cast<size_t>(s)].back()}};
    DecodeLatency d;
    d.batch = b;
    d.steps = o.decode_steps;
    d.context = o.prompt_len + o.warmup_steps;
    for (int64_t i = 0; i < o.warmup_steps + o.decode_steps; ++i) {
      const auto t0 = clock::now();
      const std::vector<int32_t> ids = step(batch);
      const double ms = ms_since(t0);
      check(static_cast<int64_t>(ids.size()) == b, "latency: a decode step returned ", ids.size(), " ids for ", b,
            " sequences");
      if (i >= o.warmup_steps) d.step_ms.push_back(ms);
      for (size_t s = 0; s < batch.size(); ++s) batch[s].tokens[0] = ids[s];
      tick();
    }
    d.median_ms = median(d.step_ms);
    d.p90_ms = percentile_nearest_rank(d.step_ms, 0.9);
    d.min_ms = *std::min_element(d.step_ms.begin(), d.step_ms.end());
    d.tokens_per_s = static_cast<double>(b) / (d.median_ms * 1e-3);
    for (int32_t s = 0; s < b; ++s) engine.reset(s);
    r.decode.push_back(std::move(d));
  }
  return r;
}

}  // namespace futransformer::eval
