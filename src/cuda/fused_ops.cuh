// Kernels of the fused decoder ops (launchers and contract: include/futransformer/cuda/fused_ops.h). They are built
// from the unfused kernels' own device functions (decoder_ops.cuh: RMSNorm pieces and RoPE arithmetic;
// kv_append.cuh: head vector layout, Hadamard butterfly, slot encoders), so every floating-point operation is the
// unfused one in the unfused order, and the results are the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/decoder_ops.cuh"
#include "cuda/kv_append.cuh"
#include "cuda/shared_divisor.h"
#include "futransformer/formats/kv_cache.h"

namespace futransformer::cuda::fused {

constexpr int kWarp = 32;
constexpr int kQkvWarps = 4;  // warps per CTA of qkv_rope_kv_append_kernel, each one head of one row
constexpr int kMaxPerLane = kv::kMaxPerLane;
constexpr int kMaxHalf = kKvAppendMaxHeadDim / 2;  // RoPE cos/sin pairs per row

static_assert(kQkvWarps * kWarp >= kMaxHalf, "the cos/sin table is filled in one pass, one pair per thread");

// ---------------------------------------------------------------------------------------------------------------
// x += float(delta), then RMSNorm of the row into y. One CTA per row with rmsnorm_bf16's block size and thread
// mapping (thread t owns the float4 units, or elements, t, t + blockDim.x, ...), so the sum of squares adds the
// same values in the same order as rmsnorm_kernel does after add_residual_kernel. The residual add is element-wise
// and exact-twin, so which thread does it does not matter; here the owner does it in pass 1 and re-reads its own
// stores in pass 2 (program order: no barrier needed). kVec: rmsnorm_vec's condition; kDeltaVec: delta 8-byte
// aligned (4 BF16 in one load), only meaningful with kVec.
template <bool kVec, bool kDeltaVec>
__global__ void __launch_bounds__(ops::kMaxBlockThreads)
    add_residual_rmsnorm_kernel(float* x, const __nv_bfloat16* delta, const float* weight, __nv_bfloat16* y,
                                int hidden, float eps) {
  ops::pdl_prologue();
  __shared__ float red[kWarp];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  float* xr = x + row;
  const __nv_bfloat16* dr = delta + row;
  float ss = 0.0f;
  if constexpr (kVec) {
    float4* x4 = reinterpret_cast<float4*>(xr);
    for (int j = threadIdx.x; j < hidden / 4; j += blockDim.x) {
      float d[4];
      if constexpr (kDeltaVec) {
        const uint2 u = reinterpret_cast<const uint2*>(dr)[j];
        d[0] = __uint_as_float(u.x << 16);  // a BF16 is the top half of an fp32: exact widening
        d[1] = __uint_as_float(u.x & 0xffff0000u);
        d[2] = __uint_as_float(u.y << 16);
        d[3] = __uint_as_float(u.y & 0xffff0000u);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) d[k] = __bfloat162float(dr[4 * j + k]);
      }
      float4 v = x4[j];
      v.x = __fadd_rn(v.x, d[0]);
      v.y = __fadd_rn(v.y, d[1]);
      v.z = __fadd_rn(v.z, d[2]);
      v.w = __fadd_rn(v.w, d[3]);
      x4[j] = v;
      ss = ops::sum_squares_add(ss, v);
    }
  } else {
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float v = __fadd_rn(xr[j], __bfloat162float(dr[j]));
      xr[j] = v;
      ss = ops::sum_squares_add(ss, v);
    }
  }
  const float s = ops::rms_scale(ops::block_sum(ss, red), hidden, eps);
  ops::rmsnorm_store_row<kVec>(xr, weight, y + row, hidden, s);
}

// ---------------------------------------------------------------------------------------------------------------
struct QkvArgs {
  __nv_bfloat16* qkv;  // written (RoPE'd q and k) only by the kRope instances
  int32_t row_width;   // (n_heads + 2 n_kv_heads) * head_dim
  int32_t n_heads, n_kv_heads, head_dim;
  const int32_t* positions;
  const float* inv_freq;
  const int32_t* row_page;
  const int32_t* row_slot;
  const uint16_t* key_anchors;  // INT4_HADAMARD only
  const int32_t* row_anchor;    // INT4_HADAMARD only
  uint8_t* pool;
  kv::PageGeometry geo;
  int32_t kv_hadamard_block;  // formats::kv_hadamard_block(format, head_dim) (INT4_HADAMARD)
  float kv_hadamard_scale;
  int32_t q_hadamard_block;  // the caller's hadamard_block; <= 1: q_out is a copy
  float q_hadamard_scale;
  __nv_bfloat16* q_out;  // [rows, n_heads, head_dim]
};

