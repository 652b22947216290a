// Split-K reduce of the W4A16 qkv projection with the attention prologue as its epilogue
// (gemm_w4a16_qkv_rope_append, futransformer/cuda/gemm_w4a16.h): instead of a BF16 qkv for a separate
// qkv_rope_kv_append launch, each warp finishes one (row, head) — the slices' fp32 partial sums of the head's
// head_dim columns added in gemm_w4a16_reduce_kernel's order and rounded to BF16 as its store does — and then runs
// qkv_rope_kv_append's own per-head code (fused::qkv_head_item) on them. One kernel boundary fewer in a decode
// layer, and the same bits: the sums are the plain reduce's, the rest is the same device function.
// Included only by gemm_w4a16.cu, which launches it as a programmatic dependent of the GEMM.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/decoder_ops.cuh"
#include "cuda/fused_ops.cuh"
#include "cuda/gemm_w4a16_layout.h"
#include "cuda/gemm_w4a16_reduce.cuh"
#include "futransformer/formats/kv_cache.h"

namespace futransformer::cuda::w4a16 {

constexpr int kQkvReduceWarps = fused::kQkvWarps;  // one (row, head) per warp, as qkv_rope_kv_append_kernel

// grid = (ceil((n_heads + 2 n_kv_heads) / kQkvReduceWarps), M): CTA (bx, r) holds the cos/sin table of row r, warp w
// head item i = bx * kQkvReduceWarps + w of it (qkv_rope_kv_append_kernel's map). partial: [splits, M, N] fp32, N =
// a.row_width; count4 = M * N / 4 (the slice stride in float4, as the plain reduce's).
//
// The head's BF16 values go through a.qkv, the buffer the plain reduce would have written: qkv_head_item reads the
// RoPE partner of a channel from another lane's store, and the caller then finds qkv as gemm_w4a16 +
// qkv_rope_kv_append leave it (RoPE'd q and k, v as the GEMM wrote it). A __syncwarp orders the warp's stores before
// its loads (memory ordering among the lanes of the barrier); no other warp touches the head.
template <formats::KvFormat F>
__global__ void __launch_bounds__(kQkvReduceWarps * fused::kWarp)
    gemm_w4a16_reduce_qkv_kernel(const float* __restrict__ partial, int64_t count4, int splits,
                                 const fused::QkvArgs a) {
  // Launched as a programmatic dependent of the GEMM: its partial sums are complete and visible after the wait.
  // The row's metadata and RoPE table are read before it (inputs no kernel of the pass writes; fused::QkvRowMeta).
  __shared__ float2 cs[fused::kMaxHalf];
  const int r = static_cast<int>(blockIdx.y);
  const fused::QkvRowMeta meta = fused::qkv_row_meta<F>(a, r);
  fused::qkv_rope_table(a, r, cs, kQkvReduceWarps * fused::kWarp);
  // Wait, then release: releasing the decode attention first measured level at batch 16-32 (thirty-first session).
  ops::pdl_prologue();
  __syncthreads();  // the only barrier: the early return below is after it
  const int lane = static_cast<int>(threadIdx.x) % fused::kWarp;
  const int item = static_cast<int>(blockIdx.x) * kQkvReduceWarps + static_cast<int>(threadIdx.x) / fused::kWarp;
  if (item >= a.n_heads + 2 * a.n_kv_heads) return;  // warp-uniform

  // Float4 j of the head is elements (r, item * head_dim + 4 j .. + 3), float4 i = qkv_head_float4 of the plain
  // reduce (N and head_dim are multiples of 8, so the head starts on a float4), summed by the same sum_slices and
  // stored by the same __floats2bfloat162_rn pairs at y pairs 2 i and 2 i + 1.
  const auto* partial4 = reinterpret_cast<const float4*>(partial);
  for (int j = lane; j < a.head_dim / 4; j += fused::kWarp) {
    const int64_t i = qkv_head_float4(r, item, j, a.row_width, a.head_dim);
    const float4 s = sum_slices(partial4, i, count4, splits);
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(a.qkv) + 2 * i;
    out[0] = __floats2bfloat162_rn(s.x, s.y);
    out[1] = __floats2bfloat162_rn(s.z, s.w);
  }
  __syncwarp();
  fused::qkv_head_item<F, true>(a, cs, meta, r, item, lane);
}

// The INT4 / INT4_HADAMARD caches at head_dim 128 (fused::kQuadHeadDim): the same grid and items, and lane t's float4
// t of the head stays in its registers — channels 4 t .. 4 t + 3, the layout of fused::HeadLanes<32>. RoPE finds
// each channel's partner (c ± 64) in lane t ^ 16 by one shuffle (fused::rope_lanes), so the warp neither stores the
// head nor reads it back before RoPE, and the rest is finish_item_lanes, the code of qkv_rope_kv_append's own INT4
// kernels at this head size (kv_append_rotate_q_quad_kernel: the same operations in the same order whatever the lane
// layout, so the same bits as the plain reduce followed by that kernel). a.qkv still receives the RoPE'd q and k and
// the v heads, off the chain (nothing in this kernel reads them). Key anchors are read before the wait, as that kernel
// does with RoPE: a pass that runs qkv_rope_kv_append computes no anchors (fused_ops.h).
template <formats::KvFormat F>
__global__ void __launch_bounds__(kQkvReduceWarps * fused::kWarp)
    gemm_w4a16_reduce_qkv_lanes_kernel(const float* __restrict__ partial, int64_t count4, int splits,
                                       const fused::QkvArgs a) {
  static_assert(F == formats::KvFormat::INT4 || F == formats::KvFormat::INT4_HADAMARD, "INT4 caches");
  using HL = fused::HeadLanes<fused::kWarp>;
  __shared__ float2 cs[fused::kQuadHeadDim / 2];
  const int r = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x) % fused::kWarp;
  const int item = static_cast<int>(blockIdx.x) * kQkvReduceWarps + static_cast<int>(threadIdx.x) / fused::kWarp;
  const bool live = item < a.n_heads + 2 * a.n_kv_heads;  // warp-uniform
  const bool is_q = item < a.n_heads;
  const bool is_v = item >= a.n_heads + a.n_kv_heads;
  const fused::QkvRowMeta meta = fused::qkv_row_meta<F>(a, r);
  fused::qkv_rope_table(a, r, cs, kQkvReduceWarps * fused::kWarp);
  fused::AnchorLanes<fused::kWarp> pre;
  if constexpr (F == formats::KvFormat::INT4_HADAMARD) {
    if (live && !is_q && !is_v && meta.anchor >= 0 && meta.page >= 0 && meta.slot >= 0 &&
        meta.slot < kv::kPageTokens) {
      const uint16_t* anchor = fused::key_anchor_row(a, meta.anchor, item - a.n_heads);
#pragma unroll
      for (int k = 0; k < HL::kPerLane; ++k) pre.v[k] = kv::f16_bits_to_f32(anchor[HL::kPerLane * lane + k]);
      pre.loaded = true;
    }
  }
  ops::pdl_prologue();
  __syncthreads();  // the only barrier: the early return below is after it
  if (!live) return;

  const float4 s = sum_slices(reinterpret_cast<const float4*>(partial),
                              qkv_head_float4(r, item, lane, a.row_width, fused::kQuadHeadDim), count4, splits);
  // The plain reduce's BF16 store (__floats2bfloat162_rn pairs), kept in registers, widened exactly.
  uint32_t raw[2] = {fused::pack_bf16_pair(s.x, s.y), fused::pack_bf16_pair(s.z, s.w)};
  float x[HL::kPerLane];
  fused::widen_bf16_words<2>(raw, x);
  __nv_bfloat16* head = a.qkv + static_cast<int64_t>(r) * a.row_width + static_cast<int64_t>(item) * fused::kQuadHeadDim;
  if (!is_v) fused::rope_lanes<fused::kWarp>(x, cs, lane, HL::mask(), raw);  // raw becomes the RoPE'd bits
  fused::store_head_lanes<fused::kWarp>(head, lane, raw);
  fused::finish_item_lanes<F, fused::kWarp>(a, x, r, item, meta, lane, HL::mask(), &pre);
}

}  // namespace futransformer::cuda::w4a16
