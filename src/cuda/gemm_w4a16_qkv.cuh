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

}  // namespace futransformer::cuda::w4a16