// The RoPE cos/sin pairs of row r's position into cs[0 .. head_dim / 2), by the CTA's threads (nthreads of them);
// the caller synchronises before reading them.
__device__ __forceinline__ void qkv_rope_table(const QkvArgs& a, int r, float2* cs, int nthreads) {
  const double pos = static_cast<double>(a.positions[r]);
  for (int i = static_cast<int>(threadIdx.x); i < a.head_dim / 2; i += nthreads)
    cs[i] = ops::rope_cos_sin(pos, a.inv_freq[i]);
}

// Row r's cache destination and key-anchor entry (page, slot, anchor index; -1 for no anchor), read by each thread
// of the kernels below BEFORE griddepcontrol.wait: like positions and inv_freq they are inputs of the pass that no
// kernel of the pass writes (the engine uploads them before the pass's first kernel), so under programmatic launch
// their load latency overlaps the previous kernel's tail. The anchors' values are read after the wait, except by the
// quad kernel with RoPE (qkv_rope_kv_append, whose passes compute no anchors: fused_ops.h).
struct QkvRowMeta {
  int page, slot, anchor;
};
template <formats::KvFormat F>
__device__ __forceinline__ QkvRowMeta qkv_row_meta(const QkvArgs& a, int r) {
  QkvRowMeta m{a.row_page[r], a.row_slot[r], -1};
  if constexpr (F == formats::KvFormat::INT4_HADAMARD) m.anchor = a.row_anchor[r];
  return m;
}

// The per-head work of qkv_rope_kv_append for head item `item` of row r, by one warp (lane = its lane), reading the
// head's BF16 values from a.qkv — shared by qkv_rope_kv_append_kernel and the W4A16 GEMM's split-K QKV epilogue
// (gemm_w4a16_qkv.cuh), so the two cannot drift apart. Items in row order: q heads, then k heads, then v heads (the
// item's slice of the row starts at item * head_dim). Its channels are kv_append's register layout (lane l holds
// c = 32 k + l), so the slot encoders and the Hadamard butterfly of kv_append.cuh apply unchanged. Steps:
//   q, k (kRope): RoPE from the row's cos/sin table cs, rounded to BF16, written back into qkv (as rope_qk_bf16);
//   q: Hadamard with the caller's block (rotate_heads_bf16: same butterfly order, same scale), BF16 into q_out;
//   k, v: the slot encoding of kv_append_kernel (skipped for padding rows).
// The channel pairs (i, i + d/2) of a RoPE'd head sit in other lanes when head_dim / 2 is not a multiple of 32, so
// each lane reads both members of its pairs from memory, and a __syncwarp separates the warp's reads of the head
// from its write-back (lanes of a warp are not in lock step since Volta). The whole warp must call this (shuffles).
template <formats::KvFormat F, bool kRope>
__device__ __forceinline__ void qkv_head_item(const QkvArgs& a, const float2* cs, const QkvRowMeta& meta, int r,
                                              int item, int lane) {
  const int half = a.head_dim / 2;
  const bool is_q = item < a.n_heads;
  const bool is_v = item >= a.n_heads + a.n_kv_heads;
  const int hd = a.head_dim;
  __nv_bfloat16* head = a.qkv + static_cast<int64_t>(r) * a.row_width + static_cast<int64_t>(item) * hd;

  // The head's BF16 bits after this step's RoPE (the values kv_append and rotate_heads_bf16 would read).
  uint16_t bits[kMaxPerLane];
  if (kRope && !is_v) {
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int c = k * kWarp + lane;
      bits[k] = 0;
      if (c < hd) {
        const int i = c < half ? c : c - half;  // the pair (i, i + half) that channel c belongs to
        const float x0 = __bfloat162float(head[i]), x1 = __bfloat162float(head[i + half]);
        const float y = c < half ? ops::rope_lo(x0, x1, cs[i]) : ops::rope_hi(x0, x1, cs[i]);
        bits[k] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
      }
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int c = k * kWarp + lane;
      if (c < hd) head[c] = __ushort_as_bfloat16(bits[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int c = k * kWarp + lane;
      bits[k] = c < hd ? __bfloat16_as_ushort(head[c]) : 0;
    }
  }
  // Widened to fp32 (exact), channels past head_dim 0: what kv::load_head gives for the same bits.
  float x[kMaxPerLane];
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) x[k] = __uint_as_float(static_cast<uint32_t>(bits[k]) << 16);

  if (is_q) {
    if (a.q_hadamard_block > 1)
      kv::hadamard_warp(x, (hd + kWarp - 1) / kWarp, a.q_hadamard_block, a.q_hadamard_scale, lane);
    __nv_bfloat16* dst = a.q_out + (static_cast<int64_t>(r) * a.n_heads + item) * hd;
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int c = k * kWarp + lane;
      if (c < hd) dst[c] = __float2bfloat16_rn(x[k]);
    }
    return;
  }

  const int page_id = meta.page;
  const int slot = meta.slot;
  if (page_id < 0 || slot < 0 || slot >= kv::kPageTokens) return;  // padding row (or a slot no page has)
  const int h = is_v ? item - a.n_heads - a.n_kv_heads : item - a.n_heads;
  const kv::SlotDst d = kv::slot_dst(a.pool, a.geo, page_id, a.n_kv_heads, h, slot, is_v);
  if constexpr (F == formats::KvFormat::BF16) {
    uint16_t* row = reinterpret_cast<uint16_t*>(d.row);
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int c = k * kWarp + lane;
      if (c < hd) row[c] = kv::quiet_bf16_nan(bits[k]);
    }
  } else {
    const uint16_t* anchor = nullptr;
    if constexpr (F == formats::KvFormat::INT4_HADAMARD) {
      const int ai = is_v ? -1 : meta.anchor;
      if (ai >= 0) anchor = a.key_anchors + (static_cast<int64_t>(ai) * a.n_kv_heads + h) * hd;
    }
    kv::encode_quantized<F>(x, hd, d, slot, a.geo.groups, anchor, a.kv_hadamard_block, a.kv_hadamard_scale, lane);
  }
}

