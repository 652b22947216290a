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

}  // namespace futransformer::cuda::ptx
