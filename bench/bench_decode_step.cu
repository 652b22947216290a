// The whole decode step and one decoder block of the CUDA engine on synthetic Llama-3.1 shapes (weights made in
// GPU memory): INT4 weights (group 128, W4A16) + a paged KV cache at a given context, batch 1/8/32, each step one
// CUDA graph replay; a "block" row is a one-layer model with a 256-token vocabulary. Reports graph time (CUDA
// events around the replay), host step time (forward_greedy wall clock: metadata upload + replay + id download),
// tokens/s, and the memory roofline: bytes every step must read (INT4 weights + scales, the LM head, norms, the
// cache of every sequence) over the measured copy bandwidth. Step rows run once per LM head of --heads: bf16 (tied
// to the BF16 embedding, cuBLAS) and int4 (head-int4: its own INT4 copy, group 128, BF16 scales, W4A16 GEMM), each
// int4 row with its ratio to the bf16 row of the same shape and batch, measured in the same process. Every row runs
// once per mode of --epilogues: fused (CudaEngineOptions::fused_epilogues, the default: the INT4 o / down GEMMs add
// into the residual stream and gate|up applies SwiGLU in their epilogues; when the qkv GEMM splits K, RoPE + KV
// append + q rotation run in its split-K reduce) and unfused (separate residual + RMSNorm, SwiGLU, attention
// prologue and un-rotation kernels); fused rows carry their ratio to the unfused row of the same shape, head and batch.
// Environment: FT_QKV_PROLOGUE=0 keeps the attention prologue's own kernel on fused rows; FT_NORM_PROLOGUE=1 runs the
// attention and MLP RMSNorms inside the qkv and gate|up GEMMs on fused rows of batch <= 8
// (CudaEngineOptions::fused_norm_prologue, off by default: measured slower); FT_NORM_PARTIALS=1 the same with the row
// sums from the residual GEMMs (fused_norm_partials); FT_L2_PREFETCH_GATE_UP=f prefetches that fraction of each
// layer's gate|up weight into L2 after its qkv GEMM (l2_prefetch_gate_up, off by default; FT_L2_PREFETCH_O=f and
// FT_L2_PREFETCH_DOWN=f the same for the o and down weights); FT_UNROTATE_IN_COMBINE=0 keeps the
// separate un-rotation kernel after a split int4-hadamard attention on fused rows
// (CudaEngineOptions::fused_attention_unrotation, on by default); FT_ATTN_PROLOGUE=1 runs the attention prologue in the
// decode attention where the qkv GEMM splits K (CudaEngineOptions::fused_attention_prologue, off by default), =all
// also where it does not (attention_prologue_unsplit); both measured slower on some points; FT_ATTN_EARLY_COPIES=0
// turns CudaEngineOptions::decode_attention_early_copies off.
// --trace PATH: after each row's timing, the in-graph kernel timeline (bench/kernel_trace.h, CUPTI): kTraceReplays
// more replays of the row's step graph (plus benchmark_decode_step's two forward_greedy steps, also replays) are
// traced, split into replays by graph node, and the median replay by span is printed — block rows kernel by kernel
// (grid, block, start offset, duration, gap to the previous kernel's end: negative where programmatic dependent
// launch overlaps it), step rows as a per-kernel-name and per-layer-position summary — and written to PATH as JSON.
// CUPTI adds a little to every kernel, so a traced span runs slightly longer than the untraced graph time beside it.
// Needs a build with CUPTI (FT_HAVE_CUPTI); without it --trace fails before any GPU work.
//   bench_decode_step [--json PATH] [--iters N] [--context C] [--kv bf16|int4|int4-hadamard] [--configs a,b]
//                     [--batches 1,8,32] [--heads bf16,int4] [--epilogues fused,unfused] [--profile] [--trace PATH]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_op_profile.h"
#include "kernel_trace.h"
#include "futransformer/cuda_engine.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/io/synthetic.h"
#include "futransformer/recipe.h"

using namespace futransformer;

