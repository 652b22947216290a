#include "ref/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "futransformer/error.h"

#ifdef FT_HAVE_BLAS
#include <cblas.h>
#endif

// Pragmas only where OpenMP is enabled, so a build without it has no unknown-pragma warnings.
#ifdef _OPENMP
#define FT_OMP(x) _Pragma(#x)
#else
#define FT_OMP(x)
#endif

namespace futransformer::ref {

namespace {

// Multiply-adds below which an op runs on one thread (about a millisecond of scalar work); counted in double so
// no size product can overflow.
constexpr double kParallelMinWork = 4.0e6;
// Query count from which attention uses matrix products (BLAS builds).
[[maybe_unused]] constexpr int64_t kBlasMinQueries = 4;

// fp32 dot product; the simd reduction lets the compiler vectorise a sum it may not otherwise reorder.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  FT_OMP(omp simd reduction(+ : acc))
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

void matmul_nt(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  check(m >= 0 && n >= 0 && k >= 0, "matmul_nt: negative size (m ", m, ", n ", n, ", k ", k, ")");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return;
  }
#ifdef FT_HAVE_BLAS
  // OpenBLAS takes 32-bit sizes.
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  check(m <= kMax && n <= kMax && k <= kMax, "matmul_nt: size above 2^31 (m ", m, ", n ", n, ", k ", k, ")");
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y, static_cast<int>(n));
#else
  // Rows of W outermost in each tile so a tile of W stays in cache while every row of x passes over it.
  constexpr int64_t kTile = 64;
  [[maybe_unused]] const bool parallel = double(m) * double(n) * double(k) >= kParallelMinWork;
  FT_OMP(omp parallel for schedule(static) if (parallel))
  for (int64_t n0 = 0; n0 < n; n0 += kTile) {
    const int64_t n1 = std::min(n, n0 + kTile);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = n0; j < n1; ++j) y[i * n + j] = dot(x + i * k, w + j * k, k);
    }
  }
#endif
}

void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  check(n > 0, "rmsnorm: empty row");
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (scale * x[i]);
}

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling) {
  check(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq: head_dim ", head_dim, " must be positive and even");
  check(theta > 0, "rope_inv_freq: theta ", theta, " must be positive");
  const bool llama3 = scaling.type == "llama3";
  check(llama3 || scaling.type.empty(), "rope_inv_freq: rope scaling '", scaling.type,
        "' is not supported (expected none or 'llama3')");
  if (llama3) {
    check(scaling.factor > 0 && scaling.low_freq_factor > 0 && scaling.high_freq_factor > scaling.low_freq_factor &&
              scaling.original_max_position_embeddings > 0,
          "rope_inv_freq: llama3 scaling parameters out of range");
  }
  const int64_t half = head_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (llama3) {
      const double orig = static_cast<double>(scaling.original_max_position_embeddings);
      const double low = scaling.low_freq_factor, high = scaling.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < orig / high) {
        // High frequencies (short wavelengths) are left alone.
      } else if (wavelen > orig / low) {
        f = f / scaling.factor;
      } else {
        const double smooth = (orig / wavelen - low) / (high - low);
        f = (1.0 - smooth) * f / scaling.factor + smooth * f;
      }
    }
    if (!scaling.freq_divisors.empty()) {
      check(static_cast<int64_t>(scaling.freq_divisors.size()) == half, "rope_inv_freq: ",
            scaling.freq_divisors.size(), " frequency divisors, expected ", half);
      f /= scaling.freq_divisors[static_cast<size_t>(i)];
    }
    out[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return out;
}

void apply_rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq) {
  check(head_dim > 0 && head_dim % 2 == 0, "apply_rope: head_dim ", head_dim, " must be positive and even");
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * static_cast<double>(inv_freq[i]);
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    for (int64_t h = 0; h < n_heads; ++h) {
      float* head = x + h * head_dim;
      const float x0 = head[i], x1 = head[i + half];
      head[i] = x0 * c - x1 * s;
      head[i + half] = x1 * c + x0 * s;
    }
  }
}

