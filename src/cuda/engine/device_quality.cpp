// Perplexity and distribution comparison with the logits kept on the GPU (eval/device_quality.h): the windows,
// chunks and per-row formulas of src/eval/perplexity.cpp and src/eval/kl.cpp, with the per-row work done by
// cuda/logit_stats.h on each engine's device logits and only per-row doubles downloaded.
#include "futransformer/eval/device_quality.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "device_memory.h"
#include "futransformer/cuda/logit_stats.h"
#include "futransformer/error.h"

namespace futransformer::eval {
namespace {

constexpr int32_t kSeq = 0;  // the sequence id the CPU versions use

void check_stats(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail(what, ": ", e == cudaErrorInvalidValue ? cuda::logit_stats_last_error() : cudaGetErrorString(e));
}

template <class T>
std::vector<T> download(const cuda::DeviceArray<T>& a, int64_t n) {
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0)
    cuda::cuda_check(cudaMemcpy(out.data(), a.get(), out.size() * sizeof(T), cudaMemcpyDeviceToHost),
                     "download per-row quality numbers");
  return out;
}

// Per-row device outputs of one engine for one chunk.
struct RowOutputs {
  cuda::DeviceArray<double> lse, nll;
  cuda::DeviceArray<int32_t> argmax;
  explicit RowOutputs(int64_t rows)
      : lse(static_cast<size_t>(rows), "per-row log-sum-exp"),
        nll(static_cast<size_t>(rows), "per-row NLL"),
        argmax(static_cast<size_t>(rows), "per-row argmax") {}
};

// The rows of a chunk that predict a token of the window: row i predicts token start + i + 1; the last row of the
// window has nothing to predict.
int64_t predicting_rows(int64_t n, int64_t start, int64_t ctx) { return std::max<int64_t>(0, std::min(n, ctx - 1 - start)); }

void check_finite(const std::vector<double>& v, const char* what, int64_t window, int64_t start) {
  for (size_t i = 0; i < v.size(); ++i)
    check(std::isfinite(v[i]), what, ": logits are not finite (window ", window, ", position ",
          start + static_cast<int64_t>(i), ")");
}

void check_engine(const CudaEngine& e, int64_t vocab, int64_t ctx, const char* what) {
  check(e.config().vocab_size == vocab, what, ": vocabularies differ (", vocab, " vs ", e.config().vocab_size, ")");
  check(ctx <= e.max_sequence_length(), what, ": --ctx ", ctx, " exceeds an engine's maximum sequence length ",
        e.max_sequence_length());
  check(vocab <= cuda::kLogitStatsMaxVocab, what, ": a vocabulary of ", vocab, " is larger than the GPU's per-row ",
        "statistics take (", cuda::kLogitStatsMaxVocab, ")");
}

}  // namespace

