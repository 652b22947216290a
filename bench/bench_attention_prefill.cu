// Benchmark of the paged prefill attention — the warp-specialised wgmma kernel (the default) against the first design
// (mma.sync) and, with --decode-path, against the engine's path before either (attention_decode_* with one
// query sequence per prompt row: block table rows duplicated, seq_lens = i + 1) — in the same process, on the
// Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head_dim 128).
//   bench_attention_prefill [--json PATH] [--iters N] [--decode-path]
// Rows: one chunk of 2048 and of 8192 tokens starting at position 0, BF16 and INT4-Hadamard caches (INT4 reads the
// same bytes with the same kernel). Each timing is the median of N (default 20) launches, each after an L2 flush
// (outside the timed interval), after warm-up. FLOPs count the causal products: 2 (QKᵀ and PV) · 2 · rows ·
// avg_keys · n_heads · head_dim with avg_keys = (T + 1) / 2. Cache and query contents are hashed bytes: timing does
// not depend on the values. The git commit in the JSON comes from -DFT_GIT_COMMIT=... or FT_GIT_COMMIT.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention_prefill_internal.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/cuda/attention_prefill.h"
#include "futransformer/formats/kv_cache.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::attention_prefill_last_error()
#include "bench_common.h"

namespace {

using futransformer::formats::KvFormat;
namespace ftc = futransformer::cuda;
using namespace futransformer::bench;

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kPage = 64;
const int kTokens[] = {2048, 8192};
const KvFormat kFormats[] = {KvFormat::BF16, KvFormat::INT4_HADAMARD};

// p[i] = (hash(i, seed) & mask) | set.
__global__ void fill_hash(uint32_t* p, size_t words, uint32_t seed, uint32_t mask, uint32_t set) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    p[i] = (x & mask) | set;
  }
}

template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

struct Row {
  int tokens;
  KvFormat format;
  double wgmma_us, pingpong_us, mma_sync_us, decode_path_us, flops;  // decode_path_us < 0: not run
};

