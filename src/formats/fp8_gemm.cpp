#include "futransformer/formats/fp8_gemm.h"

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

}  // namespace

Fp8GemmReference gemm_fp8_reference(std::span<const uint8_t> a, std::span<const uint8_t> b,
                                    std::span<const float> a_scale, std::span<const float> b_scale, int64_t M,
                                    int64_t N, int64_t K) {
  constexpr int64_t kMax = int64_t{1} << 31;
  check(M > 0 && N > 0 && K > 0 && M < kMax && N < kMax && K <= kFp8GemmExactMaxK, "gemm_fp8_reference: shape M = ",
        M, ", N = ", N, ", K = ", K, " is not positive or K exceeds ", kFp8GemmExactMaxK);
  check(static_cast<uint64_t>(a.size()) == static_cast<uint64_t>(M * K), "gemm_fp8_reference: A has ", a.size(),
        " codes, expected M * K = ", M * K);
  check(static_cast<uint64_t>(b.size()) == static_cast<uint64_t>(N * K), "gemm_fp8_reference: B has ", b.size(),
        " codes, expected N * K = ", N * K);
  check(static_cast<int64_t>(a_scale.size()) == M, "gemm_fp8_reference: a_scale has ", a_scale.size(),
        " values, expected M = ", M);
  check(static_cast<int64_t>(b_scale.size()) == N, "gemm_fp8_reference: b_scale has ", b_scale.size(),
        " values, expected N = ", N);

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
    for (int64_t m = 0; m < M; ++m) {
      const float* ar = a_dec.data() + m * K;
      // Each float product is exact (4 x 4 significant bits) and so is every fp64 partial sum, so four
      // independent accumulators change nothing but the speed.
      double s[4] = {0, 0, 0, 0}, t[4] = {0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 4 <= K; k += 4) {
        for (int j = 0; j < 4; ++j) {
          const double p = static_cast<double>(ar[k + j] * b_dec[static_cast<size_t>(k + j)]);
          s[j] += p;
          t[j] += std::fabs(p);
        }
      }
      for (; k < K; ++k) {
        const double p = static_cast<double>(ar[k] * b_dec[static_cast<size_t>(k)]);
        s[0] += p;
        t[0] += std::fabs(p);
      }
      const double scale = static_cast<double>(a_scale[static_cast<size_t>(m)]) * b_scale[static_cast<size_t>(n)];
      const double v = (s[0] + s[1] + s[2] + s[3]) * scale;
      const size_t i = static_cast<size_t>(m * N + n);
      r.value[i] = v;
      r.abs_dot[i] = (t[0] + t[1] + t[2] + t[3]) * std::fabs(scale);
      r.bf16[i] = f32_to_bf16(static_cast<float>(v));
    }
  }
  return r;
}

}  // namespace futransformer::formats