// grid = (ceil((n_heads + 2 n_kv_heads) / kQkvWarps), rows). Warp w of CTA (bx, r) owns head item
// i = bx * kQkvWarps + w of row r (qkv_head_item).
template <formats::KvFormat F, bool kRope>
__global__ void __launch_bounds__(kQkvWarps * kWarp) qkv_rope_kv_append_kernel(const QkvArgs a) {
  __shared__ float2 cs[kRope ? kMaxHalf : 1];
  const int r = static_cast<int>(blockIdx.y);
  // Before the wait: the row's metadata and its RoPE table (positions, inv_freq and the page tables are inputs no
  // kernel of the pass writes; see QkvRowMeta). The fp64 sincos of the table then overlaps the previous kernel.
  const QkvRowMeta meta = qkv_row_meta<F>(a, r);
  if constexpr (kRope) qkv_rope_table(a, r, cs, kQkvWarps * kWarp);
  ops::pdl_prologue();
  if constexpr (kRope) __syncthreads();  // the only barrier: the early return below is after it
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int item = static_cast<int>(blockIdx.x) * kQkvWarps + static_cast<int>(threadIdx.x) / kWarp;
  if (item >= a.n_heads + 2 * a.n_kv_heads) return;  // warp-uniform
  qkv_head_item<F, kRope>(a, cs, meta, r, item, lane);
}

