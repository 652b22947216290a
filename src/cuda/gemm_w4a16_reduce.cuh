// Split-K epilogue of the W4A16 GEMM: y = bf16(sum over slices of the fp32 partial sums), in slice order so the
// result is deterministic. Apart from the kernels' header because only the launcher (gemm_w4a16.cu) launches it,
// while the kernels are instantiated in several translation units.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/ptx/griddep.cuh"

namespace futransformer::cuda::w4a16 {

// y = bf16(sum over slices of partial[s]) in slice order; count4 = M * N / 4.
__global__ void __launch_bounds__(256) gemm_w4a16_reduce_kernel(const float4* __restrict__ partial,
                                                                 __nv_bfloat16* __restrict__ y, int64_t count4,
                                                                 int splits) {
  // Launched as a programmatic dependent of the GEMM: wait until its partial sums are complete and visible.
  ptx::griddepcontrol_wait();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count4; i += stride) {
    float4 s = partial[i];
    for (int sp = 1; sp < splits; ++sp) {
      const float4 v = partial[sp * count4 + i];
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(y) + 2 * i;
    out[0] = __floats2bfloat162_rn(s.x, s.y);
    out[1] = __floats2bfloat162_rn(s.z, s.w);
  }
}

}  // namespace futransformer::cuda::w4a16
