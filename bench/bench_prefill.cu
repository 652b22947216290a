// Prefill of the CUDA engine on synthetic Llama-3.1 shapes (weights made in GPU memory): the FP8 prefill path
// (gemm_fp8 with per-token FP8 inputs, docs/design.md "FP8 prefill") against the decode path running the prompt
// (W4A16 INT4 group 128), measured in the same process on engines with the same seed. Rows: the whole model
// ("step": every layer, the final norm and the LM head of the last token) and one decoder block (one layer, a
// 256-token vocabulary), each prompt one pass of `tokens` rows on a fresh sequence. Time: wall clock around
// forward() (it returns after the last token's logits are on the host), one warm-up, median of --iters runs.
// TFLOP/s counts the projections only (2 · tokens · parameters); attention (the decode kernel per row, the same in
// both paths) is inside the time but not the count.
//   bench_prefill [--json PATH] [--iters N] [--kv bf16|int4|int4-hadamard] [--configs a,b] [--tokens 2048,8192]
//                 [--profile]   (also per-op GPU times of the one-layer blocks, bench_op_profile.h)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_op_profile.h"
#include "futransformer/cuda_engine.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/io/synthetic.h"

using namespace futransformer;

namespace {

struct Row {
  std::string shape;  // "llama-3.1-8b step" / "llama-3.1-8b block"
  int layers = 0, tokens = 0;
  double int4_us = 0, fp8_us = 0, flops = 0;
};

double projection_flops(const ModelConfig& c, int tokens) {
  const double h = static_cast<double>(c.hidden_size), inter = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kvw = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double params = h * (q + 2 * kvw) + q * h + h * 2 * inter + inter * h;
  return 2.0 * tokens * params * static_cast<double>(c.num_hidden_layers);
}

// Median wall-clock µs of a `tokens`-token prompt on a fresh sequence (one untimed warm-up).
double time_prefill(CudaEngine& e, const std::vector<int32_t>& prompt, int iters) {
  const SequenceChunk chunk{0, prompt};
  std::vector<float> us;
  for (int i = 0; i <= iters; ++i) {
    e.reset(0);
    const auto t0 = std::chrono::steady_clock::now();
    e.forward(std::span(&chunk, 1));
    const float t = std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) us.push_back(t);
  }
  e.reset(0);
  return bench::median(us);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, kv_name = "int4-hadamard", configs = "llama-3.1-8b", token_list = "2048,8192";
  int iters = 5;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--kv" && i + 1 < argc) kv_name = argv[++i];
    else if (a == "--configs" && i + 1 < argc) configs = argv[++i];
    else if (a == "--tokens" && i + 1 < argc) token_list = argv[++i];
    else if (a == "--profile") profile = true;
    else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--iters N] [--kv bf16|int4|int4-hadamard] "
                           "[--configs llama-3.1-8b,llama-3.1-70b] [--tokens 2048,8192] [--profile]\n", argv[0]);
      return 2;
    }
  }
  constexpr int kGroup = 128;
  constexpr int kWholeModelTokens = 2048;  // the whole model runs at this prompt length only
  try {
    const formats::KvFormat kv = formats::parse_kv_format(kv_name);
    const bench::DeviceInfo d = bench::query_device();
    bench::print_device_summary(d);
    std::printf("\n");
    std::vector<int> token_counts;
    for (const std::string& t : bench::split_list(token_list)) token_counts.push_back(std::atoi(t.c_str()));

    std::vector<Row> rows;
    for (const std::string& name : bench::split_list(configs)) {
      for (const bool block : {false, true}) {
        ModelConfig c = synthetic_config(name);
        if (block) {
          c.num_hidden_layers = 1;
          c.vocab_size = 256;
        }
        std::vector<int> ts;
        for (const int t : token_counts)
          if (block || t == kWholeModelTokens) ts.push_back(t);
        if (ts.empty()) continue;
        const int max_t = *std::max_element(ts.begin(), ts.end());
        CudaEngineOptions o;
        o.kv = kv;
        o.max_sequences = 1;
        o.max_sequence_length = max_t;
        o.max_batch_tokens = max_t;  // each prompt is one pass
        std::vector<double> int4_us, fp8_us;
        for (const bool fp8 : {false, true}) {
          o.synthetic_fp8_prefill = fp8;
          std::unique_ptr<CudaEngine> e = make_synthetic_cuda_engine(c, kGroup, o);
          std::printf("%s%s: %s | GPU memory %.2f GB\n", name.c_str(), block ? " (1 layer)" : "",
                      e->description().c_str(), e->memory().total() / 1e9);
          std::mt19937 rng(1);
          std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
          for (const int t : ts) {
            std::vector<int32_t> prompt(static_cast<size_t>(t));
            for (int32_t& id : prompt) id = tok(rng);
            (fp8 ? fp8_us : int4_us).push_back(time_prefill(*e, prompt, iters));
          }
          // --profile: the one-layer blocks once more with per-op events (a separate engine: events change timing).
          if (profile && block) {
            CudaEngineOptions po = o;
            po.profile_ops = true;
            std::unique_ptr<CudaEngine> pe = make_synthetic_cuda_engine(c, kGroup, po);
            for (const int t : ts) {
              std::vector<int32_t> prompt(static_cast<size_t>(t));
              for (int32_t& id : prompt) id = tok(rng);
              constexpr int kRuns = 3;
              time_prefill(*pe, prompt, 1);  // warm-up (per-shape launcher caches)
              pe->clear_op_profile();
              time_prefill(*pe, prompt, kRuns - 1);  // a warm-up run plus kRuns - 1 timed: kRuns in the profile
              bench::print_op_profile(pe->op_profile(), name + " block, " + std::to_string(t) + " tokens, " +
                                                            (fp8 ? "FP8 prefill" : "INT4 path"), kRuns);
              pe->clear_op_profile();
            }
          }
        }
        for (size_t i = 0; i < ts.size(); ++i) {
          Row r;
          r.shape = name + (block ? " block" : " step");
          r.layers = static_cast<int>(c.num_hidden_layers);
          r.tokens = ts[i];
          r.int4_us = int4_us[i];
          r.fp8_us = fp8_us[i];
          r.flops = projection_flops(c, ts[i]);
          rows.push_back(r);
        }
      }
    }
    std::printf("\n| shape | layers | tokens | INT4 path ms | FP8 prefill ms | FP8 / INT4 | INT4 TFLOP/s | FP8 TFLOP/s | "
                "FP8 tok/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf("| %s | %d | %d | %.2f | %.2f | %.3f | %.0f | %.0f | %.0f |\n", r.shape.c_str(), r.layers, r.tokens,
                  r.int4_us / 1e3, r.fp8_us / 1e3, r.fp8_us / r.int4_us, r.flops / (r.int4_us * 1e6),
                  r.flops / (r.fp8_us * 1e6), r.tokens / (r.fp8_us * 1e-6));
    const int sm_now = bench::report_sm_clock_after_runs(d.dev);
    if (!json_path.empty()) {
      auto extra = [&](FILE* f) {
        std::fprintf(f, "  \"kv\": \"%s\",\n  \"int4_group\": %d,\n  \"iters\": %d,\n", kv_name.c_str(), kGroup, iters);
      };
      auto row = [&](FILE* f, size_t i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "    {\"shape\": \"%s\", \"layers\": %d, \"tokens\": %d, \"int4_path_us\": %.1f, "
                     "\"fp8_prefill_us\": %.1f, \"projection_flops\": %.0f}",
                     r.shape.c_str(), r.layers, r.tokens, r.int4_us, r.fp8_us, r.flops);
      };
      if (!bench::write_json(json_path, "prefill", d, sm_now, std::nullopt, extra, rows.size(), row)) return 1;
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_prefill: %s\n", ex.what());
    return 1;
  }
  return 0;
}