// ---------------------------------------------------------------------------------------------------------------
// kv_append_rotate_q / qkv_rope_kv_append for INT4 / INT4_HADAMARD caches at head_dim 128: kL lanes per (row, head
// item) instead of one warp — a QUAD (kL = 4, lane t holding channels 32 t .. 32 t + 31) or an OCTET (kL = 8,
// 16 t .. 16 t + 15). So
//  - an INT4 group of 32 channels is one lane's 32 registers (quad; its min / max need no shuffle) or two lanes'
//    16 (octet; one shuffle of each lane's min and max, which are exact whatever the order);
//  - the Hadamard butterflies of strides below the lane's channels are in-register, the others one shuffle each
//    (pairs (c, c + h) sit in lanes t and t ^ (h / channels per lane)), in formats/hadamard.h's order (increasing
//    stride, (a + b, a − b) with a the lower channel), then one multiply by the scale: bit for bit kv::hadamard_warp;
//  - a lane's share of a group's 16 code bytes is one store, the head's 256 input bytes 16-byte loads.
// Every other operation is kv::store_int4's / kv::encode_quantized's, in the same order. The octet halves each
// lane's chain of dependent operations (what a decode step waits for) and its registers (48-55 instead of 75-85, so
// more groups in flight at prefill sizes); the host picks (fused_ops.cu). Groups of one row item are uniform (padding rows, q / k / v), so the group
// shuffles (mask: the group's lanes) never diverge inside a group.
constexpr int kQuadHeadDim = 128;
constexpr int kQuadPerLane = kQuadHeadDim / 4;      // 32 channels per lane of a quad
constexpr int kQuadThreads = 128;                   // 32 quads (or 16 octets) per CTA
constexpr int kQuadItemsPerCta = kQuadThreads / 4;
// Passes of up to this many rows take octets (fused_ops.cu: octet_max_rows): every pass by default — measured
// faster at decode batch 1 and 8 and at 2048-row prefill (docs/results.md, fifteenth session).
constexpr int kOctetMaxRows = 1 << 30;

// kL = 32 (a whole warp, lane t holding channels 4 t .. 4 t + 3) is the layout of the W4A16 qkv GEMM's split-K
// reduce (gemm_w4a16_qkv.cuh), where lane t sums float4 t of the head: its RoPE partners are one shuffle away there.
template <int kL>
struct HeadLanes {
  static_assert(kL == 4 || kL == 8 || kL == 32, "quads, octets or a warp of float4s");
  static constexpr int kPerLane = kQuadHeadDim / kL;             // channels per lane
  static constexpr int kItemsPerCta = kQuadThreads / kL;
  static constexpr int kLanesPerGroup = kv::kInt4Group / kPerLane;  // 1, 2 or 8
  // The lane's group of kL lanes inside its warp.
  static __device__ __forceinline__ unsigned mask() {
    if constexpr (kL == 32) {
      return 0xffffffffu;
    } else {
      return ((1u << kL) - 1u) << (threadIdx.x & (32u - kL));
    }
  }
};

// Stores kWords 32-bit words (a lane's kPer BF16 values, or its kPer / 2 code bytes) at dst in the widest accesses
// they fill: uint4s (dst 16-byte aligned), one uint2 (kWords == 2, 8-byte aligned) or one uint16_t (kWords == 1: the
// low half, 2-byte aligned).
template <int kWords>
__device__ __forceinline__ void store_lane_words(void* dst, const uint32_t (&w)[kWords]) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int v = 0; v < kWords / 4; ++v)
      reinterpret_cast<uint4*>(dst)[v] = make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
  } else if constexpr (kWords == 2) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
    static_assert(kWords == 1, "1, 2 or a multiple of 4 words");
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(w[0]);
  }
}

// Butterflies of strides 1 .. block / 2 (block a power of two in 2..128) over the group's head, then x *= scale.
template <int kL>
__device__ __forceinline__ void hadamard_lanes(float (&x)[HeadLanes<kL>::kPerLane], int block, float scale, int t,
                                               unsigned mask) {
  constexpr int kPer = HeadLanes<kL>::kPerLane;
#pragma unroll
  for (int h = 1; h < kPer; h *= 2) {
    if (h < block) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if ((k & h) == 0) {
          const float a = x[k], b = x[k | h];
          x[k] = __fadd_rn(a, b);
          x[k | h] = __fsub_rn(a, b);
        }
      }
    }
  }
#pragma unroll
  for (int m = 1; m < kL; m *= 2) {  // stride kPer · m: lanes t and t ^ m
    if (kPer * m < block) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const float other = __shfl_xor_sync(mask, x[k], m);
        x[k] = (t & m) ? __fsub_rn(other, x[k]) : __fadd_rn(x[k], other);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) x[k] = __fmul_rn(x[k], scale);
}

// The rows a CTA of 32 quads can touch when a row has at least kQuadMinItems items (its RoPE table in shared memory);
// a CTA of 16 octets touches fewer.
constexpr int kQuadMinItems = 11;
constexpr int kQuadMaxRowsPerCta = (kQuadItemsPerCta - 1) / kQuadMinItems + 2;  // 4

