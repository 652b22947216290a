// The instance table of the W4A16 GEMM's warpgroup path (gemm_w4a16_wg.cuh) for one ring: kStreamStages = 0 for the
// staged activations (kStages weight slots), kWgStreamStages or kWgStreamDeepStages for streamed ones. Included by
// gemm_w4a16_wg.cu (staged and 8-slot streamed) and gemm_w4a16_wg_deep.cu (16-slot streamed), so that the two sets
// of instances compile in parallel.
#pragma once

#include "cuda/gemm_w4a16_wg.cuh"

namespace futransformer::cuda::w4a16 {

// One instance per n = 8 activation tile count (M <= 32); kCluster: the cluster-reduce instance, for two to four
// tiles (M = 9..32, cluster_reduce_applies and its raised limits), nullptr for one.
template <bool kF16, int kStreamStages, bool kCluster>
KernelFn wg_kernel_for_scales(int tiles) {
  if constexpr (kCluster) {
    switch (tiles) {
      case 2: return gemm_w4a16_wg_kernel<2, kF16, kStreamStages, true>;
      case 3: return gemm_w4a16_wg_kernel<3, kF16, kStreamStages, true>;
      case 4: return gemm_w4a16_wg_kernel<4, kF16, kStreamStages, true>;
      default: return nullptr;
    }
  } else {
    switch (tiles) {
      case 1: return gemm_w4a16_wg_kernel<1, kF16, kStreamStages>;
      case 2: return gemm_w4a16_wg_kernel<2, kF16, kStreamStages>;
      case 3: return gemm_w4a16_wg_kernel<3, kF16, kStreamStages>;
      case 4: return gemm_w4a16_wg_kernel<4, kF16, kStreamStages>;
      default: return nullptr;
    }
  }
}

template <int kStreamStages>
KernelFn wg_kernel_for(int tiles, bool f16_scales, bool cluster) {
  if (cluster)
    return f16_scales ? wg_kernel_for_scales<true, kStreamStages, true>(tiles)
                      : wg_kernel_for_scales<false, kStreamStages, true>(tiles);
  return f16_scales ? wg_kernel_for_scales<true, kStreamStages, false>(tiles)
                    : wg_kernel_for_scales<false, kStreamStages, false>(tiles);
}

}  // namespace futransformer::cuda::w4a16
