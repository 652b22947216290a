// Split-K epilogue of the W4A16 GEMM: the fp32 partial sums of the slices added in slice order (so the result is
// deterministic), then the launch's epilogue (w4a16::Epilogue): BF16 y, an fp32 residual add, or SwiGLU of an
// interleaved gate|up weight — the fused epilogues need no pass of their own when K is split either. Apart from the
// kernels' header because only the launcher (gemm_w4a16.cu) launches these, while the GEMM kernels are
// instantiated in several translation units. Each kernel is launched as a programmatic dependent of the GEMM.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/gemm_w4a16_epilogue.cuh"
#include "cuda/gemm_w4a16_fixup.cuh"
#include "cuda/gemm_w4a16_layout.h"
#include "cuda/ptx/griddep.cuh"

namespace futransformer::cuda::w4a16 {

// y = bf16(sum over slices of partial[s]); count4 = M * N / 4.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_kernel(const float4* __restrict__ partial,
                                                                 __nv_bfloat16* __restrict__ y, int64_t count4,
                                                                 int splits) {
  // Launched as a programmatic dependent of the GEMM: wait until its partial sums are complete and visible.
  ptx::griddepcontrol_wait();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count4; i += stride) {
    finish_store4(partial, y, i, count4, splits);
  }
}

// residual[m, n] += float(bf16(sum over slices)) (Epilogue::residual_f32); residual is [M, N] fp32 like the
// partial sums, so float4 i of both is the same four elements.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_residual_kernel(const float4* __restrict__ partial,
                                                                          float4* __restrict__ residual,
                                                                          int64_t count4, int splits) {
  ptx::griddepcontrol_wait();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count4; i += stride) {
    finish_residual4(partial, residual, i, count4, splits);
  }
}

// h[m, j .. j + 3] = bf16(silu(g) * u) (Epilogue::swiglu_bf16) for the gate|up partial sums of an interleaved
// weight (N = 2 inter packed columns): gate j .. j + 3 are four consecutive packed columns (j % 4 == 0 and runs of
// kSwiGluRun = 8 never split a float4), up j .. j + 3 the four kSwiGluRun columns further. count4 = M * N / 4 (the
// slice stride), inter4 = inter / 4; h is 8-byte aligned.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_swiglu_kernel(const float4* __restrict__ partial,
                                                                        __nv_bfloat16* __restrict__ h,
                                                                        int64_t count4, int inter4, int splits) {
  ptx::griddepcontrol_wait();
  const int64_t outputs4 = count4 / 2;  // M * inter / 4
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < outputs4; i += stride) {
    finish_swiglu4(partial, h, i, count4, inter4, splits);
  }
}

}  // namespace futransformer::cuda::w4a16