__device__ __forceinline__ uint32_t pack_bf16_pair(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// kWords words of BF16 pairs (lower channel in the low half) widened to 2 kWords fp32 values (exact).
template <int kWords>
__device__ __forceinline__ void widen_bf16_words(const uint32_t (&ws)[kWords], float (&x)[2 * kWords]) {
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    x[2 * k] = __uint_as_float(ws[k] << 16);
    x[2 * k + 1] = __uint_as_float(ws[k] & 0xffff0000u);
  }
}

// The lane's channels kPer t .. kPer t + kPer − 1 of a BF16 head (16-byte aligned), widened to fp32 (exact).
template <int kL>
__device__ __forceinline__ void load_head_lanes(const __nv_bfloat16* head, int t,
                                                float (&x)[HeadLanes<kL>::kPerLane]) {
  constexpr int kPer = HeadLanes<kL>::kPerLane;
  uint32_t ws[kPer / 2];
  if constexpr (kPer >= 8) {
    const uint4* src = reinterpret_cast<const uint4*>(head + kPer * t);
#pragma unroll
    for (int v = 0; v < kPer / 8; ++v) {
      const uint4 w = src[v];
      ws[4 * v] = w.x;
      ws[4 * v + 1] = w.y;
      ws[4 * v + 2] = w.z;
      ws[4 * v + 3] = w.w;
    }
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(head + kPer * t);
    ws[0] = w.x;
    ws[1] = w.y;
  }
  widen_bf16_words<kPer / 2>(ws, x);
}
__device__ __forceinline__ void load_quad_head(const __nv_bfloat16* head, int t, float (&x)[kQuadPerLane]) {
  load_head_lanes<4>(head, t, x);
}

// RoPE of a q or k head held by a group: channel c = kPer t + k pairs with c ± 64 in lane t ^ (kL / 2) (one group
// shuffle); row_cs[i] is pair i's (cos, sin) (ops::rope_cos_sin of the row's position). x becomes the BF16-rounded
// result (exact in fp32) and out its BF16 bits, channel kPer t + 2 j in the low half of out[j]. The whole group must
// call it.
template <int kL>
__device__ __forceinline__ void rope_lanes(float (&x)[HeadLanes<kL>::kPerLane], const float2* row_cs, int t,
                                           unsigned mask, uint32_t (&out)[HeadLanes<kL>::kPerLane / 2]) {
  constexpr int kPer = HeadLanes<kL>::kPerLane;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const float other = __shfl_xor_sync(mask, x[k], kL / 2);
    const float2 c = row_cs[(kPer * t + k) & (kQuadHeadDim / 2 - 1)];
    const float y = t < kL / 2 ? ops::rope_lo(x[k], other, c) : ops::rope_hi(other, x[k], c);
    const uint32_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(y));
    x[k] = __uint_as_float(bits << 16);
    if (k & 1) {
      out[k / 2] |= bits << 16;
    } else {
      out[k / 2] = bits;
    }
  }
}
__device__ __forceinline__ void rope_quad(float (&x)[kQuadPerLane], const float2* row_cs, int t, unsigned quad_mask,
                                          uint32_t (&out)[kQuadPerLane / 2]) {
  rope_lanes<4>(x, row_cs, t, quad_mask, out);
}

// The lane's 2 kPer bytes of a BF16 head from out (rope_lanes's order).
template <int kL>
__device__ __forceinline__ void store_head_lanes(__nv_bfloat16* head, int t,
                                                 const uint32_t (&out)[HeadLanes<kL>::kPerLane / 2]) {
  store_lane_words<HeadLanes<kL>::kPerLane / 2>(head + HeadLanes<kL>::kPerLane * t, out);
}
__device__ __forceinline__ void store_quad_head(__nv_bfloat16* head, int t, const uint32_t (&out)[kQuadPerLane / 2]) {
  store_head_lanes<4>(head, t, out);
}

