#include "quant/dense.h"

#include <algorithm>
#include <climits>
#include <cmath>

#ifdef FT_HAVE_BLAS
#include <cblas.h>
#endif

namespace futransformer::quant::detail {
namespace {

// Below this size the recursion stops: the unblocked loops fit in L1 and BLAS call overhead would dominate.
constexpr int64_t kBaseBlock = 64;
// A pivot that keeps less than this fraction of its diagonal entry means the matrix is singular to working
// precision (rounding, not the data, decided its sign): report "not positive definite" so the caller adds damping
// instead of propagating errors through a factor with entries of 1e8.
constexpr double kMinRelativePivot = 1e-10;

// BLAS takes 32-bit dimensions; anything larger goes through the loops.
bool use_blas(bool allow, std::initializer_list<int64_t> dims) {
#ifdef FT_HAVE_BLAS
  if (!allow) return false;
  for (int64_t d : dims)
    if (d > INT_MAX) return false;
  return true;
#else
  (void)allow;
  (void)dims;
  return false;
#endif
}

bool cholesky_unblocked(double* a, int64_t n, int64_t lda) {
  for (int64_t j = 0; j < n; ++j) {
    double* aj = a + j * lda;
    double d = aj[j];
    for (int64_t t = 0; t < j; ++t) d -= aj[t] * aj[t];
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    const double ljj = std::sqrt(d);
    aj[j] = ljj;
    for (int64_t i = j + 1; i < n; ++i) {
      double* ai = a + i * lda;
      double s = ai[j];
      for (int64_t t = 0; t < j; ++t) s -= ai[t] * aj[t];
      ai[j] = s / ljj;
    }
  }
  return true;
}

// b[m, n] = b · l⁻ᵀ for lower-triangular l [n, n].
void trsm_right_lower_trans(const double* l, int64_t n, double* b, int64_t m, int64_t lda, bool allow_blas) {
#ifdef FT_HAVE_BLAS
  if (use_blas(allow_blas, {n, m, lda})) {
    cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, static_cast<int>(m),
                static_cast<int>(n), 1.0, l, static_cast<int>(lda), b, static_cast<int>(lda));
    return;
  }
#endif
#pragma omp parallel for schedule(static) if (m * n * n / 2 >= kMinParallelWork)
  for (int64_t r = 0; r < m; ++r) {
    double* x = b + r * lda;
    for (int64_t j = 0; j < n; ++j) {
      const double* lj = l + j * lda;
      double s = x[j];
      for (int64_t t = 0; t < j; ++t) s -= x[t] * lj[t];
      x[j] = s / lj[j];
    }
  }
}

// c[m, m] (lower) -= a[m, k] · a[m, k]ᵀ.
void syrk_lower_sub(const double* a, int64_t m, int64_t k, double* c, int64_t lda, bool allow_blas) {
#ifdef FT_HAVE_BLAS
  if (use_blas(allow_blas, {m, k, lda})) {
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, static_cast<int>(m), static_cast<int>(k), -1.0, a,
                static_cast<int>(lda), 1.0, c, static_cast<int>(lda));
    return;
  }
#endif
#pragma omp parallel for schedule(dynamic, 16) if (m * m * k / 2 >= kMinParallelWork)
  for (int64_t i = 0; i < m; ++i) {
    const double* ai = a + i * lda;
    double* ci = c + i * lda;
    for (int64_t j = 0; j <= i; ++j) {
      const double* aj = a + j * lda;
      double s = 0.0;
      for (int64_t t = 0; t < k; ++t) s += ai[t] * aj[t];
      ci[j] -= s;
    }
  }
}

