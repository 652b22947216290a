// Benchmark of the paged decode attention: INT4 cache vs BF16 cache (same kernel design, same paging, same
// process) on the Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head_dim 128).
//   bench_attention_decode [--json PATH] [--iters N] [--contexts 1024,8192,...] [--batches 1,8,...]
//                          [--sweep-splits 1,2,3,4,6,8,12,16]
// Each row: contexts 1k / 8k / 32k x batch 1 / 8 / 32 (or the lists given), every sequence at the full context;
// median of N (default 100) launches, each timed by its own pair of CUDA events, after warm-up. The page pool holds
// enough copies of the cache (>= 4x the L2, block tables pointing at a different copy each launch) that every launch
// reads the cache from DRAM. Effective bandwidth counts the cache bytes each launch must read once (K and V
// codes plus INT4 scales and zeros; queries and outputs are tiny and left out). Cache contents are hashed
// bytes: timing does not depend on the values. The git commit in the JSON comes from -DFT_GIT_COMMIT=... or
// the FT_GIT_COMMIT environment variable. The INT4 rows name the plan's split count and warps per CTA (4, or 8 from
// 48 CTAs a split; FT_ATTN_DECODE_WARPS=4|8 forces one). These launches do not copy early (no kernel before them), so
// the 8-warp rows read slower here than inside a decode step (docs/kernels.md, "Split choice").
// FT_ATTN_CLUSTER_COMBINE=N merges split plans of up to N splits inside their thread-block cluster instead of the
// combine kernel (named in the header line and the JSON's cluster_combine_splits).
//
// --sweep-splits: INT4 cache only; for each (context, batch) the launch is timed at each forced split count
// (attn::set_forced_splits, the FT_ATTN_DECODE_SPLITS knob) and at the occupancy rule's and the DRAM model's own
// choices, on one pool, with the best count and each choice's loss to it: the data the constants of
// src/cuda/attention_decode_heuristics.cpp come from (docs/kernels.md, "Split choice").
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention_decode_heuristics.h"
#include "cuda/attention_decode_layout.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/formats/kv_cache.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::attention_decode_last_error()
#include "bench_common.h"

namespace {

using futransformer::formats::KvFormat;
namespace attn = futransformer::cuda::attn;
using namespace futransformer::bench;

constexpr double kNominalTBps = 4.2;  // achievable H200 DRAM bandwidth the targets are stated against
constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;
const std::vector<int> kContexts = {1024, 8192, 32768};
const std::vector<int> kBatches = {1, 8, 32};

__global__ void fill_hash(uint32_t* p, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    p[i] = x;
  }
}

struct Result {
  double us, tbps;
  int splits;
  int warps;  // per CTA (attn::cta_warps)
};

// The device's limits as the launcher reads them (the plan printed next to a time is the one that ran).
attn::DeviceLimits device_limits() {
  attn::DeviceLimits d;
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev));
  int per_sm = 0, per_block = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  d.smem_per_sm = per_sm;
  d.smem_per_block = per_block;
  return d;
}