// A q head held by a group (RoPE'd values in x): rotated with the caller's block (a.q_hadamard_block; <= 1: none) and
// stored as BF16 at head (global or shared memory, 16-byte aligned; lane t writes channels kPer t .. kPer t + kPer − 1).
// finish_item_lanes's q step, also used by the decode attention's own prologue (attention_decode.cuh), so the
// rotated query it attends with has the bits kv_append_rotate_q would store. The whole group must call it.
template <int kL>
__device__ __forceinline__ void rotate_store_q_lanes(const QkvArgs& a, float (&x)[HeadLanes<kL>::kPerLane], int t,
                                                     unsigned mask, __nv_bfloat16* head) {
  constexpr int kPer = HeadLanes<kL>::kPerLane;
  if (a.q_hadamard_block > 1) hadamard_lanes<kL>(x, a.q_hadamard_block, a.q_hadamard_scale, t, mask);
  uint32_t words[kPer / 2];
#pragma unroll
  for (int k = 0; k < kPer / 2; ++k) words[k] = pack_bf16_pair(x[2 * k], x[2 * k + 1]);
  store_lane_words<kPer / 2>(head + kPer * t, words);
}
__device__ __forceinline__ void rotate_store_q_quad(const QkvArgs& a, float (&x)[kQuadPerLane], int t,
                                                    unsigned quad_mask, __nv_bfloat16* head) {
  rotate_store_q_lanes<4>(a, x, t, quad_mask, head);
}

// Everything after the (RoPE'd) values of head item `item` of row r are in the group's registers: q heads are
// rotated with the caller's block and stored as BF16 into q_out; k and v heads (not on padding rows) are rotated
// with the format's block (INT4_HADAMARD), the key anchor subtracted (keys of rows with one), and encoded by the
// INT4 rule into their cache slot. Shared by kv_append_rotate_q_quad_kernel and the FP8 QKV GEMM's epilogue
// (gemm_fp8_qkv.cuh), so the two cannot drift apart. The whole group must call it (group shuffles).
//
// pre (optional): the lane's key-anchor channels, loaded by the caller before its griddepcontrol.wait
// (kv_append_rotate_q_quad_kernel with kRope: anchors are then inputs of the pass no kernel writes); pre->loaded false
// or no pre: they are read here. The same fp16 values widened exactly, so the same bits either way.
// Key anchor ai's row for KV head h (fp16, kQuadHeadDim channels).
__device__ __forceinline__ const uint16_t* key_anchor_row(const QkvArgs& a, int ai, int h) {
  return a.key_anchors + (static_cast<int64_t>(ai) * a.n_kv_heads + h) * kQuadHeadDim;
}
template <int kL>
struct AnchorLanes {
  float v[HeadLanes<kL>::kPerLane];
  bool loaded = false;
};
template <formats::KvFormat F, int kL>
__device__ __forceinline__ void finish_item_lanes(const QkvArgs& a, float (&x)[HeadLanes<kL>::kPerLane], int r,
                                                  int item, const QkvRowMeta& meta, int t, unsigned mask,
                                                  const AnchorLanes<kL>* pre = nullptr) {
  using HL = HeadLanes<kL>;
  constexpr int kPer = HL::kPerLane;
  const bool is_q = item < a.n_heads;
  const bool is_v = item >= a.n_heads + a.n_kv_heads;
  if (!is_q && (meta.page < 0 || meta.slot < 0 || meta.slot >= kv::kPageTokens)) return;  // padding row

  if (is_q) {
    rotate_store_q_lanes<kL>(a, x, t, mask, a.q_out + (static_cast<int64_t>(r) * a.n_heads + item) * kQuadHeadDim);
    return;
  }

  const int h = is_v ? item - a.n_heads - a.n_kv_heads : item - a.n_heads;
  const kv::SlotDst d = kv::slot_dst(a.pool, a.geo, meta.page, a.n_kv_heads, h, meta.slot, is_v);
  if constexpr (F == formats::KvFormat::INT4_HADAMARD) {
    hadamard_lanes<kL>(x, a.kv_hadamard_block, a.kv_hadamard_scale, t, mask);
    const int ai = is_v ? -1 : meta.anchor;
    if (ai >= 0) {
      if (pre != nullptr && pre->loaded) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) x[k] = __fsub_rn(x[k], pre->v[k]);
      } else {
        const uint16_t* anchor = key_anchor_row(a, ai, h);
#pragma unroll
        for (int k = 0; k < kPer; ++k) x[k] = __fsub_rn(x[k], kv::f16_bits_to_f32(anchor[kPer * t + k]));
      }
    }
  }
  // The int4 rule on the lane's group (kv::store_int4's operations; min / max are exact whatever the order).
  float lo = 0.0f, hi = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const float neg = x[k] < 0.0f ? x[k] : 0.0f, pos = 0.0f < x[k] ? x[k] : 0.0f;
    lo = neg < lo ? neg : lo;
    hi = hi < pos ? pos : hi;
  }
