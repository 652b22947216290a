// Small dense linear algebra for the GPTQ quantiser: row-major, double for the factorizations, float for the
// error propagation. Each routine uses OpenBLAS level-3 calls when the library was built with it (FT_HAVE_BLAS)
// and allow_blas is true, else plain loops parallelised over rows with OpenMP; tests run both paths.
#pragma once

#include <cstdint>
#include <vector>

namespace futransformer::quant::detail {

// Loops go parallel only above this many multiply-adds: below it, waking the OpenMP team (which spins while
// waiting, and on a shared machine competes with BLAS threads for cores) costs more than the work.
constexpr int64_t kMinParallelWork = int64_t{1} << 20;

// In-place lower Cholesky factor of the symmetric matrix a [n, n] (leading dimension lda): only the lower
// triangle is read; on return it holds L with a = L·Lᵀ (the strict upper triangle is left untouched).
// Returns false when a is not (numerically) positive definite: a pivot that is <= 0, not finite, or below 1e-10 of
// its diagonal entry (singular to working precision).
bool cholesky_lower(double* a, int64_t n, int64_t lda, bool allow_blas = true);

// In-place inverse of the lower-triangular l [n, n] (leading dimension lda, positive diagonal); only the lower
// triangle is read and written.
void invert_lower(double* l, int64_t n, int64_t lda, bool allow_blas = true);

// The upper-triangular U with Uᵀ·U = H⁻¹ (the "upper Cholesky factor of H⁻¹" GPTQ propagates errors with) for
// the symmetric positive-definite r = J·H·J given *reversed* (J flips the index order: r[i][j] = H[n-1-i][n-1-j]),
// of which only the lower triangle is read. r is overwritten. Returns false when H is not positive definite.
// Why reversed: with J·H·J = L·Lᵀ, H = (J·L·J)(J·L·J)ᵀ with J·L·J upper, so U = (J·L·J)⁻¹ = J·L⁻¹·J — one
// Cholesky and one triangular inverse instead of GPTQ's Cholesky, inverse and second Cholesky.
// On success u [n, n] holds U as float (zeros below the diagonal) and u_diag its diagonal in double.
bool upper_cholesky_of_inverse_reversed(std::vector<double>& r, int64_t n, std::vector<float>& u,
                                        std::vector<double>& u_diag, bool allow_blas = true);

// c[m, n] (ldc) -= a[m, k] (lda) · b[k, n] (ldb), float. Each row of c is summed in a fixed order, so the result
// does not depend on the thread count.
void gemm_sub(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m, int64_t n,
              int64_t k, bool allow_blas = true);

// h[k, k] (upper triangle only) = beta·h + Σ_t x[t]ᵀ·x[t] over the rows of x [n_rows, k], double.
void syrk_upper_accumulate(const double* x, int64_t n_rows, int64_t k, double beta, double* h,
                           bool allow_blas = true);

}  // namespace futransformer::quant::detail
