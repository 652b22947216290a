// v4 W4A16 GEMM instances with the qkv prologue as their tail (gemm_w4a16_qkv_tail.cuh): the swapped M <= 8 path of
// the CTA shapes the decode tables use for qkv at M <= 8 (24 warps / 8 slots, 16 / 16) and of the default shape (8 /
// 16), FP16 and BF16 scales. Their own translation unit: only these need fused_ops.cuh.
#include "cuda/gemm_w4a16_qkv_tail.cuh"
#include "cuda/gemm_w4a16_v4_dispatch.cuh"

namespace futransformer::cuda::w4a16 {

namespace {
template <int kCtaWarps, int kRing>
QkvTailKernelFn tail_for(bool f16_scales) {
  return f16_scales ? gemm_w4a16_v4_kernel<1, 1, true, kCtaWarps, kRing, false, false, true>
                    : gemm_w4a16_v4_kernel<1, 1, false, kCtaWarps, kRing, false, false, true>;
}
}  // namespace

QkvTailKernelFn v4_qkv_tail_kernel_any(const Tiling& t, bool f16_scales) {
  if (t.variant != Variant::v4 || !t.rows8 || t.wgmma || t.splits != 1) return nullptr;
  if (t.warps == 8 && t.stages == 16) return tail_for<8, 16>(f16_scales);
  if (t.warps == 16 && t.stages == 16) return tail_for<16, 16>(f16_scales);
  if (t.warps == 24 && t.stages == 8) return tail_for<24, 8>(f16_scales);
  return nullptr;
}

}  // namespace futransformer::cuda::w4a16
