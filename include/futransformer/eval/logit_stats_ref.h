// CPU twin of the GPU logit statistics (futransformer/cuda/logit_stats.h): the same formulas in fp64, summed in
// index order (the order of src/eval/kl.cpp), so it also serves as the host fallback. Non-finite logits give NaN
// results (argmax −1) instead of kl.cpp's Error, as the GPU op does.
#pragma once

#include <cstdint>
#include <span>

namespace futransformer::eval {

struct LogitRowStats {
  double lse = 0;      // m + log Σ exp(x − m), m = max x
  double nll = 0;      // lse − x[target]; NaN when target is outside [0, size)
  int32_t argmax = 0;  // first index of the maximum (eval::argmax); −1 for a non-finite row
};

// Statistics of one row (non-empty). A NaN or ±Inf logit gives lse = nll = NaN and argmax = −1.
LogitRowStats logit_row_stats_ref(std::span<const float> logits, int32_t target);

// KL(P || Q) = Σ_i p_i (lp_i − lq_i), lp_i = x_i − lse_base, lq_i = y_i − lse_other, p_i = exp(lp_i), summed in
// index order. NaN when a logit or an lse is not finite. Rows of equal, non-zero size. When term_abs_sum is
// non-null it receives Σ_i |p_i (lp_i − lq_i)|, which bounds the rounding error of any summation order (tests).
double logit_row_kl_ref(std::span<const float> base, double lse_base, std::span<const float> other, double lse_other,
                        double* term_abs_sum = nullptr);

}  // namespace futransformer::eval