bool cholesky_recursive(double* a, int64_t n, int64_t lda, bool allow_blas) {
  if (n <= kBaseBlock) return cholesky_unblocked(a, n, lda);
  // [A11 .; A21 A22] = [L11 0; L21 L22]·[..]ᵀ: L21 = A21·L11⁻ᵀ, L22 = chol(A22 − L21·L21ᵀ).
  const int64_t n1 = n / 2, n2 = n - n1;
  double* a11 = a;
  double* a21 = a + n1 * lda;
  double* a22 = a21 + n1;
  if (!cholesky_recursive(a11, n1, lda, allow_blas)) return false;
  trsm_right_lower_trans(a11, n1, a21, n2, lda, allow_blas);
  syrk_lower_sub(a21, n2, n1, a22, lda, allow_blas);
  return cholesky_recursive(a22, n2, lda, allow_blas);
}

void invert_lower_unblocked(double* l, int64_t n, int64_t lda) {
  // Right to left: column j of L⁻¹ below the diagonal is −(1/l_jj)·T·l[j+1:, j], where T is the trailing block,
  // already inverted (LAPACK's trti2 order).
  std::vector<double> col(static_cast<size_t>(n));
  for (int64_t j = n - 1; j >= 0; --j) {
    double* lj = l + j * lda;
    lj[j] = 1.0 / lj[j];
    const double neg_inv = -lj[j];
    for (int64_t i = j + 1; i < n; ++i) col[static_cast<size_t>(i)] = l[i * lda + j];
    for (int64_t i = j + 1; i < n; ++i) {
      const double* li = l + i * lda;
      double s = 0.0;
      for (int64_t t = j + 1; t <= i; ++t) s += li[t] * col[static_cast<size_t>(t)];
      l[i * lda + j] = neg_inv * s;
    }
  }
}

// b[m, n] = alpha · b · l for lower-triangular l [n, n].
void trmm_right_lower(const double* l, int64_t n, double* b, int64_t m, int64_t lda, double alpha, bool allow_blas) {
#ifdef FT_HAVE_BLAS
  if (use_blas(allow_blas, {n, m, lda})) {
    cblas_dtrmm(CblasRowMajor, CblasRight, CblasLower, CblasNoTrans, CblasNonUnit, static_cast<int>(m),
                static_cast<int>(n), alpha, l, static_cast<int>(lda), b, static_cast<int>(lda));
    return;
  }
#endif
#pragma omp parallel if (m * n * n / 2 >= kMinParallelWork)
  {
    std::vector<double> y(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < m; ++r) {
      double* br = b + r * lda;
      std::fill(y.begin(), y.end(), 0.0);
      for (int64_t t = 0; t < n; ++t) {
        const double bt = br[t];
        const double* lt = l + t * lda;
        for (int64_t j = 0; j <= t; ++j) y[static_cast<size_t>(j)] += bt * lt[j];
      }
      for (int64_t j = 0; j < n; ++j) br[j] = alpha * y[static_cast<size_t>(j)];
    }
  }
}

// b[m, n] = l · b for lower-triangular l [m, m].
void trmm_left_lower(const double* l, int64_t m, double* b, int64_t n, int64_t lda, bool allow_blas) {
#ifdef FT_HAVE_BLAS
  if (use_blas(allow_blas, {n, m, lda})) {
    cblas_dtrmm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, static_cast<int>(m),
                static_cast<int>(n), 1.0, l, static_cast<int>(lda), b, static_cast<int>(lda));
    return;
  }
#endif
  std::vector<double> src(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) std::copy(b + i * lda, b + i * lda + n, src.begin() + i * n);
#pragma omp parallel for schedule(dynamic, 8) if (m * m * n / 2 >= kMinParallelWork)
  for (int64_t i = 0; i < m; ++i) {
    double* bi = b + i * lda;
    std::fill(bi, bi + n, 0.0);
    const double* li = l + i * lda;
    for (int64_t t = 0; t <= i; ++t) {
      const double lit = li[t];
      const double* st = src.data() + t * n;
      for (int64_t j = 0; j < n; ++j) bi[j] += lit * st[j];
    }
  }
}

