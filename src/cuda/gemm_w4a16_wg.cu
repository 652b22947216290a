// Instances of the W4A16 GEMM's warpgroup path (gemm_w4a16_wg.cuh): one per n = 8 activation tile count (M <= 32)
// and scale type, on the default CTA shape, with staged activations and with streamed ones (8-slot ring,
// warps_k = 1); those of two to four tiles also as their cluster-reduce instance (kCluster). The 16-slot streamed
// instances are in gemm_w4a16_wg_deep.cu.
#include "cuda/gemm_w4a16_v4_dispatch.cuh"
#include "cuda/gemm_w4a16_wg_instances.cuh"

namespace futransformer::cuda::w4a16 {

KernelFn wg_kernel_any(const Tiling& t, bool f16_scales, bool cluster) {
  if (!t.wgmma || t.warps != kWarps || t.rows < 1 || t.rows > kWgMaxM) return nullptr;
  const int tiles = wg_tiles(t.rows);
  if (t.stream_x) {
    if (t.warps_k != 1) return nullptr;
    if (t.stages == kWgStreamStages) return wg_kernel_for<kWgStreamStages>(tiles, f16_scales, cluster);
    if (t.stages == kWgStreamDeepStages) return wg_deep_kernel(tiles, f16_scales, cluster);
    return nullptr;
  }
  return t.stages == kStages ? wg_kernel_for<0>(tiles, f16_scales, cluster) : nullptr;
}

}  // namespace futransformer::cuda::w4a16