#pragma unroll
  for (int m = 1; m < HL::kLanesPerGroup; m *= 2) {  // octets: the group's other half
    const float olo = __shfl_xor_sync(mask, lo, m), ohi = __shfl_xor_sync(mask, hi, m);
    lo = olo < lo ? olo : lo;
    hi = hi < ohi ? ohi : hi;
  }
  const float s = __fdiv_rn(__fsub_rn(hi, lo), kv::kInt4Levels);
  uint16_t scale_bits = kv::f32_to_f16_bits(s);
  float scale = kv::f16_bits_to_f32(scale_bits);
  if (!(scale > 0.0f)) {
    scale_bits = kv::kF16One;
    scale = 1.0f;
  }
  // The kPer + 1 divisions by the group's scale: IEEE quotients through one reciprocal (shared_divisor.h) when the
  // scale is in that header's domain (every finite fp16 scale), else __fdiv_rn (an fp16-overflowing, infinite scale).
  constexpr int kCodeWords = (kPer + 7) / 8;  // the lane's kPer / 2 code bytes (2 for a warp of float4s)
  uint32_t bytes[kCodeWords];
#pragma unroll
  for (int w = 0; w < kCodeWords; ++w) bytes[w] = 0u;
  int zero = 0;
  const auto encode = [&](const auto& div) {
    zero = static_cast<int>(fminf(fmaxf(rintf(div(-lo)), 0.0f), kv::kInt4Levels));
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const float q = __fadd_rn(rintf(div(x[k])), static_cast<float>(zero));
      const uint32_t u = static_cast<uint32_t>(fminf(fmaxf(q, 0.0f), kv::kInt4Levels));
      bytes[k / 8] |= u << (4 * (k % 8));  // channel kPer t + k: byte kPer t / 2 + k / 2, even channel low nibble
    }
  };
  divisor::with_divisor(scale, encode);
  store_lane_words<kCodeWords>(d.row + (kPer / 2) * t, bytes);
  if (t % HL::kLanesPerGroup == 0) {  // the group's first lane
    const int g = t / HL::kLanesPerGroup;
    reinterpret_cast<uint16_t*>(d.scales)[meta.slot * a.geo.groups + g] = scale_bits;
    d.zeros[meta.slot * a.geo.groups + g] = static_cast<uint8_t>(zero);
  }
}
template <formats::KvFormat F>
__device__ __forceinline__ void finish_quad_item(const QkvArgs& a, float (&x)[kQuadPerLane], int r, int item,
                                                 const QkvRowMeta& meta, int t, unsigned quad_mask) {
  finish_item_lanes<F, 4>(a, x, r, item, meta, t, quad_mask);
}

