// Per-row logit statistics (logit_row_stats, logit_row_kl) at evaluation shapes: 2048 rows (one perplexity window)
// of SmolLM2's and Llama-3's vocabularies. Bytes read: stats rows·vocab·4, KL 2·rows·vocab·4 (the outputs are a few
// KB). L2 flushed before each timed launch; median of the timed runs; GB/s of bytes read and the ratio to the
// device-to-device copy roofline measured in the same run.
//
//   bench_logit_stats [--json PATH] [--iters N]
#include <cstdio>
#include <vector>

#include "futransformer/cuda/logit_stats.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::logit_stats_last_error()
#include "bench_common.h"

using namespace futransformer::bench;
namespace ftc = futransformer::cuda;

namespace {

constexpr int kRows = 2048;
constexpr int kVocabs[] = {49152, 128256};

struct Row {
  int vocab;
  double stats_us, stats_gbps, kl_us, kl_gbps;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 50, 10);
  const DeviceInfo d = query_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_tbps = device_copy_tbps(stream);
  const L2Flush l2(d.l2_bytes);
  print_device_summary(d);
  std::printf("; device copy %.2f TB/s; %d timed runs per row; %d rows\n", copy_tbps, args.iters, kRows);
  std::printf("%7s | %9s %8s %6s | %9s %8s %6s\n", "vocab", "stats us", "GB/s", "ofcopy", "kl us", "GB/s", "ofcopy");
  std::vector<Row> rows;
  for (int vocab : kVocabs) {
    const size_t n = static_cast<size_t>(kRows) * vocab;
    float *x = nullptr, *y = nullptr;
    double *lse_x = nullptr, *lse_y = nullptr, *nll = nullptr, *kl = nullptr;
    int32_t *targets = nullptr, *am = nullptr;
    CHECK_CUDA(cudaMalloc(&x, n * 4));
    CHECK_CUDA(cudaMalloc(&y, n * 4));
    CHECK_CUDA(cudaMalloc(&lse_x, kRows * 8));
    CHECK_CUDA(cudaMalloc(&lse_y, kRows * 8));
    CHECK_CUDA(cudaMalloc(&nll, kRows * 8));
    CHECK_CUDA(cudaMalloc(&kl, kRows * 8));
    CHECK_CUDA(cudaMalloc(&targets, kRows * 4));
    CHECK_CUDA(cudaMalloc(&am, kRows * 4));
    fill_spread_f32_kernel<<<1024, 256, 0, stream>>>(x, n, 1u);
    fill_spread_f32_kernel<<<1024, 256, 0, stream>>>(y, n, 2u);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemsetAsync(targets, 0, kRows * 4, stream));
    CHECK_CUDA(ftc::logit_row_stats(y, vocab, kRows, vocab, targets, lse_y, nll, am, stream));
    const double stats_us = time_median_flushed_us(args.iters, stream, l2, [&] {
      CHECK_CUDA(ftc::logit_row_stats(x, vocab, kRows, vocab, targets, lse_x, nll, am, stream));
    });
    const double kl_us = time_median_flushed_us(args.iters, stream, l2, [&] {
      CHECK_CUDA(ftc::logit_row_kl(x, vocab, lse_x, y, vocab, lse_y, kRows, vocab, kl, stream));
    });
    const Row r{vocab, stats_us, n * 4.0 / (stats_us * 1e3), kl_us, 2.0 * n * 4.0 / (kl_us * 1e3)};
    std::printf("%7d | %9.2f %8.1f %5.0f%% | %9.2f %8.1f %5.0f%%\n", vocab, r.stats_us, r.stats_gbps,
                100.0 * r.stats_gbps / (copy_tbps * 1e3), r.kl_us, r.kl_gbps, 100.0 * r.kl_gbps / (copy_tbps * 1e3));
    rows.push_back(r);
    for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(lse_x),
                    static_cast<void*>(lse_y), static_cast<void*>(nll), static_cast<void*>(kl),
                    static_cast<void*>(targets), static_cast<void*>(am)})
      CHECK_CUDA(cudaFree(p));
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f, "  \"rows_per_call\": %d,\n  \"timed_runs\": %d,\n", kRows, args.iters);
    };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"vocab\": %d, \"stats_us\": %.3f, \"stats_gbps\": %.1f, \"kl_us\": %.3f, \"kl_gbps\": %.1f}",
                   r.vocab, r.stats_us, r.stats_gbps, r.kl_us, r.kl_gbps);
    };
    if (!write_json(args.json_path, "logit_stats", d, sm_mhz_now, copy_tbps, extra, rows.size(), row)) return 1;
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
