// The 16-slot streamed instances of the W4A16 GEMM's warpgroup path (Tiling::stream_x with kWgStreamDeepStages):
// its own file so they compile beside gemm_w4a16_wg.cu's.
#include "cuda/gemm_w4a16_v4_dispatch.cuh"
#include "cuda/gemm_w4a16_wg_instances.cuh"

namespace futransformer::cuda::w4a16 {

KernelFn wg_deep_kernel(int tiles, bool f16_scales, bool cluster) {
  return wg_kernel_for<kWgStreamDeepStages>(tiles, f16_scales, cluster);
}

}  // namespace futransformer::cuda::w4a16
