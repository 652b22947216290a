// Benchmark of the paged decode attention: INT4 cache vs BF16 cache (same kernel design, same paging, same
// process) on the Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head_dim 128).
//   bench_attention_decode [--json PATH] [--iters N]
// Each row: contexts 1k / 8k / 32k x batch 1 / 8 / 32, every sequence at the full context; median of N
// (default 100) launches, each timed by its own pair of CUDA events, after warm-up. The page pool holds enough
// copies of the cache (>= 4x the L2, block tables pointing at a different copy each launch) that every launch
// reads the cache from DRAM. Effective bandwidth counts the cache bytes each launch must read once (K and V
// codes plus INT4 scales and zeros; queries and outputs are tiny and left out). Cache contents are hashed
// bytes: timing does not depend on the values. The git commit in the JSON comes from -DFT_GIT_COMMIT=... or
// the FT_GIT_COMMIT environment variable.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention_decode_heuristics.h"
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
const int kContexts[] = {1024, 8192, 32768};
const int kBatches[] = {1, 8, 32};

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
};

// One format at one (context, batch): a pool of `copies` caches, one block table per copy.
Result bench_format(KvFormat f, int ctx, int batch, size_t rotate_bytes, int iters, const __nv_bfloat16* q,
                    __nv_bfloat16* out, cudaStream_t stream) {
  const auto L = futransformer::formats::kv_page_layout(f, kHeadDim);
  const int pages_per_seq = ctx / static_cast<int>(L.page_tokens);
  const size_t cache_pages = static_cast<size_t>(batch) * pages_per_seq;
  const size_t cache_bytes = cache_pages * kKvHeads * L.page_bytes;
  const int copies = static_cast<int>(std::clamp<size_t>((rotate_bytes + cache_bytes - 1) / cache_bytes, 1, 256));
  uint8_t* pool = nullptr;
  CHECK_CUDA(cudaMalloc(&pool, cache_bytes * copies));
  fill_hash<<<1024, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(pool), cache_bytes * copies / 4, 12345u);
  CHECK_CUDA(cudaGetLastError());
  // Block tables: a shuffled permutation of each copy's pages (pages of one sequence are scattered).
  std::mt19937 rng(7);
  std::vector<int32_t> host(static_cast<size_t>(copies) * cache_pages);
  for (int c = 0; c < copies; ++c) {
    auto first = host.begin() + static_cast<std::ptrdiff_t>(c * cache_pages);
    std::iota(first, first + static_cast<std::ptrdiff_t>(cache_pages), static_cast<int32_t>(c * cache_pages));
    std::shuffle(first, first + static_cast<std::ptrdiff_t>(cache_pages), rng);
  }
  int32_t *tables = nullptr, *lens = nullptr;
  CHECK_CUDA(cudaMalloc(&tables, host.size() * 4));
  CHECK_CUDA(cudaMemcpy(tables, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> hl(static_cast<size_t>(batch), ctx);
  CHECK_CUDA(cudaMalloc(&lens, hl.size() * 4));
  CHECK_CUDA(cudaMemcpy(lens, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
  const size_t ws_bytes =
      futransformer::cuda::attention_decode_workspace_bytes(f, batch, kHeads, kKvHeads, kHeadDim, pages_per_seq, ctx);
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)));
  const bool int4 = f != KvFormat::BF16;
  const auto launcher = int4 ? futransformer::cuda::attention_decode_int4 : futransformer::cuda::attention_decode_bf16;
  const double us = time_median_us(iters, stream, [&](int i) {
    CHECK_CUDA(launcher(q, pool, tables + static_cast<size_t>(i % copies) * cache_pages, lens, out, batch, kHeads,
                        kKvHeads, kHeadDim, pages_per_seq, ctx, ws, ws_bytes, stream));
  });
  const double bytes = static_cast<double>(batch) * ctx * kKvHeads * static_cast<double>(L.bytes_per_token());
  attn::DeviceLimits d;
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev));
  const attn::Plan plan = attn::choose_plan(int4, kHeadDim, batch, kKvHeads, ctx, d);
  CHECK_CUDA(cudaFree(ws));
  CHECK_CUDA(cudaFree(lens));
  CHECK_CUDA(cudaFree(tables));
  CHECK_CUDA(cudaFree(pool));
  return Result{us, bytes / (us * 1e-6) / 1e12, plan.splits};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 100, 50);
  const int iters = args.iters;
  const DeviceInfo d = query_device();
  const size_t rotate_bytes = 4 * static_cast<size_t>(d.l2_bytes);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_tbps = device_copy_tbps(stream);
  const int max_batch = *std::max_element(std::begin(kBatches), std::end(kBatches));
  __nv_bfloat16 *q = nullptr, *out = nullptr;
  const size_t qn = static_cast<size_t>(max_batch) * kHeads * kHeadDim;
  CHECK_CUDA(cudaMalloc(&q, qn * 2));
  CHECK_CUDA(cudaMalloc(&out, qn * 2));
  CHECK_CUDA(cudaMemsetAsync(q, 0x3c, qn * 2, stream));  // bf16 0x3c3c ~ 0.0115 everywhere

  print_device_summary(d);
  std::printf("; device copy %.2f TB/s; %d timed runs per row\n", copy_tbps, iters);
  std::printf("Llama-3.1-8B attention: %d heads, %d KV heads, head_dim %d; page 64 tokens\n", kHeads, kKvHeads,
              kHeadDim);
  std::printf("%6s %5s | %9s %7s %6s %6s | %9s %7s %6s | %7s\n", "ctx", "batch", "int4 us", "TB/s", "of4.2T", "splits",
              "bf16 us", "TB/s", "splits", "speedup");
  struct Row {
    int ctx, batch;
    Result i4, bf;
  };
  std::vector<Row> rows;
  for (int ctx : kContexts) {
    for (int batch : kBatches) {
      Row r{ctx, batch, bench_format(KvFormat::INT4, ctx, batch, rotate_bytes, iters, q, out, stream),
            bench_format(KvFormat::BF16, ctx, batch, rotate_bytes, iters, q, out, stream)};
      std::printf("%6d %5d | %9.2f %7.2f %5.0f%% %6d | %9.2f %7.2f %6d | %6.2fx\n", ctx, batch, r.i4.us, r.i4.tbps,
                  100.0 * r.i4.tbps / kNominalTBps, r.i4.splits, r.bf.us, r.bf.tbps, r.bf.splits, r.bf.us / r.i4.us);
      rows.push_back(r);
    }
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);

  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f, "  \"n_heads\": %d,\n  \"n_kv_heads\": %d,\n  \"head_dim\": %d,\n  \"timed_runs\": %d,\n", kHeads,
                   kKvHeads, kHeadDim, iters);
    };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"context\": %d, \"batch\": %d, \"int4_us\": %.3f, \"int4_tbps\": %.4f, \"int4_splits\": %d, "
                   "\"bf16_us\": %.3f, \"bf16_tbps\": %.4f, \"bf16_splits\": %d, \"speedup\": %.3f}",
                   r.ctx, r.batch, r.i4.us, r.i4.tbps, r.i4.splits, r.bf.us, r.bf.tbps, r.bf.splits, r.bf.us / r.i4.us);
    };
    if (!write_json(args.json_path, "attention_decode", d, sm_mhz_now, copy_tbps, extra, rows.size(), row)) return 1;
  }
  CHECK_CUDA(cudaFree(q));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
