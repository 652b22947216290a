// exp(x) for the sampler's probabilities, written once for the host (src/engine/sampling.cpp) and the GPU
// (src/cuda/sampling.cuh) so both compute bit-identical fp64 values: every step is an IEEE operation with one
// rounding (fma, multiply by a power of two, floor), so no library exp (glibc and CUDA differ by up to 1 ulp) and
// no compiler contraction choice can make the two sides disagree. Accuracy: within 2 ulp of exp over [-745, 0].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FT_SAMPLING_HD __host__ __device__
#else
#define FT_SAMPLING_HD
#endif

namespace futransformer::sampling_detail {

FT_SAMPLING_HD inline double fma_rn(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);  // correctly rounded (hardware or glibc's exact emulation)
#endif
}

FT_SAMPLING_HD inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

FT_SAMPLING_HD inline double pow2(int e) {  // 2^e for -1022 <= e <= 1023, from its bits
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
#endif
}

// exp(x) for x <= 0 (the sampler's (logit - max) / T); 0 below -745.5 (and for -inf or NaN). exp(0) is exactly 1.
FT_SAMPLING_HD inline double sampling_exp(double x) {
  if (!(x >= -745.5)) return 0.0;
  constexpr double kInvLn2 = 0x1.71547652b82fep0;
  constexpr double kLn2Hi = 0x1.62e42fefa39efp-1;   // ln 2 rounded to double
  constexpr double kLn2Lo = 0x1.abc9e3b39803fp-56;  // ln 2 minus kLn2Hi
  // x = k ln 2 + r, |r| <= ln2 / 2 (+ rounding); each fma rounds once, so r carries about 2^-60 absolute error.
  const double k = std::floor(fma_rn(x, kInvLn2, 0.5));
  double r = fma_rn(-k, kLn2Hi, x);
  r = fma_rn(-k, kLn2Lo, r);
  // Taylor series of e^r to degree 13: the first omitted term, (ln2/2)^14 / 14!, is below 2^-56 relative.
  constexpr double kInvFact[14] = {1.0,
                                   1.0,
                                   1.0 / 2.0,
                                   1.0 / 6.0,
                                   1.0 / 24.0,
                                   1.0 / 120.0,
                                   1.0 / 720.0,
                                   1.0 / 5040.0,
                                   1.0 / 40320.0,
                                   1.0 / 362880.0,
                                   1.0 / 3628800.0,
                                   1.0 / 39916800.0,
                                   1.0 / 479001600.0,
                                   1.0 / 6227020800.0};
  double p = kInvFact[13];
  for (int i = 12; i >= 0; --i) p = fma_rn(p, r, kInvFact[i]);
  const int ki = static_cast<int>(k);  // -1076 .. 0
  // A result below 2^-1022 is subnormal: scale in two steps, the first exact, so only the second rounds.
  if (ki >= -1022) return mul_rn(p, pow2(ki));
  return mul_rn(mul_rn(p, pow2(ki + 64)), pow2(-64));
}

}  // namespace futransformer::sampling_detail
