// Floating-point special-function wrappers (any sm).
#pragma once

namespace futransformer::cuda::ptx {

// ex2.approx.ftz.f32: 2^x on the SFU (max relative error 2^-22, subnormal results flushed to 0; 2^-inf = 0).
// A softmax computed as 2^(x·log2 e − m) needs nothing more exact: its result is rounded to BF16.
__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// rcp.approx.f32: 1 / x on the SFU (max error 1 ulp; not .ftz, so subnormal results are kept: 1 / x for
// 2^126 < |x| < 2^128 is the subnormal it should be, not 0).
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

}  // namespace futransformer::cuda::ptx