// One format at one (context, batch): a pool of `copies` caches, one block table per copy, and a workspace of
// `ws_bytes` (at least what the current plan needs: the sweep sizes it for its largest split count).
class Case {
 public:
  Case(KvFormat f, int ctx, int batch, size_t rotate_bytes, cudaStream_t stream)
      : f_(f), ctx_(ctx), batch_(batch), stream_(stream) {
    const auto L = futransformer::formats::kv_page_layout(f, kHeadDim);
    pages_per_seq_ = ctx / static_cast<int>(L.page_tokens);
    cache_pages_ = static_cast<size_t>(batch) * pages_per_seq_;
    const size_t cache_bytes = cache_pages_ * kKvHeads * L.page_bytes;
    copies_ = static_cast<int>(std::clamp<size_t>((rotate_bytes + cache_bytes - 1) / cache_bytes, 1, 256));
    CHECK_CUDA(cudaMalloc(&pool_, cache_bytes * copies_));
    fill_hash<<<1024, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(pool_), cache_bytes * copies_ / 4, 12345u);
    CHECK_CUDA(cudaGetLastError());
    // Block tables: a shuffled permutation of each copy's pages (pages of one sequence are scattered).
    std::mt19937 rng(7);
    std::vector<int32_t> host(static_cast<size_t>(copies_) * cache_pages_);
    for (int c = 0; c < copies_; ++c) {
      auto first = host.begin() + static_cast<std::ptrdiff_t>(c * cache_pages_);
      std::iota(first, first + static_cast<std::ptrdiff_t>(cache_pages_), static_cast<int32_t>(c * cache_pages_));
      std::shuffle(first, first + static_cast<std::ptrdiff_t>(cache_pages_), rng);
    }
    CHECK_CUDA(cudaMalloc(&tables_, host.size() * 4));
    CHECK_CUDA(cudaMemcpy(tables_, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    const std::vector<int32_t> hl(static_cast<size_t>(batch), ctx);
    CHECK_CUDA(cudaMalloc(&lens_, hl.size() * 4));
    CHECK_CUDA(cudaMemcpy(lens_, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
    bytes_ = static_cast<double>(batch) * ctx * kKvHeads * static_cast<double>(L.bytes_per_token());
  }
  ~Case() {
    cudaFree(ws_);
    cudaFree(lens_);
    cudaFree(tables_);
    cudaFree(pool_);
  }
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;

  // The workspace the launcher asks for under the current plan knobs.
  size_t workspace_needed() const {
    return futransformer::cuda::attention_decode_workspace_bytes(f_, batch_, kHeads, kKvHeads, kHeadDim, pages_per_seq_,
                                                                 ctx_);
  }
  void reserve_workspace(size_t bytes) {
    if (ws_ && bytes <= ws_bytes_) return;
    CHECK_CUDA(cudaFree(ws_));
    ws_bytes_ = std::max<size_t>(bytes, 16);
    CHECK_CUDA(cudaMalloc(&ws_, ws_bytes_));
  }

  // Median of `iters` launches under the current plan knobs.
  Result time(int iters, const __nv_bfloat16* q, __nv_bfloat16* out) {
    reserve_workspace(workspace_needed());
    const bool int4 = f_ != KvFormat::BF16;
    const auto launcher =
        int4 ? futransformer::cuda::attention_decode_int4 : futransformer::cuda::attention_decode_bf16;
    const double us = time_median_us(iters, stream_, [&](int i) {
      CHECK_CUDA(launcher(q, pool_, tables_ + static_cast<size_t>(i % copies_) * cache_pages_, lens_, out, batch_,
                          kHeads, kKvHeads, kHeadDim, pages_per_seq_, ctx_, ws_, ws_bytes_, stream_, false));
    });
    const attn::Plan plan = attn::choose_plan(int4, kHeadDim, batch_, kKvHeads, ctx_, device_limits());
    return Result{us, bytes_ / (us * 1e-6) / 1e12, plan.splits, plan.warps};
  }

 private:
  KvFormat f_;
  int ctx_, batch_, pages_per_seq_ = 0, copies_ = 0;
  cudaStream_t stream_;
  size_t cache_pages_ = 0, ws_bytes_ = 0;
  uint8_t* pool_ = nullptr;
  int32_t *tables_ = nullptr, *lens_ = nullptr;
  void* ws_ = nullptr;
  double bytes_ = 0.0;
};

Result bench_format(KvFormat f, int ctx, int batch, size_t rotate_bytes, int iters, const __nv_bfloat16* q,
                    __nv_bfloat16* out, cudaStream_t stream) {
  Case c(f, ctx, batch, rotate_bytes, stream);
  return c.time(iters, q, out);
}

// --sweep-splits: one (context, batch) of the INT4 cache at every forced split count and at both models' choices.
struct SweepRow {
  int ctx, batch, occupancy_splits, dram_splits;
  std::vector<int> splits;  // the effective (clamped) count of each requested value, in request order
  std::vector<double> us;
  std::map<int, double> timed;  // effective splits -> measured us
  int best_splits = 0;
  double best_us = 0.0;
  double at(int splits) const { return timed.at(splits); }
};

SweepRow sweep(int ctx, int batch, const std::vector<int>& requested, size_t rotate_bytes, int iters,
               const __nv_bfloat16* q, __nv_bfloat16* out, cudaStream_t stream) {
  const attn::DeviceLimits d = device_limits();
  SweepRow r{ctx,
             batch,
             attn::model_plan(attn::PlanModel::kOccupancy, true, kHeadDim, batch, kKvHeads, ctx, d).splits,
             attn::model_plan(attn::PlanModel::kDram, true, kHeadDim, batch, kKvHeads, ctx, d).splits,
             {},
             {},
             {}};
  Case c(KvFormat::INT4, ctx, batch, rotate_bytes, stream);
  std::vector<int> all = requested;
  all.push_back(r.occupancy_splits);
  all.push_back(r.dram_splits);
  // One workspace for the largest plan, so every count runs on the same buffers.
  size_t ws = 0;
  for (int s : all) {
    attn::set_forced_splits(s);
    ws = std::max(ws, c.workspace_needed());
  }
  c.reserve_workspace(ws);
  for (size_t i = 0; i < all.size(); ++i) {
    attn::set_forced_splits(all[i]);
    const int eff = attn::choose_plan(true, kHeadDim, batch, kKvHeads, ctx, d).splits;
    if (!r.timed.count(eff)) r.timed[eff] = c.time(iters, q, out).us;
    if (i < requested.size()) {
      r.splits.push_back(eff);
      r.us.push_back(r.timed[eff]);
    }
  }
  attn::reset_plan_knobs();
  for (const auto& [s, us] : r.timed) {
    if (r.best_splits == 0 || us < r.best_us) r.best_splits = s, r.best_us = us;
  }
  return r;
}

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--json PATH] [--iters N (>= 50)] [--contexts C,C,... (multiples of 64)] "
               "[--batches B,B,...] [--sweep-splits S,S,... (>= 1)]\n",
               argv0);
  std::exit(2);
}

