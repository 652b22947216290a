// Instances of the W4A16 GEMM's warpgroup path (gemm_w4a16_wg.cuh): one per n = 8 activation tile count (M <= 32)
// and scale type, on the default CTA shape, and with streamed activations (8-slot ring, warps_k = 1); those of two to
// four tiles also as their cluster-reduce instance (kCluster).
#include "cuda/gemm_w4a16_v4_dispatch.cuh"
#include "cuda/gemm_w4a16_wg.cuh"

namespace futransformer::cuda::w4a16 {

// kCluster: the cluster-reduce instance, for two to four tiles (M = 9..32, cluster_reduce_applies and its raised
// limits); nullptr for one.
template <bool kF16, bool kStream, bool kCluster>
KernelFn wg_kernel_for_scales(int tiles) {
  if constexpr (kCluster) {
    switch (tiles) {
      case 2: return gemm_w4a16_wg_kernel<2, kF16, kStream, true>;
      case 3: return gemm_w4a16_wg_kernel<3, kF16, kStream, true>;
      case 4: return gemm_w4a16_wg_kernel<4, kF16, kStream, true>;
      default: return nullptr;
    }
  } else {
    switch (tiles) {
      case 1: return gemm_w4a16_wg_kernel<1, kF16, kStream>;
      case 2: return gemm_w4a16_wg_kernel<2, kF16, kStream>;
      case 3: return gemm_w4a16_wg_kernel<3, kF16, kStream>;
      case 4: return gemm_w4a16_wg_kernel<4, kF16, kStream>;
      default: return nullptr;
    }
  }
}

template <bool kCluster>
KernelFn wg_kernel(const Tiling& t, bool f16_scales) {
  if (t.stream_x) {
    if (t.stages != kWgStreamStages || t.warps_k != 1) return nullptr;
    return f16_scales ? wg_kernel_for_scales<true, true, kCluster>(wg_tiles(t.rows))
                      : wg_kernel_for_scales<false, true, kCluster>(wg_tiles(t.rows));
  }
  if (t.stages != kStages) return nullptr;
  return f16_scales ? wg_kernel_for_scales<true, false, kCluster>(wg_tiles(t.rows))
                    : wg_kernel_for_scales<false, false, kCluster>(wg_tiles(t.rows));
}

KernelFn wg_kernel_any(const Tiling& t, bool f16_scales, bool cluster) {
  if (!t.wgmma || t.warps != kWarps || t.rows < 1 || t.rows > kWgMaxM) return nullptr;
  return cluster ? wg_kernel<true>(t, f16_scales) : wg_kernel<false>(t, f16_scales);
}

}  // namespace futransformer::cuda::w4a16