namespace {

struct Row {
  std::string shape;  // "llama-3.1-8b step" / "llama-3.1-8b block"
  std::string head;   // "bf16" / "int4"
  bool fused = true;  // CudaEngineOptions::fused_epilogues
  int batch = 0, context = 0, layers = 0;
  double graph_us = 0, graph_p90_us = 0, host_us = 0, bytes = 0, roofline_us = 0;
};

// --trace: the median graph replay of one row (bench/kernel_trace.h).
struct TraceRow {
  Row row;                          // the timed row it belongs to (its graph_us: the untraced median)
  size_t records = 0, dropped = 0, incomplete = 0;  // kernel records; records CUPTI dropped / gave no timestamps
  bool fresh_engine = false;        // traced on a new engine whose graph was captured under tracing
  bench::ReplaySplit split;         // replays of the window (kernels kept only for the median one)
  std::vector<double> spans_us;     // every complete replay's span, in launch order
  size_t median = 0;                // index into spans_us
  bench::Timeline timeline;         // the median replay
  std::optional<bench::LayerPattern> layer_pattern;
  std::string error;                // why there is no timeline
};

// Bytes one decode step must read: every projection's INT4 codes + F16 group scales, the LM head (vocab × hidden,
// read once: BF16, or INT4 codes + BF16 group scales over the vocabulary padded to the W4A16 GEMM's 32 rows), norms,
// one embedding row per sequence, and each sequence's whole cache (K and V, all layers).
double step_bytes(const ModelConfig& c, int group, int batch, int context, formats::KvFormat kv, bool int4_head) {
  const double h = static_cast<double>(c.hidden_size), inter = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kvw = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double params = h * (q + 2 * kvw) + q * h + h * 2 * inter + inter * h;
  const double per_layer = params * 0.5 + params / group * 2 + 2 * h * 4;
  const formats::KvPageLayout layout = formats::kv_page_layout(kv, c.head_dim);
  const double cache = static_cast<double>(batch) * context * static_cast<double>(c.num_key_value_heads) *
                       static_cast<double>(layout.bytes_per_token());
  double b = static_cast<double>(c.num_hidden_layers) * (per_layer + cache);
  const double head_rows = static_cast<double>((c.vocab_size + 31) / 32 * 32);
  const double head_group = static_cast<double>(head_int4_spec(c.hidden_size, "bench").group_size);
  const double head = int4_head ? head_rows * h * 0.5 + head_rows * (h / head_group) * 2
                                : static_cast<double>(c.vocab_size) * h * 2;
  b += head + h * 4 + batch * h * 2;
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  bool profile = false;  // --profile: per-op GPU times of the one-layer blocks (no graphs; bench_op_profile.h)
  std::string json_path, trace_path, kv_name = "int4-hadamard", configs = "llama-3.1-8b,llama-3.1-70b";
  std::string batches = "1,8,32";
  std::string heads = "bf16,int4", epilogues = "fused,unfused";
  int iters = 50, context = 1024;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::max(5, std::atoi(argv[++i]));
    else if (a == "--context" && i + 1 < argc) context = std::max(1, std::atoi(argv[++i]));
    else if (a == "--kv" && i + 1 < argc) kv_name = argv[++i];
    else if (a == "--configs" && i + 1 < argc) configs = argv[++i];
    else if (a == "--batches" && i + 1 < argc) batches = argv[++i];
    else if (a == "--heads" && i + 1 < argc) heads = argv[++i];
    else if (a == "--epilogues" && i + 1 < argc) epilogues = argv[++i];
    else if (a == "--profile") profile = true;
    else if (a == "--trace" && i + 1 < argc) trace_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--iters N] [--context C] [--kv bf16|int4|int4-hadamard] "
                           "[--configs llama-3.1-8b,llama-3.1-70b] [--batches 1,8,32] [--heads bf16,int4] "
                           "[--epilogues fused,unfused] [--profile] [--trace PATH]\n", argv[0]);
      return 2;
    }
  }
  if (!trace_path.empty() && !bench::KernelTrace::available()) {
    std::fprintf(stderr, "bench_decode_step: --trace: %s\n", bench::kNoCuptiReason);
    return 2;
  }
  std::vector<bool> int4_heads;
  for (const std::string& hd : bench::split_list(heads)) {
    if (hd != "bf16" && hd != "int4") {
      std::fprintf(stderr, "bench_decode_step: --heads takes bf16 and/or int4, got '%s'\n", hd.c_str());
      return 2;
    }
    int4_heads.push_back(hd == "int4");
  }
  std::vector<bool> fused_modes;
  for (const std::string& m : bench::split_list(epilogues)) {
    if (m != "fused" && m != "unfused") {
      std::fprintf(stderr, "bench_decode_step: --epilogues takes fused and/or unfused, got '%s'\n", m.c_str());
      return 2;
    }
    fused_modes.push_back(m == "fused");
  }
  constexpr int kGroup = 128;
  constexpr int kTraceReplays = 5;  // --trace: graph replays per traced row (benchmark_decode_step adds its two steps)
  try {
    const formats::KvFormat kv = formats::parse_kv_format(kv_name);
    const bench::DeviceInfo d = bench::query_device();
    bench::print_device_summary(d);
    cudaStream_t s0 = nullptr;
    const double copy_tbps = bench::device_copy_tbps(s0);
    std::printf(" | copy %.2f TB/s\n", copy_tbps);
    std::vector<int> bs;
    for (const std::string& b : bench::split_list(batches)) bs.push_back(std::atoi(b.c_str()));
    const int max_batch = *std::max_element(bs.begin(), bs.end());

    std::vector<Row> rows;
    std::vector<TraceRow> trace_rows;
    // (block, INT4 head, fused epilogues): the step once per head; the block (256-token vocabulary) with the BF16
    // head only; each once per epilogue mode.
    struct Variant {
      bool block, int4_head, fused;
    };
    std::vector<Variant> variants;
    for (const bool int4_head : int4_heads)
      for (const bool fused : fused_modes) variants.push_back({false, int4_head, fused});
    for (const bool fused : fused_modes) variants.push_back({true, false, fused});
    for (const std::string& name : bench::split_list(configs)) {
      for (const auto& [block, int4_head, fused] : variants) {
        ModelConfig c = synthetic_config(name);
        // One decoder block: a single layer with a 256-token vocabulary, so the embedding and head add ~1 µs of
        // their own instead of the real head's 1 GB (8B) read.
        if (block) {
          c.num_hidden_layers = 1;
          c.vocab_size = 256;
        }
        CudaEngineOptions o;
        o.kv = kv;
        o.max_sequences = max_batch;
        o.max_sequence_length = context + 8;
        o.max_batch_tokens = 64;
        o.synthetic_int4_head = int4_head;
        o.fused_epilogues = fused;
        // The fused rows run the attention prologue in the qkv GEMM's split-K reduce where K is split
        // (CudaEngineOptions::fused_qkv_prologue, the default); FT_QKV_PROLOGUE=0 keeps the two kernels there.
        const char* qp = std::getenv("FT_QKV_PROLOGUE");
        o.fused_qkv_prologue = fused && !(qp != nullptr && qp[0] == '0');
        // FT_UNROTATE_IN_COMBINE=0: CudaEngineOptions::fused_attention_unrotation off on the fused rows.
        const char* uc = std::getenv("FT_UNROTATE_IN_COMBINE");
        o.fused_attention_unrotation = fused && !(uc != nullptr && uc[0] == '0');
        // FT_ATTN_PROLOGUE=1: CudaEngineOptions::fused_attention_prologue on the fused rows (off by default); =all:
        // also where the qkv GEMM does not split K (attention_prologue_unsplit).
        const char* ap = std::getenv("FT_ATTN_PROLOGUE");
        o.fused_attention_prologue = fused && ap != nullptr && (ap[0] == '1' || std::string(ap) == "all");
        o.attention_prologue_unsplit = ap != nullptr && std::string(ap) == "all";
        // FT_ATTN_EARLY_COPIES=0: CudaEngineOptions::decode_attention_early_copies off (every row).
        const char* ec = std::getenv("FT_ATTN_EARLY_COPIES");
        o.decode_attention_early_copies = !(ec != nullptr && ec[0] == '0');
        // FT_NORM_PROLOGUE=1: CudaEngineOptions::fused_norm_prologue on the fused rows (batches of at most 8).
        const char* np = std::getenv("FT_NORM_PROLOGUE");
        o.fused_norm_prologue = fused && np != nullptr && np[0] == '1';
        // FT_NORM_PARTIALS=1: CudaEngineOptions::fused_norm_partials (the norm prologues with the row sums written
        // by the o / down GEMMs' reduce) on the fused rows.
        const char* npp = std::getenv("FT_NORM_PARTIALS");
        o.fused_norm_partials = fused && npp != nullptr && npp[0] == '1';
        // FT_L2_PREFETCH_GATE_UP=f: CudaEngineOptions::l2_prefetch_gate_up (that fraction of each layer's gate|up
        // weight prefetched into L2 on a side branch after its qkv GEMM), every row.
        if (const char* pf = std::getenv("FT_L2_PREFETCH_GATE_UP")) o.l2_prefetch_gate_up = std::atof(pf);
        if (const char* pd = std::getenv("FT_L2_PREFETCH_DOWN")) o.l2_prefetch_down = std::atof(pd);
        if (const char* po = std::getenv("FT_L2_PREFETCH_O")) o.l2_prefetch_o = std::atof(po);
        // FT_RESIDUAL_NORM=0|1: CudaEngineOptions::fused_residual_norm (the norm after the o / down GEMMs in their
        // split-K reduce; on by default up to fused_residual_norm_max_rows rows, FT_RESIDUAL_NORM_MAX_ROWS=n).
        if (const char* rn = std::getenv("FT_RESIDUAL_NORM")) o.fused_residual_norm = rn[0] == '1';
        if (const char* rm = std::getenv("FT_RESIDUAL_NORM_MAX_ROWS")) o.fused_residual_norm_max_rows = std::atoi(rm);
        // FT_QKV_TAIL=0|1: CudaEngineOptions::fused_qkv_tail (the qkv prologue in the unsplit GEMM's own tail).
        if (const char* qt = std::getenv("FT_QKV_TAIL")) o.fused_qkv_tail = qt[0] == '1';
        // FT_QKV_TAIL_ROWS=lo:hi: the rows it applies to (CudaEngineOptions::fused_qkv_tail_min_rows / max_rows).
        if (const char* qr = std::getenv("FT_QKV_TAIL_ROWS")) {
          int lo = 0, hi = 0;
          if (std::sscanf(qr, "%d:%d", &lo, &hi) == 2) {
            o.fused_qkv_tail_min_rows = lo;
            o.fused_qkv_tail_max_rows = hi;
          } else {
            std::fprintf(stderr, "FT_QKV_TAIL_ROWS='%s' is not lo:hi; ignored\n", qr);
          }
        }
        // FT_L2_PREFETCH_AFTER_ATTENTION=1, FT_L2_PREFETCH_CTAS=n: where the prefetch branch forks, its CTAs.
        if (const char* pa = std::getenv("FT_L2_PREFETCH_AFTER_ATTENTION")) o.l2_prefetch_after_attention = pa[0] == '1';
        if (const char* pc = std::getenv("FT_L2_PREFETCH_CTAS")) o.l2_prefetch_ctas = std::atoi(pc);
        if (const char* pt = std::getenv("FT_L2_PREFETCH_THREADS")) o.l2_prefetch_threads = std::atoi(pt);
        if (const char* pm = std::getenv("FT_L2_PREFETCH_MAX_ROWS")) o.l2_prefetch_max_rows = std::atoi(pm);
        std::unique_ptr<CudaEngine> e = make_synthetic_cuda_engine(c, kGroup, o);
        std::printf("%s%s: %s | GPU memory %.2f GB\n", name.c_str(), block ? " (1 layer)" : "", e->description().c_str(),
                    e->memory().total() / 1e9);
        for (const int b : bs) {
          std::vector<SequenceChunk> batch;
          for (int i = 0; i < b; ++i) {
            e->append_synthetic_context(i, context - 3);  // the two benchmark steps and the replayed one follow
            batch.push_back({i, {i + 1}});
          }
          const CudaEngine::StepTiming t = e->benchmark_decode_step(batch, iters);
          std::vector<float> host;
          for (int i = 0; i < 5; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            e->forward_greedy(batch);
            host.push_back(std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0).count());
            for (const SequenceChunk& sc : batch) {  // back to the same context for the next timed step
              e->reset(sc.seq_id);
              e->append_synthetic_context(sc.seq_id, context - 1);
            }
          }
          for (const SequenceChunk& sc : batch) e->reset(sc.seq_id);
          Row r;
          r.shape = name + (block ? " block" : " step");
          r.head = int4_head ? "int4" : "bf16";
          r.fused = fused;
          r.batch = b;
          r.context = context;
          r.layers = static_cast<int>(c.num_hidden_layers);
          r.graph_us = t.median_us;
          r.graph_p90_us = t.p90_us;
          r.host_us = bench::median(host);
          if (!trace_path.empty()) {
            TraceRow tr;
            tr.row = r;
            // One tracing window around benchmark_decode_step on `eng` (the sequences placed as for the timed
            // step, reset after). A CUPTI failure becomes tr.error and the run goes on; engine errors end it.
            auto traced_step = [&](CudaEngine& eng) {
              for (int i = 0; i < b; ++i) eng.append_synthetic_context(i, context - 3);
              std::vector<bench::KernelRecord> records;
              bench::KernelTrace trace;
              try {
                trace.start();
              } catch (const std::exception& ex) {
                tr.error = ex.what();
              }
              if (tr.error.empty()) {
                eng.benchmark_decode_step(batch, kTraceReplays);
                try {
                  records = trace.stop();
                  tr.dropped = trace.dropped();
                  tr.incomplete = trace.incomplete();
                } catch (const std::exception& ex) {
                  tr.error = ex.what();
                }
              }
              for (const SequenceChunk& sc : batch) eng.reset(sc.seq_id);
              tr.records = records.size();
              if (tr.error.empty()) tr.split = bench::split_graph_replays(records);
            };
            traced_step(*e);
            if (tr.error.empty() && tr.split.replays.empty()) {
              // The step graph was instantiated before the window opened. CUPTI on CUDA >= 12 records such graphs'
              // kernels (PyTorch's capture-after-CUPTI workaround is for older toolkits); should this one not, a
              // new engine (same options and shapes; for a 70B step row a second copy of the weights, which the
              // H200 holds) captures its graph inside the window.
              std::printf("trace: %zu kernel records, no complete replay of a graph captured before tracing; "
                          "tracing a new engine whose graph is captured inside the window\n",
                          tr.records);
              std::unique_ptr<CudaEngine> fresh = make_synthetic_cuda_engine(c, kGroup, o);
              tr.fresh_engine = true;
              traced_step(*fresh);
            }
            if (tr.error.empty() && tr.split.replays.empty())
              tr.error = "no complete graph replay among " + std::to_string(tr.records) + " kernel records (" +
                         std::to_string(tr.split.outside_graphs) + " launched outside graphs)";
            char title[256];
            std::snprintf(title, sizeof title, "%s, %s head, %s epilogues, batch %d, context %d", r.shape.c_str(),
                          r.head.c_str(), fused ? "fused" : "unfused", b, context);
            if (!tr.error.empty()) {
              std::printf("\nkernel timeline: %s: %s\n", title, tr.error.c_str());
            } else {
              for (const std::vector<bench::KernelRecord>& rp : tr.split.replays)
                tr.spans_us.push_back(bench::replay_span_us(rp));
              tr.median = bench::median_replay(tr.split.replays);
              tr.timeline = bench::make_timeline(std::move(tr.split.replays[tr.median]));
              tr.split.replays.clear();  // only the median replay's kernels are kept
              if (!block)
                tr.layer_pattern = bench::find_layer_pattern(tr.timeline, static_cast<size_t>(c.num_hidden_layers));
              const auto [lo, hi] = std::minmax_element(tr.spans_us.begin(), tr.spans_us.end());
              bench::print_timeline(tr.timeline, title, block);
              std::printf("median of %zu replays by span (spans %.2f .. %.2f µs; untraced graph median %.2f µs); "
                          "%zu kernels each, cut by %s%s; left out: %zu kernels outside graphs, %zu of other graphs, "
                          "%zu of partial replays; CUPTI dropped %zu records, %zu came without timestamps\n",
                          tr.spans_us.size(), *lo, *hi, r.graph_us, tr.split.kernels_per_replay,
                          tr.split.method.c_str(), tr.fresh_engine ? " (new engine, graph captured under tracing)" : "",
                          tr.split.outside_graphs, tr.split.other_graphs, tr.split.partial, tr.dropped,
                          tr.incomplete);
              if (tr.layer_pattern) bench::print_layer_positions(tr.timeline, *tr.layer_pattern);
            }
            trace_rows.push_back(std::move(tr));
          }
          if (profile && block) {
            CudaEngineOptions po = o;
            po.profile_ops = true;
            std::unique_ptr<CudaEngine> pe = make_synthetic_cuda_engine(c, kGroup, po);
            for (int i = 0; i < b; ++i) pe->append_synthetic_context(i, context - 4);
            constexpr int kRuns = 3;
            pe->forward_greedy(batch);  // warm-up (per-shape launcher caches)
            pe->clear_op_profile();
            for (int k = 0; k < kRuns; ++k) pe->forward_greedy(batch);
            bench::print_op_profile(pe->op_profile(), name + " block decode step, batch " + std::to_string(b) +
                                                          ", context " + std::to_string(context) +
                                                          (fused ? ", fused epilogues" : ", unfused epilogues"),
                                    kRuns);
          }
          r.bytes = step_bytes(c, kGroup, b, context, kv, int4_head);
          r.roofline_us = r.bytes / (copy_tbps * 1e12) * 1e6;
          rows.push_back(r);
        }
      }
    }
    // The row of the same shape and batch with the given head and epilogue mode (a ratio's baseline), or null.
    auto twin = [&](const Row& r, const std::string& head, bool fused) -> const Row* {
      for (const Row& o : rows)
        if (o.head == head && o.fused == fused && o.shape == r.shape && o.batch == r.batch) return &o;
      return nullptr;
    };
    auto ratio_text = [](const Row& r, const Row* base, char (&buf)[32]) {
      if (base) std::snprintf(buf, sizeof buf, "%.3f", r.graph_us / base->graph_us);
      else std::snprintf(buf, sizeof buf, "-");
    };
    std::printf("\n| shape | LM head | epilogues | layers | batch | context | graph µs (median) | p90 | host step µs | "
                "tok/s | bytes (MB) | roofline µs | × roofline | graph × bf16 head | graph × unfused |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      char head_ratio[32], fused_ratio[32];
      ratio_text(r, r.head == "int4" ? twin(r, "bf16", r.fused) : nullptr, head_ratio);
      ratio_text(r, r.fused ? twin(r, r.head, false) : nullptr, fused_ratio);
      std::printf("| %s | %s | %s | %d | %d | %d | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.2f | %s | %s |\n",
                  r.shape.c_str(), r.head.c_str(), r.fused ? "fused" : "unfused", r.layers, r.batch, r.context,
                  r.graph_us, r.graph_p90_us, r.host_us, r.batch / (r.host_us * 1e-6), r.bytes / 1e6, r.roofline_us,
                  r.graph_us / r.roofline_us, head_ratio, fused_ratio);
    }
    const int sm_now = bench::report_sm_clock_after_runs(d.dev);
    if (!json_path.empty()) {
      auto extra = [&](FILE* f) {
        std::fprintf(f, "  \"kv\": \"%s\",\n  \"int4_group\": %d,\n  \"iters\": %d,\n", kv_name.c_str(), kGroup, iters);
      };
      auto row = [&](FILE* f, size_t i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "    {\"shape\": \"%s\", \"lm_head\": \"%s\", \"fused_epilogues\": %s, \"layers\": %d, "
                     "\"batch\": %d, \"context\": %d, "
                     "\"graph_us\": %.2f, \"graph_p90_us\": %.2f, \"host_step_us\": %.2f, \"bytes\": %.0f, "
                     "\"roofline_us\": %.2f}",
                     r.shape.c_str(), r.head.c_str(), r.fused ? "true" : "false", r.layers, r.batch, r.context,
                     r.graph_us, r.graph_p90_us,
                     r.host_us, r.bytes, r.roofline_us);
      };
      if (!bench::write_json(json_path, "decode_step", d, sm_now, copy_tbps, extra, rows.size(), row)) return 1;
    }
    if (!trace_path.empty()) {
      auto extra = [&](FILE* f) {
        std::fprintf(f, "  \"kv\": \"%s\",\n  \"int4_group\": %d,\n  \"trace_replays\": %d,\n", kv_name.c_str(), kGroup,
                     kTraceReplays);
      };
      auto row = [&](FILE* f, size_t i) {
        const TraceRow& r = trace_rows[i];
        std::fprintf(f,
                     "    {\"shape\": \"%s\", \"lm_head\": \"%s\", \"fused_epilogues\": %s, \"layers\": %d, "
                     "\"batch\": %d, \"context\": %d, \"graph_us\": %.2f, \"kernel_records\": %zu, "
                     "\"dropped_records\": %zu, \"records_without_timestamps\": %zu, \"fresh_engine\": %s,\n     ",
                     r.row.shape.c_str(), r.row.head.c_str(), r.row.fused ? "true" : "false", r.row.layers,
                     r.row.batch, r.row.context, r.row.graph_us, r.records, r.dropped, r.incomplete,
                     r.fresh_engine ? "true" : "false");
        if (!r.error.empty()) {
          std::fprintf(f, "\"error\": ");
          bench::json_string(f, r.error);
          std::fprintf(f, "}");
          return;
        }
        std::fprintf(f,
                     "\"split_method\": \"%s\", \"graph_id\": %u, \"kernels_per_replay\": %zu, "
                     "\"left_out\": {\"outside_graphs\": %zu, \"other_graphs\": %zu, \"partial\": %zu}, "
                     "\"replay_spans_us\": [",
                     r.split.method.c_str(), r.split.graph_id, r.split.kernels_per_replay, r.split.outside_graphs,
                     r.split.other_graphs, r.split.partial);
        for (size_t k = 0; k < r.spans_us.size(); ++k) std::fprintf(f, "%s%.3f", k ? ", " : "", r.spans_us[k]);
        std::fprintf(f, "], \"median_replay\": %zu,\n     ", r.median);
        if (r.layer_pattern)
          std::fprintf(f, "\"layer_pattern\": {\"first\": %zu, \"period\": %zu, \"repeats\": %zu},\n     ",
                       r.layer_pattern->first, r.layer_pattern->period, r.layer_pattern->repeats);
        bench::write_timeline_json(f, r.timeline);
        std::fprintf(f, "}");
      };
      if (!bench::write_json(trace_path, "decode_step_trace", d, sm_now, copy_tbps, extra, trace_rows.size(), row))
        return 1;
    }
    bool trace_failed = false;
    for (const TraceRow& r : trace_rows)
      if (!r.error.empty()) {
        std::fprintf(stderr, "bench_decode_step: no kernel timeline for %s, %s head, %s epilogues, batch %d: %s\n",
                     r.row.shape.c_str(), r.row.head.c_str(), r.row.fused ? "fused" : "unfused", r.row.batch,
                     r.error.c_str());
        trace_failed = true;
      }
    if (trace_failed) return 1;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_decode_step: %s\n", ex.what());
    return 1;
  }
  return 0;
}
