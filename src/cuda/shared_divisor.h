// Correctly rounded division by a divisor that many dividends share: a row's FP8 scale (every code of the row is
// y / s), an INT4 group's scale (x / scale and -lo / scale). The quantisers must reproduce the CPU's IEEE division
// bit for bit; __fdiv_rn costs a reciprocal, four FMAs, a range check and a branch per element. With the divisor's
// correctly rounded reciprocal computed once, Markstein's theorem gives the same quotient in three operations:
//
//   inv = RN(1 / b);  q = RN(a · inv);  r = a − b · q (one FMA: exact);  q' = RN(q + r · inv) = RN(a / b)
//
// (if inv is within half an ulp of 1 / b and q within one ulp of a / b, the FMA-corrected q' is the correctly
// rounded quotient; Handbook of Floating-Point Arithmetic, "Markstein's theorem"). The theorem assumes that nothing
// underflows or overflows, hence the domain below; the sign of a zero quotient is restored from a (b > 0), which the
// FMA sum of two zeros of opposite sign would otherwise lose.
//
// Domain (host-tested in tests/cpu/test_shared_divisor.cpp on random and edge inputs): for a divisor b that
// usable() accepts (b in [kMinDivisor, kMaxDivisor]) and |a / b| <= kMaxQuotient, the result is exactly
// __fdiv_rn(a, b) when a = ±0 or |a| >= kMinExactDividend. A smaller nonzero |a| can make the remainder underflow
// (the last bit may then differ), but its quotient is below kMinExactDividend / kMinDivisor = 2^-40, which every
// caller here rounds to a zero code either way (FP8 E4M3's smallest step is 2^-9, INT4's is 1) — the test checks
// that the codes agree. A divisor outside the domain (a NaN row scale, a tiny one) goes through __fdiv_rn.
#pragma once

#include <cmath>

#include "cuda/host_device.h"

namespace futransformer::cuda::divisor {

constexpr float kMinDivisor = 0x1p-60f;
constexpr float kMaxDivisor = 0x1p100f;
constexpr float kMaxQuotient = 0x1p100f;
constexpr float kMinExactDividend = 0x1p-100f;

FT_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

FT_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

FT_HD float div_ieee(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

FT_HD float rcp_rn(float b) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(b);
#else
  return 1.0f / b;
#endif
}

FT_HD float copy_sign(float magnitude, float sign) {
#if defined(__CUDA_ARCH__)
  return copysignf(magnitude, sign);
#else
  return std::copysign(magnitude, sign);
#endif
}

// A divisor and its correctly rounded reciprocal.
struct SharedDivisor {
  float b;
  float inv;
};

FT_HD bool usable(float b) { return b >= kMinDivisor && b <= kMaxDivisor; }  // false for NaN

FT_HD SharedDivisor make_shared_divisor(float b) { return SharedDivisor{b, rcp_rn(b)}; }

// RN(a / d.b) for d.b in the domain (see the file comment).
FT_HD float divide(float a, const SharedDivisor& d) {
  const float q = mul_rn(a, d.inv);
  const float r = fma_rn(-q, d.b, a);
  return copy_sign(fma_rn(r, d.inv, q), a);
}

// Calls body(div) with div(a) = RN(a / b): through b's reciprocal when usable(b), else by IEEE division. The callers'
// b is uniform across their threads (a row's or a group's scale), so the branch is taken once per scale.
template <class Body>
FT_HD void with_divisor(float b, const Body& body) {
  if (usable(b)) {
    const SharedDivisor d = make_shared_divisor(b);
    body([d](float a) { return divide(a, d); });
  } else {
    body([b](float a) { return div_ieee(a, b); });
  }
}

}  // namespace futransformer::cuda::divisor