PerplexityResult evaluate_perplexity_on_device(CudaEngine& engine, std::span<const int32_t> tokens,
                                               const PerplexityOptions& o,
                                               const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t windows = perplexity_windows(static_cast<int64_t>(tokens.size()), o);
  const int64_t vocab = engine.config().vocab_size;
  check_engine(engine, vocab, o.ctx, "perplexity on the GPU");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t total = windows * (o.ctx - 1);
  const int64_t max_rows = std::min(o.chunk, o.ctx);
  cuda::DeviceArray<int32_t> targets(static_cast<size_t>(max_rows), "targets");
  RowOutputs out(max_rows);
  double nll_sum = 0;
  int64_t done = 0;
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* win = tokens.data() + w * o.ctx;
    engine.reset(kSeq);
    for (int64_t start = 0; start < o.ctx; start += o.chunk) {
      const int64_t n = std::min(o.chunk, o.ctx - start);
      const SequenceChunk chunk{kSeq, std::vector<int32_t>(win + start, win + start + n)};
      const float* logits = engine.forward_logits_on_device(chunk);
      const int64_t rows = predicting_rows(n, start, o.ctx);
      if (rows == 0) continue;
      cuda::cuda_check(cudaMemcpy(targets.get(), win + start + 1, static_cast<size_t>(rows) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice),
                       "upload targets");
      check_stats(cuda::logit_row_stats(logits, vocab, static_cast<int>(rows), static_cast<int>(vocab),
                                        targets.get(), out.lse.get(), out.nll.get(), nullptr, nullptr),
                  "perplexity on the GPU");
      const std::vector<double> nll = download(out.nll, rows);
      check_finite(nll, "perplexity on the GPU", w, start);
      for (double v : nll) nll_sum += v;
      done += rows;
      if (progress) progress(done, total);
    }
  }
  engine.reset(kSeq);
  return perplexity_result(windows, done, nll_sum,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

std::vector<DistributionComparison> compare_distributions_on_device(
    CudaEngine& base, std::span<CudaEngine* const> others, std::span<const int32_t> tokens,
    const PerplexityOptions& o, const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t windows = perplexity_windows(static_cast<int64_t>(tokens.size()), o);
  const int64_t vocab = base.config().vocab_size;
  const size_t n_other = others.size();
  check_engine(base, vocab, o.ctx, "distribution comparison on the GPU");
  for (CudaEngine* e : others) {
    check(e != nullptr, "distribution comparison on the GPU: null engine");
    check_engine(*e, vocab, o.ctx, "distribution comparison on the GPU");
  }
  const int64_t total = windows * (o.ctx - 1);
  const int64_t max_rows = std::min(o.chunk, o.ctx);
  cuda::DeviceArray<int32_t> targets(static_cast<size_t>(max_rows), "targets");
  cuda::DeviceArray<double> kl_rows(static_cast<size_t>(max_rows), "per-row KL");
  RowOutputs base_out(max_rows), other_out(max_rows);
  double base_seconds = 0, base_nll = 0;
  std::vector<ComparisonSums> sums(n_other);
  int64_t done = 0;
  auto timed = [](CudaEngine& e, const SequenceChunk& chunk, double& seconds) {
    const auto s = std::chrono::steady_clock::now();
    const float* p = e.forward_logits_on_device(chunk);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    return p;
  };
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* win = tokens.data() + w * o.ctx;
    base.reset(kSeq);
    for (CudaEngine* e : others) e->reset(kSeq);
    for (int64_t start = 0; start < o.ctx; start += o.chunk) {
      const int64_t n = std::min(o.chunk, o.ctx - start);
      const SequenceChunk chunk{kSeq, std::vector<int32_t>(win + start, win + start + n)};
      const int64_t rows = predicting_rows(n, start, o.ctx);
      const int r = static_cast<int>(rows), v = static_cast<int>(vocab);
      // The base's logits stay in its own buffer while the other engines run (each engine owns one).
      const float* bl = timed(base, chunk, base_seconds);
      if (rows > 0) {
        cuda::cuda_check(cudaMemcpy(targets.get(), win + start + 1, static_cast<size_t>(rows) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice),
                         "upload targets");
        check_stats(cuda::logit_row_stats(bl, vocab, r, v, targets.get(), base_out.lse.get(), base_out.nll.get(),
                                          base_out.argmax.get(), nullptr),
                    "distribution comparison on the GPU");
      }
      const std::vector<double> bn = download(base_out.nll, rows);
      const std::vector<int32_t> ba = download(base_out.argmax, rows);
      check_finite(bn, "distribution comparison on the GPU (baseline)", w, start);
      for (double x : bn) base_nll += x;
      for (size_t k = 0; k < n_other; ++k) {
        const float* ol = timed(*others[k], chunk, sums[k].seconds);
        if (rows == 0) continue;
        check_stats(cuda::logit_row_stats(ol, vocab, r, v, targets.get(), other_out.lse.get(), other_out.nll.get(),
                                          other_out.argmax.get(), nullptr),
                    "distribution comparison on the GPU");
        check_stats(cuda::logit_row_kl(bl, vocab, base_out.lse.get(), ol, vocab, other_out.lse.get(), r, v,
                                       kl_rows.get(), nullptr),
                    "distribution comparison on the GPU");
        const std::vector<double> on = download(other_out.nll, rows), kl = download(kl_rows, rows);
        const std::vector<int32_t> oa = download(other_out.argmax, rows);
        check_finite(on, "distribution comparison on the GPU", w, start);
        check_finite(kl, "distribution comparison on the GPU (KL)", w, start);
        for (int64_t i = 0; i < rows; ++i) {
          const size_t s = static_cast<size_t>(i);
          sums[k].nll += on[s];
          sums[k].kl_sum += kl[s];
          sums[k].kl_max = std::max(sums[k].kl_max, kl[s]);
          sums[k].agree += oa[s] == ba[s];
        }
      }
      done += rows;
      if (progress) progress(done, total);
    }
  }
  base.reset(kSeq);
  for (CudaEngine* e : others) e->reset(kSeq);

  return distribution_comparisons(perplexity_result(windows, done, base_nll, base_seconds), sums);
}

}  // namespace futransformer::eval
