// Per-row statistics of fp32 logit rows on the GPU, for perplexity, KL divergence and top-1 agreement without
// downloading the logits: each row's log-sum-exp, the NLL of a target token, the argmax, and KL(P || Q) between two
// rows. The CPU twin is futransformer/eval/logit_stats_ref.h (the same formulas; fp64 sums in another order).
//
//   logits   fp32 [rows, vocab], row r at logits + r · ld (ld >= vocab; any 4-byte aligned pointer and any ld work,
//            rows whose start is 16-byte aligned are read with 16-byte loads).
//   lse      fp64 [rows]: m_r + log Σ_i exp(x_i − m_r), m_r = max_i x_i; terms and sums in fp64.
//   nll      fp64 [rows]: lse_r − x_r[target_r]; NaN ("no target") when target_r is outside [0, vocab).
//   argmax   int32 [rows]: the first index of the largest logit (futransformer::eval::argmax).
//   kl       fp64 [rows]: Σ_i p_i (lp_i − lq_i), lp_i = x_i − lse_P, lq_i = y_i − lse_Q, p_i = exp(lp_i).
//
// A row with a NaN or ±Inf logit (for KL: in either row, or a non-finite lse) gets NaN in lse, nll and kl and −1 in
// argmax, so the host can report the position instead of crashing. (Stricter than src/eval/kl.cpp, which accepts
// −Inf logits when the row's maximum is finite.)
//
// Deterministic: one CTA per row; thread t takes the 4-element groups t, t + T, t + 2T, … of the row in order and
// the partial results are merged in a fixed tree, whatever the alignment of the row (so a row gives bit-identical
// results wherever it lies in memory). Identical rows with identical lse give KL exactly 0.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace futransformer::cuda {

constexpr int kLogitStatsMaxVocab = 1 << 20;

// cudaSuccess when the sizes can run, else cudaErrorInvalidValue with the reason in *why (when non-null): rows >= 0
// (0 is a no-op), 1 <= vocab <= 2^20, ld >= vocab. Needs no device.
cudaError_t logit_row_stats_can_implement(int64_t ld, int rows, int vocab, std::string* why);
cudaError_t logit_row_kl_can_implement(int64_t ld_base, int64_t ld_other, int rows, int vocab, std::string* why);

// Enqueues one kernel on `stream` (no allocation, no synchronisation: graph-capturable). Any of lse, nll and argmax
// may be null (that output is not written) but not all three; nll needs targets (int32 [rows]). Returns
// cudaErrorInvalidValue (message in logit_stats_last_error()) for rejected sizes, null or misaligned pointers
// (logits 4-byte, lse/nll 8-byte, targets/argmax 4-byte aligned); otherwise the launch status.
cudaError_t logit_row_stats(const float* logits, int64_t ld, int rows, int vocab, const int32_t* targets, double* lse,
                            double* nll, int32_t* argmax, cudaStream_t stream);

// KL(P || Q) per row, P = softmax(base row), Q = softmax(other row), from both rows' lse (as logit_row_stats gives
// them). All pointers non-null; same alignment rules. Returns as logit_row_stats.
cudaError_t logit_row_kl(const float* base, int64_t ld_base, const double* lse_base, const float* other,
                         int64_t ld_other, const double* lse_other, int rows, int vocab, double* kl,
                         cudaStream_t stream);

// Why the last logit_row_stats / logit_row_kl call on this thread returned cudaErrorInvalidValue ("" after an
// accepted call).
const char* logit_stats_last_error();

}  // namespace futransformer::cuda
