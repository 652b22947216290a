// KV-cache writes of a prefill chunk at Llama-3.1-8B's shape (8 KV heads, head_dim 128, qkv rows of 6144 BF16):
// kv_key_anchor_compute (the int4-hadamard key anchor of a new sequence: a per-channel fp64 mean of the chunk's
// keys, summed in 32-row blocks, then rotated) and kv_append (int4-hadamard) of the same rows. Times are medians,
// with the qkv rows L2-warm ("hot", as in the engine right after the QKV GEMM) and after an L2 flush.
//
//   bench_kv_append [--json PATH] [--iters N]
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "futransformer/cuda/kv_append.h"
#include "futransformer/formats/hadamard.h"
#include "futransformer/formats/kv_cache.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::kv_append_last_error()
#include "bench_common.h"

using namespace futransformer::bench;
namespace ftc = futransformer::cuda;
namespace formats = futransformer::formats;

namespace {

constexpr int kKvHeads = 8, kHeadDim = 128, kQWidth = 4096, kRowWidth = kQWidth + 2 * kKvHeads * kHeadDim;
constexpr int kTokens[] = {64, 512, 2048, 8192};

struct Row {
  const char* op;
  int tokens;
  double hot_us, flushed_us;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 50, 10);
  const DeviceInfo d = query_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const L2Flush l2(d.l2_bytes);
  print_device_summary(d);
  std::printf("; %d KV heads, head_dim %d, qkv rows of %d BF16; %d timed runs per row\n", kKvHeads, kHeadDim,
              kRowWidth, args.iters);
  std::printf("%-32s %7s | %10s %10s\n", "op", "tokens", "hot us", "flushed us");

  const int max_tokens = kTokens[sizeof(kTokens) / sizeof(kTokens[0]) - 1];
  std::vector<uint16_t> qkv_host(static_cast<size_t>(max_tokens) * kRowWidth);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (uint16_t& v : qkv_host) {
    const float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  const formats::KvPageLayout layout = formats::kv_page_layout(formats::KvFormat::INT4_HADAMARD, kHeadDim);
  const int pages = (max_tokens + static_cast<int>(formats::kKvPageTokens) - 1) / static_cast<int>(formats::kKvPageTokens);
  std::vector<int32_t> row_page(static_cast<size_t>(max_tokens)), row_slot(row_page.size()), row_anchor(row_page.size(), 0);
  for (int r = 0; r < max_tokens; ++r) {
    row_page[static_cast<size_t>(r)] = r / static_cast<int>(formats::kKvPageTokens);
    row_slot[static_cast<size_t>(r)] = r % static_cast<int>(formats::kKvPageTokens);
  }
  __nv_bfloat16* qkv = nullptr;
  int32_t *first = nullptr, *count = nullptr, *index = nullptr, *d_page = nullptr, *d_slot = nullptr, *d_ra = nullptr;
  uint16_t* anchors = nullptr;
  uint8_t* pool = nullptr;
  const size_t pool_bytes = static_cast<size_t>(pages) * kKvHeads * static_cast<size_t>(layout.page_bytes);
  CHECK_CUDA(cudaMalloc(&qkv, qkv_host.size() * 2));
  CHECK_CUDA(cudaMemcpy(qkv, qkv_host.data(), qkv_host.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&first, 4));
  CHECK_CUDA(cudaMalloc(&count, 4));
  CHECK_CUDA(cudaMalloc(&index, 4));
  CHECK_CUDA(cudaMemset(first, 0, 4));
  CHECK_CUDA(cudaMemset(index, 0, 4));
  CHECK_CUDA(cudaMalloc(&anchors, static_cast<size_t>(kKvHeads) * kHeadDim * 2));
  CHECK_CUDA(cudaMalloc(&pool, pool_bytes));
  CHECK_CUDA(cudaMalloc(&d_page, row_page.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_slot, row_page.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_ra, row_page.size() * 4));
  CHECK_CUDA(cudaMemcpy(d_page, row_page.data(), row_page.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_slot, row_slot.data(), row_slot.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_ra, row_anchor.data(), row_anchor.size() * 4, cudaMemcpyHostToDevice));

  std::vector<Row> rows;
  auto add = [&](const char* op, int tokens, auto launch) {
    const double hot = time_median_us(args.iters, stream, [&](int) { launch(); });
    const double flushed = time_median_flushed_us(args.iters, stream, l2, launch);
    rows.push_back({op, tokens, hot, flushed});
    std::printf("%-32s %7d | %10.2f %10.2f\n", op, tokens, hot, flushed);
  };
  for (int tokens : kTokens) {
    CHECK_CUDA(cudaMemcpy(count, &tokens, 4, cudaMemcpyHostToDevice));
    add("kv_key_anchor_compute", tokens, [&] {
      CHECK_CUDA(ftc::kv_key_anchor_compute(qkv, kRowWidth, kQWidth, kKvHeads, kHeadDim, 1, first, count, index,
                                            anchors, stream));
    });
    add("kv_append int4-hadamard", tokens, [&] {
      CHECK_CUDA(ftc::kv_append(formats::KvFormat::INT4_HADAMARD, qkv, kRowWidth, kQWidth, kQWidth + kKvHeads * kHeadDim,
                                tokens, kKvHeads, kHeadDim, d_page, d_slot, anchors, d_ra, pool, stream));
    });
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f, "  \"kv_heads\": %d,\n  \"head_dim\": %d,\n  \"row_width\": %d,\n  \"timed_runs\": %d,\n",
                   kKvHeads, kHeadDim, kRowWidth, args.iters);
    };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f, "    {\"op\": \"%s\", \"tokens\": %d, \"hot_us\": %.3f, \"flushed_us\": %.3f}", r.op, r.tokens,
                   r.hot_us, r.flushed_us);
    };
    if (!write_json(args.json_path, "kv_append", d, sm_mhz_now, std::nullopt, extra, rows.size(), row)) return 1;
  }
  for (void* p : {static_cast<void*>(qkv), static_cast<void*>(first), static_cast<void*>(count),
                  static_cast<void*>(index), static_cast<void*>(anchors), static_cast<void*>(pool),
                  static_cast<void*>(d_page), static_cast<void*>(d_slot), static_cast<void*>(d_ra)})
    CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
