// Prefill of the CUDA engine on synthetic Llama-3.1 shapes (weights made in GPU memory): the FP8 prefill path
// (gemm_fp8 with per-token FP8 inputs, docs/design.md "FP8 prefill") against the INT4 engine running the prompt
// (group 128) — by default its projections dequantised to BF16 + cuBLAS for passes of at least
// CudaEngineOptions::int4_dequant_min_rows rows (FT_INT4_DEQUANT_MIN_ROWS, else 192; docs/design.md "INT4 projections
// at prefill sizes"), and, unless --no-loop, the same engine with that path off (the W4A16 GEMM in 64-row launches,
// "INT4 loop") — measured in the same process on engines with the same seed. Rows: the whole model
// ("step": every layer, the final norm and the LM head of the last token) and one decoder block (one layer, a
// 256-token vocabulary), each prompt one pass of `tokens` rows on a fresh sequence. Time: wall clock around
// forward() (it returns after the last token's logits are on the host), one warm-up, median of --iters runs.
// TFLOP/s counts the projections only (2 · tokens · parameters); attention (the decode kernel per row, the same in
// both paths) is inside the time but not the count.
//   bench_prefill [--json PATH] [--iters N] [--kv bf16|int4|int4-hadamard] [--configs a,b] [--tokens 2048,8192]
//                 [--no-loop]   (skip the INT4 64-row-loop engine)
//                 [--profile]   (also per-op GPU times of the one-layer blocks, bench_op_profile.h)
//                 [--trace PATH] (the kernel timeline of one whole-model FP8 prefill per token count, through CUPTI
//                                 (bench/kernel_trace.h): per-name totals, busy / idle time and the mean layer kernel
//                                 by kernel, printed and written to PATH as JSON; needs a build with CUPTI)
// Environment: FT_FP8_BLOCK_SWIGLU=1 runs the FP8 engine with CudaEngineOptions::fp8_block_swiglu (the down input per
// token per 128 channels; SwiGLU → FP8 in the gate|up GEMM's epilogue); FT_PREFILL_UNROTATE=1 every engine with
// CudaEngineOptions::fused_prefill_unrotation (int4-hadamard output un-rotated in the prefill attention's store);
// FT_UNROTATE_FP8=0 every engine without CudaEngineOptions::fused_unrotate_fp8 (un-rotation + FP8 of the o GEMM's
// input in one kernel, the default); FT_FP8_QKV_EPILOGUE=1 with CudaEngineOptions::fused_fp8_qkv (RoPE, q rotation and
// INT4 cache placement in the FP8 qkv GEMM's epilogue); FT_FP8_ROPE=1 with CudaEngineOptions::fused_fp8_rope (RoPE
// alone in the FP8 qkv GEMM's epilogue);
// FT_PREFILL_ATTENTION and FT_QKV_QUAD choose kernels (src/cuda/attention_prefill_internal.h, fused_ops_internal.h).
// Compare each with a run without it in the same call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_op_profile.h"
#include "kernel_trace.h"
#include "cuda/engine/int4_dequant_heuristics.h"
#include "futransformer/cuda_engine.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/io/synthetic.h"

using namespace futransformer;