Row bench_one(int T, KvFormat f, int iters, bool decode_path, const L2Flush& l2, cudaStream_t stream) {
  const auto L = futransformer::formats::kv_page_layout(f, kHeadDim);
  const int pages = T / kPage;
  uint8_t* pool = device_alloc<uint8_t>(static_cast<size_t>(pages) * kKvHeads * L.page_bytes);
  fill_hash<<<1024, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(pool), pages * kKvHeads * L.page_bytes / 4, 12345u,
                                      0xFFFFFFFFu, 0u);
  CHECK_CUDA(cudaGetLastError());
  const size_t qn = static_cast<size_t>(T) * kHeads * kHeadDim;
  __nv_bfloat16* q = device_alloc<__nv_bfloat16>(qn);
  __nv_bfloat16* out = device_alloc<__nv_bfloat16>(qn);
  // BF16 queries with random sign and mantissa and exponent field 0x7E: |q| in [0.5, 1).
  fill_hash<<<1024, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(q), qn / 2, 777u, 0x807F807Fu, 0x3F003F00u);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMemsetAsync(out, 0, qn * 2, stream));

  // The sequence's pages in shuffled order.
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  int32_t* d_table = device_alloc<int32_t>(table.size());
  CHECK_CUDA(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> first_row = {0, T}, start_pos = {0};
  int32_t* d_first = device_alloc<int32_t>(2);
  int32_t* d_start = device_alloc<int32_t>(1);
  CHECK_CUDA(cudaMemcpy(d_first, first_row.data(), 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_start, start_pos.data(), 4, cudaMemcpyHostToDevice));

  auto time_kernel = [&](ftc::AttentionPrefillKernel k) {
    return time_median_flushed_us(iters, stream, l2, [&] {
      CHECK_CUDA(ftc::attention_prefill_with(k, f, q, pool, d_table, d_first, d_start, out, T, 1, kHeads, kKvHeads,
                                             kHeadDim, pages, T, stream));
    });
  };
  ftc::set_attention_prefill_pingpong(ftc::PrefillPingPong::kOff);
  const double wgmma_us = time_kernel(ftc::AttentionPrefillKernel::kWgmma);
  ftc::set_attention_prefill_pingpong(ftc::PrefillPingPong::kOn);  // the consumers taking turns (same bits)
  const double pingpong_us = time_kernel(ftc::AttentionPrefillKernel::kWgmma);
  ftc::set_attention_prefill_pingpong(ftc::PrefillPingPong::kDefault);
  const double mma_sync_us = time_kernel(ftc::AttentionPrefillKernel::kMmaSync);
  const double avg_keys = (T + 1) / 2.0;
  const double flops = 4.0 * T * avg_keys * kHeads * kHeadDim;
  if (!decode_path) {
    for (void* p : {static_cast<void*>(pool), static_cast<void*>(q), static_cast<void*>(out),
                    static_cast<void*>(d_table), static_cast<void*>(d_first), static_cast<void*>(d_start)})
      CHECK_CUDA(cudaFree(p));
    return Row{T, f, wgmma_us, pingpong_us, mma_sync_us, -1.0, flops};
  }

  // Today's path: row i is a decode query of a sequence of i + 1 tokens over the same pages.
  std::vector<int32_t> dup(static_cast<size_t>(T) * pages), lens(static_cast<size_t>(T));
  for (int i = 0; i < T; ++i) {
    std::copy(table.begin(), table.end(), dup.begin() + static_cast<std::ptrdiff_t>(i) * pages);
    lens[static_cast<size_t>(i)] = i + 1;
  }
  int32_t* d_dup = device_alloc<int32_t>(dup.size());
  int32_t* d_lens = device_alloc<int32_t>(lens.size());
  CHECK_CUDA(cudaMemcpy(d_dup, dup.data(), dup.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  const size_t ws_bytes = ftc::attention_decode_workspace_bytes(f, T, kHeads, kKvHeads, kHeadDim, pages, T);
  void* ws = device_alloc<unsigned char>(ws_bytes);
  const auto decode = f == KvFormat::BF16 ? ftc::attention_decode_bf16 : ftc::attention_decode_int4;
  const double decode_us = time_median_flushed_us(iters, stream, l2, [&] {
    const cudaError_t e =
        decode(q, pool, d_dup, d_lens, out, T, kHeads, kKvHeads, kHeadDim, pages, T, ws, ws_bytes, stream, false);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "attention_decode: %s (%s)\n", cudaGetErrorString(e), ftc::attention_decode_last_error());
      std::exit(1);
    }
  });

  for (void* p : {static_cast<void*>(pool), static_cast<void*>(q), static_cast<void*>(out),
                  static_cast<void*>(d_table), static_cast<void*>(d_first), static_cast<void*>(d_start),
                  static_cast<void*>(d_dup), static_cast<void*>(d_lens), ws})
    CHECK_CUDA(cudaFree(p));
  return Row{T, f, wgmma_us, pingpong_us, mma_sync_us, decode_us, flops};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 20, 5, "--decode-path");
  const DeviceInfo d = query_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const L2Flush l2(d.l2_bytes);

  print_device_summary(d);
  std::printf("; %d timed runs per cell, L2 flushed before each\n", args.iters);
  std::printf("Llama-3.1-8B attention: %d heads, %d KV heads, head_dim %d; one chunk from position 0\n", kHeads,
              kKvHeads, kHeadDim);
  std::printf("| tokens | cache | wgmma us | TFLOP/s | ping-pong us | mma.sync us | TFLOP/s | wgmma speedup (over "
              "mma.sync) | decode-path us |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Row> rows;
  for (int T : kTokens) {
    for (KvFormat f : kFormats) {
      const Row r = bench_one(T, f, args.iters, args.flag, l2, stream);
      std::printf("| %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx | %s |\n", r.tokens,
                  futransformer::formats::kv_format_name(r.format), r.wgmma_us, r.flops / r.wgmma_us * 1e-6,
                  r.pingpong_us, r.mma_sync_us, r.flops / r.mma_sync_us * 1e-6, r.mma_sync_us / r.wgmma_us,
                  r.decode_path_us < 0 ? "-" : std::to_string(r.decode_path_us).c_str());
      rows.push_back(r);
    }
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f,
                   "  \"n_heads\": %d,\n  \"n_kv_heads\": %d,\n  \"head_dim\": %d,\n  \"timed_runs\": %d,\n"
                   "  \"flops\": \"4 * tokens * (tokens + 1) / 2 * n_heads * head_dim (causal QK^T and PV)\",\n",
                   kHeads, kKvHeads, kHeadDim, args.iters);
    };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"tokens\": %d, \"cache\": \"%s\", \"prefill_us\": %.3f, \"prefill_tflops\": %.3f, "
                   "\"pingpong_us\": %.3f, "
                   "\"mma_sync_us\": %.3f, \"mma_sync_tflops\": %.3f, \"speedup_over_mma_sync\": %.3f, "
                   "\"decode_path_us\": %s}",
                   r.tokens, futransformer::formats::kv_format_name(r.format), r.wgmma_us,
                   r.flops / r.wgmma_us * 1e-6, r.pingpong_us, r.mma_sync_us,
                   r.flops / r.mma_sync_us * 1e-6,
                   r.mma_sync_us / r.wgmma_us,
                   r.decode_path_us < 0 ? "null" : std::to_string(r.decode_path_us).c_str());
    };
    if (!write_json(args.json_path, "attention_prefill", d, sm_mhz_now, std::nullopt, extra, rows.size(), row))
      return 1;
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
