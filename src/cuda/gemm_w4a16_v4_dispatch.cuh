// Kernel instances of the W4A16 GEMM's v4 variant, one translation unit per compiled (warps, stages) shape
// (gemm_w4a16_v4_w8s16.cu, gemm_w4a16_v4_w8s32.cu, gemm_w4a16_v4_w16s16.cu, gemm_w4a16_v4_w8s8.cu,
// gemm_w4a16_v4_w24s8.cu, gemm_w4a16_v4_w28s8.cu): every instance is a fully unrolled
// kernel, so spreading them over files lets them compile in parallel and keeps a rebuild to the files that change.
#pragma once

#include "cuda/gemm_w4a16_v4.cuh"

namespace futransformer::cuda::w4a16 {

using KernelFn = void (*)(KernelArgs);

// The instance for a v4 tiling of shape (kCtaWarps, kRing): the swapped paths (rows8, swap16, swap32 with three or
// four activation tiles), the 16-row path with t.m_tiles tiles. Non-default shapes serve M <= 16 only (one m tile):
// nullptr for more.
// kCluster: the cluster-reduce instance, compiled for the paths of M = 9..32 (cluster_reduce_applies and its raised
// limits: swap16, the 16-row path with one or two tiles, swap32); nullptr for the others (rows8, M > 32).
template <int kCtaWarps, int kRing, bool kF16, bool kCluster>
KernelFn v4_kernel_for_scales(const Tiling& t) {
  if (t.rows8) {
    if constexpr (kCluster) return nullptr;
    else return gemm_w4a16_v4_kernel<1, 1, kF16, kCtaWarps, kRing>;
  }
  if (t.swap16) return gemm_w4a16_v4_kernel<1, 2, kF16, kCtaWarps, kRing, false, kCluster>;
  if constexpr (kCluster) {
    if constexpr (kCtaWarps == kWarps && kRing == kStages) {
      if (t.swap32) {
        const bool three = swap_tiles(false, false, true, t.rows) == 3;
        return three ? gemm_w4a16_v4_kernel<2, 3, kF16, kWarps, kStages, false, true>
                     : gemm_w4a16_v4_kernel<2, 4, kF16, kWarps, kStages, false, true>;
      }
      if (t.m_tiles == 2) return gemm_w4a16_v4_kernel<2, 0, kF16, kWarps, kStages, false, true>;
    }
    return t.m_tiles == 1 && !t.swap32 ? gemm_w4a16_v4_kernel<1, 0, kF16, kCtaWarps, kRing, false, true> : nullptr;
  } else if constexpr (kCtaWarps == kWarps && kRing == kStages) {
    if (t.swap32)
      return swap_tiles(false, false, true, t.rows) == 3 ? gemm_w4a16_v4_kernel<2, 3, kF16>
                                                          : gemm_w4a16_v4_kernel<2, 4, kF16>;
    switch (t.m_tiles) {
      case 1: return gemm_w4a16_v4_kernel<1, 0, kF16>;
      case 2: return gemm_w4a16_v4_kernel<2, 0, kF16>;
      case 3: return gemm_w4a16_v4_kernel<3, 0, kF16>;
      default: return gemm_w4a16_v4_kernel<4, 0, kF16>;
    }
  } else {
    return t.m_tiles == 1 && !t.swap32 ? gemm_w4a16_v4_kernel<1, 0, kF16, kCtaWarps, kRing> : nullptr;
  }
}

// cluster: the instance that finishes split-K inside a cluster of the column block's slices (gemm_w4a16_cluster.cuh).
template <int kCtaWarps, int kRing>
KernelFn v4_kernel(const Tiling& t, bool f16_scales, bool cluster) {
  if (cluster)
    return f16_scales ? v4_kernel_for_scales<kCtaWarps, kRing, true, true>(t)
                      : v4_kernel_for_scales<kCtaWarps, kRing, false, true>(t);
  return f16_scales ? v4_kernel_for_scales<kCtaWarps, kRing, true, false>(t)
                    : v4_kernel_for_scales<kCtaWarps, kRing, false, false>(t);
}

using NormKernelFn = void (*)(NormKernelArgs);

// The RMSNorm prologue instance of shape (kCtaWarps, kRing): the swapped M <= 8 path (rows8) only.
template <int kCtaWarps, int kRing>
NormKernelFn v4_norm_kernel(bool f16_scales) {
  return f16_scales ? gemm_w4a16_v4_kernel<1, 1, true, kCtaWarps, kRing, true>
                    : gemm_w4a16_v4_kernel<1, 1, false, kCtaWarps, kRing, true>;
}

// Defined (explicitly instantiated) in the per-shape files; other translation units only call them.
extern template KernelFn v4_kernel<8, 16>(const Tiling&, bool, bool);
extern template KernelFn v4_kernel<8, 32>(const Tiling&, bool, bool);
extern template KernelFn v4_kernel<16, 16>(const Tiling&, bool, bool);
extern template KernelFn v4_kernel<8, 8>(const Tiling&, bool, bool);
extern template KernelFn v4_kernel<24, 8>(const Tiling&, bool, bool);
extern template KernelFn v4_kernel<28, 8>(const Tiling&, bool, bool);
extern template NormKernelFn v4_norm_kernel<8, 16>(bool);
extern template NormKernelFn v4_norm_kernel<8, 32>(bool);
extern template NormKernelFn v4_norm_kernel<16, 16>(bool);
extern template NormKernelFn v4_norm_kernel<8, 8>(bool);
extern template NormKernelFn v4_norm_kernel<24, 8>(bool);
extern template NormKernelFn v4_norm_kernel<28, 8>(bool);
static_assert(sizeof(kV4KernelShapes) / sizeof(kV4KernelShapes[0]) == 6,
              "every compiled shape needs its file and an extern declaration here");

struct QkvTailArgs;  // gemm_w4a16_qkv_tail.cuh
using QkvTailKernelFn = void (*)(QkvTailArgs);
// The instance with the qkv prologue as its tail (gemm_w4a16_v4_qkv_tail.cu) for a v4 rows8 tiling with one K slice
// of a compiled shape (8 / 16, 16 / 16, 24 / 8), nullptr for any other.
QkvTailKernelFn v4_qkv_tail_kernel_any(const Tiling& t, bool f16_scales);

// The warpgroup path's instance for a tiling with wgmma set (gemm_w4a16_wg.cu): one per activation tile count,
// scale type and ring (staged; streamed with 8 or 16 slots); nullptr for M > kWgMaxM, a CTA shape other than the
// default or a ring that is not compiled.
KernelFn wg_kernel_any(const Tiling& t, bool f16_scales, bool cluster);
// The 16-slot streamed instance for `tiles` n = 8 activation tiles (gemm_w4a16_wg_deep.cu); nullptr where none.
KernelFn wg_deep_kernel(int tiles, bool f16_scales, bool cluster);

// The instance for any v4 tiling (cluster: its cluster-reduce instance), nullptr when its shape is not compiled.
inline KernelFn v4_kernel_any(const Tiling& t, bool f16_scales, bool cluster = false) {
  if (t.wgmma) return wg_kernel_any(t, f16_scales, cluster);
  if (t.warps == 8 && t.stages == 16) return v4_kernel<8, 16>(t, f16_scales, cluster);
  if (t.warps == 8 && t.stages == 32) return v4_kernel<8, 32>(t, f16_scales, cluster);
  if (t.warps == 16 && t.stages == 16) return v4_kernel<16, 16>(t, f16_scales, cluster);
  if (t.warps == 8 && t.stages == 8) return v4_kernel<8, 8>(t, f16_scales, cluster);
  if (t.warps == 24 && t.stages == 8) return v4_kernel<24, 8>(t, f16_scales, cluster);
  if (t.warps == 28 && t.stages == 8) return v4_kernel<28, 8>(t, f16_scales, cluster);
  return nullptr;
}

// The RMSNorm prologue instance for a v4 rows8 tiling, nullptr for any other tiling or an uncompiled shape.
inline NormKernelFn v4_norm_kernel_any(const Tiling& t, bool f16_scales) {
  if (t.variant != Variant::v4 || !t.rows8 || t.wgmma) return nullptr;
  if (t.warps == 8 && t.stages == 16) return v4_norm_kernel<8, 16>(f16_scales);
  if (t.warps == 8 && t.stages == 32) return v4_norm_kernel<8, 32>(f16_scales);
  if (t.warps == 16 && t.stages == 16) return v4_norm_kernel<16, 16>(f16_scales);
  if (t.warps == 8 && t.stages == 8) return v4_norm_kernel<8, 8>(f16_scales);
  if (t.warps == 24 && t.stages == 8) return v4_norm_kernel<24, 8>(f16_scales);
  if (t.warps == 28 && t.stages == 8) return v4_norm_kernel<28, 8>(f16_scales);
  return nullptr;
}

}  // namespace futransformer::cuda::w4a16