// grid = ceil(rows · items / (128 / kL)) CTAs of 128 threads; group i of the launch (kL lanes) owns item i % items of
// row i / items. kRope (qkv_rope_kv_append): q and k heads are RoPE'd first (rope_lanes), the BF16 result written back
// into qkv; the CTA's rows' cos/sin tables are built in shared memory before griddepcontrol.wait. Rows need
// >= kQuadMinItems items (the host checks). kKeysOnly (kv_append_keys, !kRope): only the k heads (items =
// n_kv_heads; group i owns k head i % n_kv_heads of row i / n_kv_heads) — the cache append of keys that an FP8 QKV
// GEMM left as RoPE'd BF16 because their key anchors were not known yet.
template <formats::KvFormat F, bool kRope, bool kKeysOnly = false, int kL = 4>
__global__ void __launch_bounds__(kQuadThreads) kv_append_rotate_q_quad_kernel(const QkvArgs a, int rows) {
  static_assert(F == formats::KvFormat::INT4 || F == formats::KvFormat::INT4_HADAMARD, "INT4 caches");
  static_assert(!(kRope && kKeysOnly), "the keys-only append reads RoPE'd keys");
  using HL = HeadLanes<kL>;
  __shared__ float2 cs[kRope ? kQuadMaxRowsPerCta : 1][kQuadHeadDim / 2];
  const int items = kKeysOnly ? a.n_kv_heads : a.n_heads + 2 * a.n_kv_heads;
  const int64_t first_group = static_cast<int64_t>(blockIdx.x) * HL::kItemsPerCta;
  const int64_t group = first_group + threadIdx.x / kL;
  const int64_t total = static_cast<int64_t>(rows) * items;
  const int t = static_cast<int>(threadIdx.x) & (kL - 1);
  const unsigned mask = HL::mask();
  const int row0 = static_cast<int>(first_group / items);
  if constexpr (kRope) {
    // The table of rows row0 .. row0 + 3 (those of them that exist), before the wait: positions and inv_freq are
    // inputs of the pass no kernel writes.
    for (int i = static_cast<int>(threadIdx.x); i < kQuadMaxRowsPerCta * (kQuadHeadDim / 2); i += kQuadThreads) {
      const int rr = row0 + i / (kQuadHeadDim / 2), pair = i % (kQuadHeadDim / 2);
      if (rr < rows) cs[i / (kQuadHeadDim / 2)][pair] = ops::rope_cos_sin(static_cast<double>(a.positions[rr]),
                                                                          a.inv_freq[pair]);
    }
  }
  const bool live = group < total;  // group-uniform
  const int r = live ? static_cast<int>(group / items) : 0;
  const int item = (kKeysOnly ? a.n_heads : 0) + (live ? static_cast<int>(group % items) : 0);
  const bool is_q = item < a.n_heads;
  const bool is_v = item >= a.n_heads + a.n_kv_heads;
  QkvRowMeta meta{-1, -1, -1};
  if (live && !is_q) meta = qkv_row_meta<F>(a, r);  // inputs of the pass no kernel writes (read before the wait)
  // With kRope (qkv_rope_kv_append) the key anchors are such inputs too: a pass that computes anchors runs
  // kv_append_rotate_q instead (fused_ops.h). The k items load their anchor channels now, so the anchor's L2 round
  // trip is off the chain after the wait (it sat between the Hadamard and the INT4 encode).
  AnchorLanes<kL> pre;
  if constexpr (kRope && F == formats::KvFormat::INT4_HADAMARD) {
    const bool is_k = !is_q && !is_v;
    if (live && is_k && meta.anchor >= 0 && meta.page >= 0 && meta.slot >= 0 && meta.slot < kv::kPageTokens) {
      const uint16_t* anchor = key_anchor_row(a, meta.anchor, item - a.n_heads);
#pragma unroll
      for (int k = 0; k < HL::kPerLane; ++k) pre.v[k] = kv::f16_bits_to_f32(anchor[HL::kPerLane * t + k]);
      pre.loaded = true;
    }
  }
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  if constexpr (kRope) __syncthreads();  // the only barrier: every return below is after it
  if (!live) return;

  __nv_bfloat16* head = a.qkv + static_cast<int64_t>(r) * a.row_width + static_cast<int64_t>(item) * kQuadHeadDim;
  float x[HL::kPerLane];
  load_head_lanes<kL>(head, t, x);
  if constexpr (kRope) {
    if (!is_v) {
      uint32_t out[HL::kPerLane / 2];
      rope_lanes<kL>(x, cs[r - row0], t, mask, out);
      store_head_lanes<kL>(head, t, out);
    }
  }
  finish_item_lanes<F, kL>(a, x, r, item, meta, t, mask, &pre);
}

// Host side (fused_ops.cu), shared with the W4A16 GEMM's QKV epilogue (gemm_w4a16.cu): the checks of
// qkv_rope_kv_append (rope) or kv_append_rotate_q (!rope) — messages start with `op` — then the kernel arguments.
// cudaErrorInvalidValue with the reason in *why, else cudaSuccess.
cudaError_t make_qkv_args(const char* op, bool rope, formats::KvFormat format, __nv_bfloat16* qkv, int rows,
                          int n_heads, int n_kv_heads, int head_dim, const int32_t* positions, const float* inv_freq,
                          const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors,
                          const int32_t* row_anchor, uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out,
                          QkvArgs* args, std::string* why, bool needs_q_out = true);
// Enqueues qkv_rope_kv_append_kernel<format, rope> for `rows` rows of checked arguments (no check here).
cudaError_t launch_qkv_kernel(const QkvArgs& a, formats::KvFormat format, int rows, bool rope, cudaStream_t stream);

}  // namespace futransformer::cuda::fused
