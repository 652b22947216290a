// Instances of the W4A16 GEMM's warpgroup path (gemm_w4a16_wg.cuh): one per n = 8 activation tile count (M <= 32)
// and scale type, on the default CTA shape, and with streamed activations (8-slot ring, warps_k = 1).
#include "cuda/gemm_w4a16_v4_dispatch.cuh"
#include "cuda/gemm_w4a16_wg.cuh"

namespace futransformer::cuda::w4a16 {

template <bool kF16, bool kStream>
KernelFn wg_kernel_for_scales(int tiles) {
  switch (tiles) {
    case 1: return gemm_w4a16_wg_kernel<1, kF16, kStream>;
    case 2: return gemm_w4a16_wg_kernel<2, kF16, kStream>;
    case 3: return gemm_w4a16_wg_kernel<3, kF16, kStream>;
    case 4: return gemm_w4a16_wg_kernel<4, kF16, kStream>;
    default: return nullptr;
  }
}

KernelFn wg_kernel_any(const Tiling& t, bool f16_scales) {
  if (!t.wgmma || t.warps != kWarps || t.rows < 1 || t.rows > kWgMaxM) return nullptr;
  if (t.stream_x) {
    if (t.stages != kWgStreamStages || t.warps_k != 1) return nullptr;
    return f16_scales ? wg_kernel_for_scales<true, true>(wg_tiles(t.rows))
                      : wg_kernel_for_scales<false, true>(wg_tiles(t.rows));
  }
  if (t.stages != kStages) return nullptr;
  return f16_scales ? wg_kernel_for_scales<true, false>(wg_tiles(t.rows))
                    : wg_kernel_for_scales<false, false>(wg_tiles(t.rows));
}

}  // namespace futransformer::cuda::w4a16
