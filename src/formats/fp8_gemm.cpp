#include "futransformer/formats/fp8_gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"

namespace futransformer::formats {
namespace {

std::array<float, 256> decode_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_e4m3_decode(static_cast<uint8_t>(c));
  return t;
}

// A sum of doubles kept exactly as non-overlapping partials (Shewchuk's expansion arithmetic), then rounded once
// to nearest, ties to even. Needs IEEE round-to-nearest fp64 arithmetic without reassociation (no -ffast-math).
class ExactSum {
 public:
  void clear() { partials_.clear(); }
  void add(double x) {
    size_t kept = 0;
    for (double y : partials_) {
      if (std::fabs(x) < std::fabs(y)) std::swap(x, y);
      const double hi = x + y;
      const double lo = y - (hi - x);  // exact: |x| >= |y|
      if (lo != 0) partials_[kept++] = lo;
      x = hi;
    }
    partials_.resize(kept);
    partials_.push_back(x);
  }
  // The partials' exact sum rounded to fp64: add from the largest down until a rounding error appears; if that
  // error is exactly half an ulp and the next partial pushes the same way, the tie is not one and rounds away.
  double round() const {
    size_t n = partials_.size();
    if (n == 0) return 0;
    double hi = partials_[--n], lo = 0;
    while (n > 0) {
      const double x = hi, y = partials_[--n];
      hi = x + y;
      lo = y - (hi - x);
      if (lo != 0) break;
    }
    if (n > 0 && ((lo < 0 && partials_[n - 1] < 0) || (lo > 0 && partials_[n - 1] > 0))) {
      const double twice = lo * 2, up = hi + twice;
      if (twice == up - hi) hi = up;
    }
    return hi;
  }

 private:
  std::vector<double> partials_;
};

// Both twins: A's scales are [M, ceil(K / block)], block == K for one scale per row. `who` and `a_scale_count`
// (how the expected a_scale size is written) name the caller in errors.
Fp8GemmReference gemm_fp8_scaled_blocks(const char* who, const char* a_scale_count, std::span<const uint8_t> a,
                                        std::span<const uint8_t> b, std::span<const float> a_scale,
                                        std::span<const float> b_scale, int64_t M, int64_t N, int64_t K,
                                        int64_t block) {
  constexpr int64_t kMax = int64_t{1} << 31;
  check(M > 0 && N > 0 && K > 0 && M < kMax && N < kMax && K <= kFp8GemmExactMaxK, who, ": shape M = ", M, ", N = ",
        N, ", K = ", K, " is not positive or K exceeds ", kFp8GemmExactMaxK);
  check(static_cast<uint64_t>(a.size()) == static_cast<uint64_t>(M * K), who, ": A has ", a.size(),
        " codes, expected M * K = ", M * K);
  check(static_cast<uint64_t>(b.size()) == static_cast<uint64_t>(N * K), who, ": B has ", b.size(),
        " codes, expected N * K = ", N * K);
  const int64_t blocks = (K + block - 1) / block;
  check(static_cast<int64_t>(a_scale.size()) == M * blocks, who, ": a_scale has ", a_scale.size(), " values, expected ",
        a_scale_count, " = ", M * blocks);
  check(static_cast<int64_t>(b_scale.size()) == N, who, ": b_scale has ", b_scale.size(), " values, expected N = ", N);

  static const std::array<float, 256> lut = decode_table();
  std::vector<float> a_dec(a.size());
  for (size_t i = 0; i < a.size(); ++i) a_dec[i] = lut[a[i]];

  Fp8GemmReference r;
  const size_t out = static_cast<size_t>(M * N);
  r.bf16.resize(out);
  r.value.resize(out);
  r.abs_dot.resize(out);
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<float> b_dec(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) b_dec[static_cast<size_t>(k)] = lut[b[static_cast<size_t>(n * K + k)]];
    const double sb = b_scale[static_cast<size_t>(n)];
    ExactSum exact;
    for (int64_t m = 0; m < M; ++m) {
      const float* ar = a_dec.data() + m * K;
      exact.clear();
      double rounded = 0, abs_dot = 0;
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int64_t end = std::min(K, (kb + 1) * block);
        // Each float product is exact (4 x 4 significant bits) and so is every fp64 partial sum, so four
        // independent accumulators change nothing but the speed.
        double s[4] = {0, 0, 0, 0}, t[4] = {0, 0, 0, 0};
        int64_t k = kb * block;
        for (; k + 4 <= end; k += 4) {
          for (int j = 0; j < 4; ++j) {
            const double p = static_cast<double>(ar[k + j] * b_dec[static_cast<size_t>(k + j)]);
            s[j] += p;
            t[j] += std::fabs(p);
          }
        }
        for (; k < end; ++k) {
          const double p = static_cast<double>(ar[k] * b_dec[static_cast<size_t>(k)]);
          s[0] += p;
          t[0] += std::fabs(p);
        }
        const double sum = s[0] + s[1] + s[2] + s[3];
        const double scale = static_cast<double>(a_scale[static_cast<size_t>(m * blocks + kb)]) * sb;  // exact
        const double hi = sum * scale;
        exact.add(hi);
        exact.add(std::fma(sum, scale, -hi));  // hi + this = sum * scale exactly (no underflow: |scale| >= 2^-298)
        rounded += hi;
        abs_dot += (t[0] + t[1] + t[2] + t[3]) * std::fabs(scale);
      }
      double v = exact.round();
      // Non-finite terms have no exact sum; a zero keeps the sign IEEE addition gives it (one block: sum * scale's).
      if (!std::isfinite(rounded) || (v == 0 && rounded == 0)) v = rounded;
      const size_t i = static_cast<size_t>(m * N + n);
      r.value[i] = v;
      r.abs_dot[i] = abs_dot;
      r.bf16[i] = f32_to_bf16(static_cast<float>(v));
    }
  }
  return r;
}

}  // namespace

Fp8GemmReference gemm_fp8_reference(std::span<const uint8_t> a, std::span<const uint8_t> b,
                                    std::span<const float> a_scale, std::span<const float> b_scale, int64_t M,
                                    int64_t N, int64_t K) {
  return gemm_fp8_scaled_blocks("gemm_fp8_reference", "M", a, b, a_scale, b_scale, M, N, K, std::max<int64_t>(K, 1));
}

Fp8GemmReference gemm_fp8_block_a_reference(std::span<const uint8_t> a, std::span<const uint8_t> b,
                                            std::span<const float> a_scale, std::span<const float> b_scale, int64_t M,
                                            int64_t N, int64_t K) {
  return gemm_fp8_scaled_blocks("gemm_fp8_block_a_reference", "M * ceil(K / 128)", a, b, a_scale, b_scale, M, N, K,
                                kFp8BlockCols);
}

}  // namespace futransformer::formats