std::vector<int> parse_ints(const char* argv0, const std::string& list, int lo, int hi, int multiple = 1) {
  std::vector<int> v;
  for (const std::string& t : split_list(list)) {
    char* end = nullptr;
    const long x = std::strtol(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || x < lo || x > hi || x % multiple != 0) usage(argv0);
    v.push_back(static_cast<int>(x));
  }
  if (v.empty()) usage(argv0);
  return v;
}

struct Options {
  std::string json_path;
  int iters = 100;
  std::vector<int> contexts = kContexts, batches = kBatches, sweep_splits;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(argv[0]);
    const std::string v = argv[++i];
    if (a == "--json") {
      o.json_path = v;
    } else if (a == "--iters") {
      o.iters = std::max(50, std::atoi(v.c_str()));
    } else if (a == "--contexts") {
      o.contexts = parse_ints(argv[0], v, 64, futransformer::cuda::kAttentionDecodeMaxTokens, 64);
    } else if (a == "--batches") {
      o.batches = parse_ints(argv[0], v, 1, 4096);
    } else if (a == "--sweep-splits") {
      o.sweep_splits = parse_ints(argv[0], v, 1, attn::kMaxSplits);
    } else {
      usage(argv[0]);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_options(argc, argv);
  const int iters = opt.iters;
  const DeviceInfo d = query_device();
  const size_t rotate_bytes = 4 * static_cast<size_t>(d.l2_bytes);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_tbps = device_copy_tbps(stream);
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  __nv_bfloat16 *q = nullptr, *out = nullptr;
  const size_t qn = static_cast<size_t>(max_batch) * kHeads * kHeadDim;
  CHECK_CUDA(cudaMalloc(&q, qn * 2));
  CHECK_CUDA(cudaMalloc(&out, qn * 2));
  CHECK_CUDA(cudaMemsetAsync(q, 0x3c, qn * 2, stream));  // bf16 0x3c3c ~ 0.0115 everywhere

  print_device_summary(d);
  std::printf("; device copy %.2f TB/s; %d timed runs per row\n", copy_tbps, iters);
  // FT_ATTN_CLUSTER_COMBINE: split plans of up to this many splits merge inside their cluster (no combine kernel).
  const int cluster_splits = attn::cluster_combine_splits();
  std::printf("Llama-3.1-8B attention: %d heads, %d KV heads, head_dim %d; page 64 tokens; split combine: %s\n",
              kHeads, kKvHeads, kHeadDim,
              cluster_splits >= 2 ? ("in the cluster up to " + std::to_string(cluster_splits) + " splits").c_str()
                                  : "combine kernel");
  const auto extra = [&](FILE* f) {
    std::fprintf(f,
                 "  \"n_heads\": %d,\n  \"n_kv_heads\": %d,\n  \"head_dim\": %d,\n  \"timed_runs\": %d,\n"
                 "  \"cluster_combine_splits\": %d,\n",
                 kHeads, kKvHeads, kHeadDim, iters, cluster_splits);
  };

  if (!opt.sweep_splits.empty()) {
    const attn::PlanModel model = attn::plan_model();
    std::printf(
        "INT4 cache, measured us at each forced split count; occ / dram: the occupancy rule's and the DRAM "
        "model's choices (the default plan uses %s)\n",
        attn::plan_model_name(model));
    std::printf("%6s %5s | %4s %4s |", "ctx", "batch", "occ", "dram");
    for (int s : opt.sweep_splits) std::printf(" %7d", s);
    std::printf(" | %4s %8s | %8s %9s\n", "best", "best us", "occ/best", "dram/best");
    std::vector<SweepRow> rows;
    for (int ctx : opt.contexts) {
      for (int batch : opt.batches) {
        const SweepRow r = sweep(ctx, batch, opt.sweep_splits, rotate_bytes, iters, q, out, stream);
        std::printf("%6d %5d | %4d %4d |", ctx, batch, r.occupancy_splits, r.dram_splits);
        for (double us : r.us) std::printf(" %7.2f", us);
        std::printf(" | %4d %8.2f | %7.2fx %8.2fx\n", r.best_splits, r.best_us, r.at(r.occupancy_splits) / r.best_us,
                    r.at(r.dram_splits) / r.best_us);
        rows.push_back(r);
      }
    }
    const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
    if (!opt.json_path.empty()) {
      const auto sweep_extra = [&](FILE* f) {
        extra(f);
        std::fprintf(f, "  \"kv_format\": \"int4\",\n  \"default_model\": \"%s\",\n  \"sweep_splits\": [",
                     attn::plan_model_name(model));
        for (size_t i = 0; i < opt.sweep_splits.size(); ++i)
          std::fprintf(f, "%s%d", i ? ", " : "", opt.sweep_splits[i]);
        std::fprintf(f, "],\n");
      };
      const auto list = [](FILE* f, const char* key, const auto& v, const char* fmt) {
        std::fprintf(f, "\"%s\": [", key);
        for (size_t i = 0; i < v.size(); ++i) {
          if (i) std::fprintf(f, ", ");
          std::fprintf(f, fmt, v[i]);
        }
        std::fprintf(f, "], ");
      };
      const auto row = [&](FILE* f, size_t i) {
        const SweepRow& r = rows[i];
        const int heuristic = model == attn::PlanModel::kDram ? r.dram_splits : r.occupancy_splits;
        std::fprintf(f,
                     "    {\"context\": %d, \"batch\": %d, \"heuristic_splits\": %d, \"occupancy_splits\": %d, "
                     "\"dram_splits\": %d, ",
                     r.ctx, r.batch, heuristic, r.occupancy_splits, r.dram_splits);
        list(f, "splits", r.splits, "%d");
        list(f, "us", r.us, "%.3f");
        std::fprintf(f,
                     "\"best_splits\": %d, \"best_us\": %.3f, \"heuristic_us\": %.3f, \"occupancy_us\": %.3f, "
                     "\"dram_us\": %.3f, \"heuristic_over_best\": %.4f, \"occupancy_over_best\": %.4f, "
                     "\"dram_over_best\": %.4f}",
                     r.best_splits, r.best_us, r.at(heuristic), r.at(r.occupancy_splits), r.at(r.dram_splits),
                     r.at(heuristic) / r.best_us, r.at(r.occupancy_splits) / r.best_us,
                     r.at(r.dram_splits) / r.best_us);
      };
      if (!write_json(opt.json_path, "attention_decode_splits", d, sm_mhz_now, copy_tbps, sweep_extra, rows.size(),
                      row))
        return 1;
    }
  } else {
    std::printf("%6s %5s | %9s %7s %6s %6s %5s | %9s %7s %6s | %7s\n", "ctx", "batch", "int4 us", "TB/s", "of4.2T",
                "splits", "warps", "bf16 us", "TB/s", "splits", "speedup");
    struct Row {
      int ctx, batch;
      Result i4, bf;
    };
    std::vector<Row> rows;
    for (int ctx : opt.contexts) {
      for (int batch : opt.batches) {
        Row r{ctx, batch, bench_format(KvFormat::INT4, ctx, batch, rotate_bytes, iters, q, out, stream),
              bench_format(KvFormat::BF16, ctx, batch, rotate_bytes, iters, q, out, stream)};
        std::printf("%6d %5d | %9.2f %7.2f %5.0f%% %6d %5d | %9.2f %7.2f %6d | %6.2fx\n", ctx, batch, r.i4.us,
                    r.i4.tbps, 100.0 * r.i4.tbps / kNominalTBps, r.i4.splits, r.i4.warps, r.bf.us, r.bf.tbps, r.bf.splits,
                    r.bf.us / r.i4.us);
        rows.push_back(r);
      }
    }
    const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
    if (!opt.json_path.empty()) {
      const auto row = [&](FILE* f, size_t i) {
        const Row& r = rows[i];
        std::fprintf(
            f,
            "    {\"context\": %d, \"batch\": %d, \"int4_us\": %.3f, \"int4_tbps\": %.4f, \"int4_splits\": %d, "
            "\"int4_warps\": %d, \"bf16_us\": %.3f, \"bf16_tbps\": %.4f, \"bf16_splits\": %d, \"speedup\": %.3f}",
            r.ctx, r.batch, r.i4.us, r.i4.tbps, r.i4.splits, r.i4.warps, r.bf.us, r.bf.tbps, r.bf.splits,
            r.bf.us / r.i4.us);
      };
      if (!write_json(opt.json_path, "attention_decode", d, sm_mhz_now, copy_tbps, extra, rows.size(), row)) return 1;
    }
  }
  CHECK_CUDA(cudaFree(q));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