namespace {

struct Row {
  std::string shape;  // "llama-3.1-8b step" / "llama-3.1-8b block"
  int layers = 0, tokens = 0;
  double int4_us = 0, loop_us = 0, fp8_us = 0, flops = 0;  // loop_us 0: not measured
};

// --trace: the kernels of one whole-model FP8 prefill (host-launched, so every kernel of the pass is in the window;
// the second of two passes traced back to back).
struct TraceRow {
  std::string shape;
  int layers = 0, tokens = 0;
  double wall_us = 0;  // wall clock of the second traced forward (CUPTI adds a little per kernel)
  size_t dropped = 0, incomplete = 0;
  bench::Timeline timeline;
  std::optional<bench::LayerPattern> layer_pattern;
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
  std::string json_path, trace_path, kv_name = "int4-hadamard", configs = "llama-3.1-8b", token_list = "2048,8192";
  int iters = 5;
  bool profile = false, loop = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--kv" && i + 1 < argc) kv_name = argv[++i];
    else if (a == "--configs" && i + 1 < argc) configs = argv[++i];
    else if (a == "--tokens" && i + 1 < argc) token_list = argv[++i];
    else if (a == "--profile") profile = true;
    else if (a == "--trace" && i + 1 < argc) trace_path = argv[++i];
    else if (a == "--no-loop") loop = false;
    else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--iters N] [--kv bf16|int4|int4-hadamard] "
                           "[--configs llama-3.1-8b,llama-3.1-70b] [--tokens 2048,8192] [--no-loop] [--profile] "
                           "[--trace PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!trace_path.empty() && !bench::KernelTrace::available()) {
    std::fprintf(stderr, "bench_prefill: --trace: %s\n", bench::kNoCuptiReason);
    return 2;
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
    std::vector<TraceRow> trace_rows;
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
        std::vector<double> int4_us, loop_us, fp8_us;
        // The engines: INT4 (default dequantise threshold), INT4 with that path off (64-row W4A16 launches), FP8.
        enum class Path { int4, loop, fp8 };
        std::vector<Path> paths = {Path::int4};
        if (loop) paths.push_back(Path::loop);
        paths.push_back(Path::fp8);
        for (const Path path : paths) {
          const bool fp8 = path == Path::fp8;
          o.synthetic_fp8_prefill = fp8;
          const char* blk = std::getenv("FT_FP8_BLOCK_SWIGLU");
          o.fp8_block_swiglu = fp8 && blk != nullptr && blk[0] == '1';
          const char* unrot = std::getenv("FT_PREFILL_UNROTATE");  // CudaEngineOptions::fused_prefill_unrotation
          o.fused_prefill_unrotation = unrot != nullptr && unrot[0] == '1';
          const char* unrot8 = std::getenv("FT_UNROTATE_FP8");  // CudaEngineOptions::fused_unrotate_fp8
          o.fused_unrotate_fp8 = !(unrot8 != nullptr && unrot8[0] == '0');
          const char* qkv_epi = std::getenv("FT_FP8_QKV_EPILOGUE");  // CudaEngineOptions::fused_fp8_qkv
          o.fused_fp8_qkv = qkv_epi != nullptr && qkv_epi[0] == '1';
          const char* rope8 = std::getenv("FT_FP8_ROPE");  // CudaEngineOptions::fused_fp8_rope
          o.fused_fp8_rope = rope8 != nullptr && rope8[0] == '1';
          o.int4_dequant_min_rows = path == Path::loop ? 0 : -1;
          std::vector<double>& times = fp8 ? fp8_us : (path == Path::loop ? loop_us : int4_us);
          const char* label = fp8 ? "FP8 prefill" : (path == Path::loop ? "INT4 64-row loop" : "INT4 path");
          std::unique_ptr<CudaEngine> e = make_synthetic_cuda_engine(c, kGroup, o);
          std::printf("%s%s: %s | GPU memory %.2f GB (INT4 dequantisation scratch %.2f GB)\n", name.c_str(),
                      block ? " (1 layer)" : "", e->description().c_str(), e->memory().total() / 1e9,
                      e->memory().int4_dequant_scratch / 1e9);
          std::mt19937 rng(1);
          std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
          for (const int t : ts) {
            std::vector<int32_t> prompt(static_cast<size_t>(t));
            for (int32_t& id : prompt) id = tok(rng);
            times.push_back(time_prefill(*e, prompt, iters));
            if (!trace_path.empty() && fp8 && !block) {
              TraceRow tr;
              tr.shape = name + " step";
              tr.layers = static_cast<int>(c.num_hidden_layers);
              tr.tokens = t;
              const SequenceChunk chunk{0, prompt};
              e->reset(0);
              // CUPTI's first launches after start() delay the pass's first kernels by a few ms (3.56 ms before
              // layer 0 in the twentieth session's trace), so the window holds two passes and only the second
              // one's kernels are kept (bench::last_of_identical_passes).
              bench::KernelTrace trace;
              trace.start();
              e->forward(std::span(&chunk, 1));
              e->reset(0);
              const auto t0 = std::chrono::steady_clock::now();
              e->forward(std::span(&chunk, 1));
              tr.wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
              std::vector<bench::KernelRecord> records = trace.stop();
              tr.dropped = trace.dropped();
              tr.incomplete = trace.incomplete();
              e->reset(0);
              std::string why;
              std::optional<std::vector<bench::KernelRecord>> second =
                  bench::last_of_identical_passes(std::move(records), 2, &why);
              if (!second) throw std::runtime_error("--trace: " + why);
              tr.timeline = bench::make_timeline(std::move(*second));
              tr.layer_pattern = bench::find_layer_pattern(tr.timeline, static_cast<size_t>(tr.layers));
              char title[160];
              std::snprintf(title, sizeof title, "%s, FP8 prefill of %d tokens (traced wall %.1f µs)",
                            tr.shape.c_str(), t, tr.wall_us);
              bench::print_timeline(tr.timeline, title, false);
              if (tr.layer_pattern) bench::print_layer_positions(tr.timeline, *tr.layer_pattern);
              else std::printf("no repeated layer sequence found among %zu kernels\n", tr.timeline.kernels.size());
              trace_rows.push_back(std::move(tr));
            }
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
              bench::print_op_profile(pe->op_profile(), name + " block, " + std::to_string(t) + " tokens, " + label,
                                      kRuns);
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
          r.loop_us = loop ? loop_us[i] : 0;
          r.fp8_us = fp8_us[i];
          r.flops = projection_flops(c, ts[i]);
          rows.push_back(r);
        }
      }
    }
    // "INT4 path" is what the engine runs by default; "INT4 loop" the W4A16 GEMM at every pass size (loop / path > 1:
    // the dequantise + cuBLAS path is faster).
    std::printf("\n| shape | layers | tokens | INT4 path ms | INT4 loop ms | loop / path | FP8 prefill ms | "
                "FP8 / INT4 | INT4 TFLOP/s | INT4 loop TFLOP/s | FP8 TFLOP/s | FP8 tok/s |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      char loop_ms[32] = "-", ratio[32] = "-", loop_tf[32] = "-";
      if (r.loop_us > 0) {
        std::snprintf(loop_ms, sizeof loop_ms, "%.2f", r.loop_us / 1e3);
        std::snprintf(ratio, sizeof ratio, "%.3f", r.loop_us / r.int4_us);
        std::snprintf(loop_tf, sizeof loop_tf, "%.0f", r.flops / (r.loop_us * 1e6));
      }
      std::printf("| %s | %d | %d | %.2f | %s | %s | %.2f | %.3f | %.0f | %s | %.0f | %.0f |\n", r.shape.c_str(),
                  r.layers, r.tokens, r.int4_us / 1e3, loop_ms, ratio, r.fp8_us / 1e3, r.fp8_us / r.int4_us,
                  r.flops / (r.int4_us * 1e6), loop_tf, r.flops / (r.fp8_us * 1e6), r.tokens / (r.fp8_us * 1e-6));
    }
    const int sm_now = bench::report_sm_clock_after_runs(d.dev);
    if (!json_path.empty()) {
      auto extra = [&](FILE* f) {
        std::fprintf(f, "  \"kv\": \"%s\",\n  \"int4_group\": %d,\n  \"iters\": %d,\n", kv_name.c_str(), kGroup, iters);
        std::fprintf(f, "  \"int4_dequant_min_rows\": %lld,\n",
                     static_cast<long long>(cuda::int4_dequant_min_rows_from_env(-1, false)));
      };
      auto row = [&](FILE* f, size_t i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "    {\"shape\": \"%s\", \"layers\": %d, \"tokens\": %d, \"int4_path_us\": %.1f, "
                     "\"int4_loop_us\": %s, \"fp8_prefill_us\": %.1f, \"projection_flops\": %.0f}",
                     r.shape.c_str(), r.layers, r.tokens, r.int4_us,
                     r.loop_us > 0 ? std::to_string(r.loop_us).c_str() : "null", r.fp8_us, r.flops);
      };
      if (!bench::write_json(json_path, "prefill", d, sm_now, std::nullopt, extra, rows.size(), row)) return 1;
    }
    if (!trace_path.empty()) {
      auto extra = [&](FILE* f) {
        std::fprintf(f, "  \"kv\": \"%s\",\n  \"int4_group\": %d,\n", kv_name.c_str(), kGroup);
      };
      auto row = [&](FILE* f, size_t i) {
        const TraceRow& r = trace_rows[i];
        std::fprintf(f,
                     "    {\"shape\": \"%s\", \"layers\": %d, \"tokens\": %d, \"traced_wall_us\": %.1f, "
                     "\"dropped_records\": %zu, \"records_without_timestamps\": %zu,\n     ",
                     r.shape.c_str(), r.layers, r.tokens, r.wall_us, r.dropped, r.incomplete);
        if (r.layer_pattern)
          std::fprintf(f, "\"layer_pattern\": {\"first\": %zu, \"period\": %zu, \"repeats\": %zu},\n     ",
                       r.layer_pattern->first, r.layer_pattern->period, r.layer_pattern->repeats);
        bench::write_timeline_json(f, r.timeline);
        std::fprintf(f, "}");
      };
      if (!bench::write_json(trace_path, "prefill_trace", d, sm_now, std::nullopt, extra, trace_rows.size(), row))
        return 1;
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_prefill: %s\n", ex.what());
    return 1;
  }
  return 0;
}
