// Host side of the per-row logit statistics: argument checks and the launch (one CTA per row; kernels in
// logit_stats.cuh).
#include "futransformer/cuda/logit_stats.h"

#include <string>

#include "launch_status.h"
#include "logit_stats.cuh"

namespace futransformer::cuda {
namespace {

thread_local std::string g_last_error;

// Rows are read with 16-byte loads only when every row start is 16-byte aligned: the pointer and the row stride.
bool rows_16b_aligned(const float* p, int64_t ld) { return aligned(p, 16) && ld % 4 == 0; }

}  // namespace

cudaError_t logit_row_stats_can_implement(int64_t ld, int rows, int vocab, std::string* why) {
  if (rows < 0) return reject(why, "logit_row_stats: rows must be >= 0, got " + std::to_string(rows));
  if (vocab < 1 || vocab > kLogitStatsMaxVocab)
    return reject(why, "logit_row_stats: vocab must be in [1, " + std::to_string(kLogitStatsMaxVocab) + "], got " +
                           std::to_string(vocab));
  if (ld < vocab)
    return reject(why, "logit_row_stats: ld (row stride, in floats) must be >= vocab " + std::to_string(vocab) +
                           ", got " + std::to_string(ld));
  return cudaSuccess;
}

cudaError_t logit_row_kl_can_implement(int64_t ld_base, int64_t ld_other, int rows, int vocab, std::string* why) {
  if (rows < 0) return reject(why, "logit_row_kl: rows must be >= 0, got " + std::to_string(rows));
  if (vocab < 1 || vocab > kLogitStatsMaxVocab)
    return reject(why, "logit_row_kl: vocab must be in [1, " + std::to_string(kLogitStatsMaxVocab) + "], got " +
                           std::to_string(vocab));
  if (ld_base < vocab)
    return reject(why, "logit_row_kl: ld_base must be >= vocab " + std::to_string(vocab) + ", got " +
                           std::to_string(ld_base));
  if (ld_other < vocab)
    return reject(why, "logit_row_kl: ld_other must be >= vocab " + std::to_string(vocab) + ", got " +
                           std::to_string(ld_other));
  return cudaSuccess;
}

cudaError_t logit_row_stats(const float* logits, int64_t ld, int rows, int vocab, const int32_t* targets, double* lse,
                            double* nll, int32_t* argmax, cudaStream_t stream) {
  g_last_error.clear();
  if (const cudaError_t e = logit_row_stats_can_implement(ld, rows, vocab, &g_last_error); e != cudaSuccess) return e;
  if (logits == nullptr || !aligned(logits, 4))
    return reject(&g_last_error, "logit_row_stats: logits must be a non-null, 4-byte aligned fp32 pointer");
  if (lse == nullptr && nll == nullptr && argmax == nullptr)
    return reject(&g_last_error, "logit_row_stats: lse, nll and argmax are all null (nothing to compute)");
  if (nll != nullptr && (targets == nullptr || !aligned(targets, 4)))
    return reject(&g_last_error, "logit_row_stats: nll needs targets, a non-null 4-byte aligned int32 pointer");
  if ((lse && !aligned(lse, 8)) || (nll && !aligned(nll, 8)) || (argmax && !aligned(argmax, 4)))
    return reject(&g_last_error, "logit_row_stats: lse and nll must be 8-byte aligned, argmax 4-byte aligned");
  if (rows == 0) return cudaSuccess;
  auto kernel = rows_16b_aligned(logits, ld) ? logit_stats_ops::row_stats_kernel<true>
                                             : logit_stats_ops::row_stats_kernel<false>;
  kernel<<<rows, logit_stats_ops::kThreads, 0, stream>>>(logits, ld, vocab, targets, lse, nll, argmax);
  return cudaGetLastError();
}

cudaError_t logit_row_kl(const float* base, int64_t ld_base, const double* lse_base, const float* other,
                         int64_t ld_other, const double* lse_other, int rows, int vocab, double* kl,
                         cudaStream_t stream) {
  g_last_error.clear();
  if (const cudaError_t e = logit_row_kl_can_implement(ld_base, ld_other, rows, vocab, &g_last_error);
      e != cudaSuccess)
    return e;
  if (base == nullptr || other == nullptr || !aligned(base, 4) || !aligned(other, 4))
    return reject(&g_last_error, "logit_row_kl: base and other must be non-null, 4-byte aligned fp32 pointers");
  if (lse_base == nullptr || lse_other == nullptr || kl == nullptr || !aligned(lse_base, 8) ||
      !aligned(lse_other, 8) || !aligned(kl, 8))
    return reject(&g_last_error, "logit_row_kl: lse_base, lse_other and kl must be non-null, 8-byte aligned");
  if (rows == 0) return cudaSuccess;
  // The 16-byte path needs both rows aligned (one group index walks both).
  auto kernel = rows_16b_aligned(base, ld_base) && rows_16b_aligned(other, ld_other)
                    ? logit_stats_ops::row_kl_kernel<true>
                    : logit_stats_ops::row_kl_kernel<false>;
  kernel<<<rows, logit_stats_ops::kThreads, 0, stream>>>(base, ld_base, lse_base, other, ld_other, lse_other, vocab,
                                                         kl);
  return cudaGetLastError();
}

const char* logit_stats_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