void invert_lower_recursive(double* l, int64_t n, int64_t lda, bool allow_blas) {
  if (n <= kBaseBlock) {
    invert_lower_unblocked(l, n, lda);
    return;
  }
  // [A 0; B C]⁻¹ = [A⁻¹ 0; −C⁻¹·B·A⁻¹ C⁻¹].
  const int64_t n1 = n / 2, n2 = n - n1;
  double* a = l;
  double* b = l + n1 * lda;
  double* c = b + n1;
  invert_lower_recursive(a, n1, lda, allow_blas);
  invert_lower_recursive(c, n2, lda, allow_blas);
  trmm_right_lower(a, n1, b, n2, lda, -1.0, allow_blas);
  trmm_left_lower(c, n2, b, n1, lda, allow_blas);
}

}  // namespace

bool cholesky_lower(double* a, int64_t n, int64_t lda, bool allow_blas) {
  std::vector<double> diag(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) diag[static_cast<size_t>(j)] = a[j * lda + j];
  if (!cholesky_recursive(a, n, lda, allow_blas)) return false;
  for (int64_t j = 0; j < n; ++j) {
    const double l = a[j * lda + j];
    if (!(l * l >= kMinRelativePivot * diag[static_cast<size_t>(j)])) return false;
  }
  return true;
}

void invert_lower(double* l, int64_t n, int64_t lda, bool allow_blas) {
  invert_lower_recursive(l, n, lda, allow_blas);
}

bool upper_cholesky_of_inverse_reversed(std::vector<double>& r, int64_t n, std::vector<float>& u,
                                        std::vector<double>& u_diag, bool allow_blas) {
  if (!cholesky_lower(r.data(), n, n, allow_blas)) return false;
  invert_lower(r.data(), n, n, allow_blas);
  u.assign(static_cast<size_t>(n * n), 0.0f);
  u_diag.resize(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n * n / 2 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const double* src = r.data() + (n - 1 - i) * n;
    float* dst = u.data() + i * n;
    for (int64_t j = i; j < n; ++j) dst[j] = static_cast<float>(src[n - 1 - j]);
    u_diag[static_cast<size_t>(i)] = src[n - 1 - i];
  }
  return true;
}

void gemm_sub(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m, int64_t n,
              int64_t k, bool allow_blas) {
  if (m <= 0 || n <= 0 || k <= 0) return;
#ifdef FT_HAVE_BLAS
  if (use_blas(allow_blas, {m, n, k, lda, ldb, ldc})) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), -1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 1.0f, c,
                static_cast<int>(ldc));
    return;
  }
#endif
#pragma omp parallel for schedule(static) if (m * n * k >= kMinParallelWork)
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    const float* ai = a + i * lda;
    for (int64_t t = 0; t < k; ++t) {
      const float e = ai[t];
      if (e == 0.0f) continue;
      const float* bt = b + t * ldb;
      for (int64_t j = 0; j < n; ++j) ci[j] -= e * bt[j];
    }
  }
}

void syrk_upper_accumulate(const double* x, int64_t n_rows, int64_t k, double beta, double* h, bool allow_blas) {
  if (k <= 0) return;
#ifdef FT_HAVE_BLAS
  if (use_blas(allow_blas, {n_rows, k}) && n_rows > 0) {
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(k), static_cast<int>(n_rows), 1.0, x,
                static_cast<int>(k), beta, h, static_cast<int>(k));
    return;
  }
#endif
#pragma omp parallel for schedule(dynamic, 16) if (k * k * n_rows / 2 >= kMinParallelWork)
  for (int64_t i = 0; i < k; ++i) {
    double* hi = h + i * k;
    for (int64_t j = i; j < k; ++j) hi[j] *= beta;
    for (int64_t t = 0; t < n_rows; ++t) {
      const double* xt = x + t * k;
      const double xi = xt[i];
      if (xi == 0.0) continue;
      for (int64_t j = i; j < k; ++j) hi[j] += xi * xt[j];
    }
  }
}

}  // namespace futransformer::quant::detail