void softmax(float* x, int64_t n) {
  check(n > 0, "softmax: empty input");
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

namespace {

// One query at a time: scores, softmax and the weighted sum of values as plain loops.
void attention_loops(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_pos0,
                     int64_t n_kv, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t q_stride = n_heads * head_dim, kv_stride = n_kv_heads * head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  // Threads only pay off for prefill-sized work: on a busy machine every parallel region costs a wait for the
  // slowest thread's time slice, which would dominate a decode step (one query per head).
  [[maybe_unused]] const bool parallel =
      double(n_q) * double(n_heads) * double(n_kv) * double(head_dim) >= kParallelMinWork;
  FT_OMP(omp parallel if (parallel))
  {
    std::vector<float> scores(static_cast<size_t>(n_kv));
    FT_OMP(omp for collapse(2) schedule(dynamic))
    for (int64_t i = 0; i < n_q; ++i) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t len = q_pos0 + i + 1;  // causal: keys 0 … q_pos0 + i
        const float* qh = q + i * q_stride + h * head_dim;
        const int64_t koff = (h / group) * head_dim;
        for (int64_t t = 0; t < len; ++t) scores[t] = dot(qh, k + t * kv_stride + koff, head_dim) * scale;
        softmax(scores.data(), len);
        float* o = out + i * q_stride + h * head_dim;
        std::fill(o, o + head_dim, 0.0f);
        for (int64_t t = 0; t < len; ++t) {
          const float p = scores[t];
          const float* vt = v + t * kv_stride + koff;
          FT_OMP(omp simd)
          for (int64_t j = 0; j < head_dim; ++j) o[j] += p * vt[j];
        }
      }
    }
  }
}

#ifdef FT_HAVE_BLAS
// The same math for a block of queries per head as two matrix products: S = Q·Kᵀ·scale over the keys the block's
// last query sees, each row softmaxed over its own causal prefix (the rest zeroed), then O = S·V. Prefill spends
// most of its attention time here, and BLAS is an order of magnitude faster than the loops.
void attention_blas(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_pos0,
                    int64_t n_kv, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  check(n_kv <= kMax && n_heads * head_dim <= kMax, "attention: sizes above 2^31 (", n_kv, " keys, ", n_heads,
        " heads of ", head_dim, ")");
  // Bounds the score block to kBlock × n_kv floats (1 MiB per 2048 keys).
  constexpr int64_t kBlock = 128;
  const int64_t group = n_heads / n_kv_heads;
  const int q_stride = static_cast<int>(n_heads * head_dim), kv_stride = static_cast<int>(n_kv_heads * head_dim);
  const int d = static_cast<int>(head_dim);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  std::vector<float> s;
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t koff = (h / group) * head_dim;
    for (int64_t i0 = 0; i0 < n_q; i0 += kBlock) {
      const int64_t rows = std::min(kBlock, n_q - i0);
      const int64_t len = q_pos0 + i0 + rows;
      s.assign(static_cast<size_t>(rows * len), 0.0f);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(len), d, scale,
                  q + i0 * q_stride + h * head_dim, q_stride, k + koff, kv_stride, 0.0f, s.data(),
                  static_cast<int>(len));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t visible = q_pos0 + i0 + r + 1;
        softmax(&s[r * len], visible);
        std::fill(s.begin() + r * len + visible, s.begin() + (r + 1) * len, 0.0f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), d, static_cast<int>(len), 1.0f,
                  s.data(), static_cast<int>(len), v + koff, kv_stride, 0.0f, out + i0 * q_stride + h * head_dim,
                  q_stride);
    }
  }
}
#endif

}  // namespace

void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  check(n_q >= 0 && q_pos0 >= 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0, "attention: bad sizes (n_q ", n_q,
        ", q_pos0 ", q_pos0, ", heads ", n_heads, ", kv heads ", n_kv_heads, ", head_dim ", head_dim, ")");
  check(n_heads % n_kv_heads == 0, "attention: ", n_heads, " query heads are not a multiple of ", n_kv_heads,
        " KV heads");
  check(q_pos0 + n_q <= n_kv, "attention: queries reach position ", q_pos0 + n_q - 1, " but the cache holds ", n_kv,
        " positions");
  if (n_q == 0) return;
#ifdef FT_HAVE_BLAS
  // A few queries (decode) stay on the loops, so both implementations run in every BLAS build and its tests.
  if (n_q >= kBlasMinQueries) return attention_blas(q, k, v, out, n_q, q_pos0, n_kv, n_heads, n_kv_heads, head_dim);
#endif
  attention_loops(q, k, v, out, n_q, q_pos0, n_kv, n_heads, n_kv_heads, head_dim);
}

}  // namespace futransformer::ref
