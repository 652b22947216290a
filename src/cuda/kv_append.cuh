// Kernels of the KV-cache append (quantise new tokens' K and V into their page slots) and of the int4-hadamard
// key anchor. Both reproduce the CPU quantiser (src/formats/kv_cache.cpp, hadamard.cpp, int4.cpp, fp8.cpp) bit for
// bit, so every fp32 operation below is the CPU's operation in the CPU's order, written with the _rn intrinsics:
// nvcc contracts a multiply followed by an add into one FMA (one rounding instead of two), which the x86 CPU code
// never does (e.g. the Hadamard scale multiply followed by the anchor subtraction).
//
// Register layout: one warp owns one head vector; lane l holds channels c = 32 i + l (i < ceil(head_dim / 32)).
// Loads are then 64-byte coalesced, an int4 group of 32 channels is register i across the warp (its min/max is
// one shuffle reduction), and a Hadamard butterfly of stride h < 32 pairs lanes l and l ^ h while a stride 32 m
// pairs registers i and i ^ m of one lane.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ptx/cvt.cuh"
#include "futransformer/cuda/kv_append.h"
#include "futransformer/formats/kv_cache.h"

namespace futransformer::cuda::kv {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxPerLane = kKvAppendMaxHeadDim / kWarp;  // registers per lane for the largest head
constexpr int kAppendWarps = 4;  // warps per CTA of kv_append_kernel, each one (row, KV head, K or V)
constexpr int kAnchorThreads = 512;  // threads per CTA of kv_key_anchor_kernel
constexpr int kAnchorCluster = 8;    // CTAs per (KV head, sequence): each sums head_dim / 8 channels
constexpr int kAnchorBlockTokens = static_cast<int>(formats::kKvAnchorBlockTokens);  // rows per fp64 block sum
// fp64 block sums staged per round of kv_key_anchor_kernel: (threads / threads per block) blocks x the CTA's
// channels = threads x channels per thread (at most 2) — 8 KB of shared memory.
constexpr int kAnchorStagedSums = 2 * kAnchorThreads;
constexpr int kPageTokens = static_cast<int>(formats::kKvPageTokens);
constexpr int kInt4Group = static_cast<int>(formats::kKvInt4Group);
constexpr float kInt4Levels = 15.0f;  // int4.cpp: 16 levels, 15 steps
constexpr float kFp8Max = 448.0f;     // formats::kFp8E4M3Max
constexpr float kF16Max = 65504.0f;   // kv_key_anchor's saturation bound (largest finite fp16, exact in fp32)
constexpr uint16_t kF16One = 0x3C00;  // f32_to_f16(1.0f): the unit scale of an all-zero int4 group

static_assert(kInt4Group == kWarp, "an int4 group must be one register across the warp");
static_assert(kMaxPerLane == 8, "the Hadamard register stages below cover strides 32, 64 and 128");
static_assert(kAnchorThreads >= kKvAppendMaxHeadDim, "kv_key_anchor_kernel needs one group of threads per head");
static_assert(kAnchorBlockTokens == 32, "kv_key_anchor_kernel unrolls one block's loads");

// Byte offsets of one page's regions (formats::KvPageLayout, narrowed: a page is at most 64 KiB here).
struct PageGeometry {
  int64_t page_bytes;
  int32_t code_row_bytes;
  int32_t groups;
  int32_t codes[2], scales[2], zeros[2];  // [0] = K, [1] = V
};

// Host side: the narrowed geometry of formats::kv_page_layout(format, head_dim) (which throws for a head_dim the
// format cannot hold: callers check the shape first).
inline PageGeometry page_geometry(formats::KvFormat format, int head_dim) {
  const formats::KvPageLayout L = formats::kv_page_layout(format, head_dim);
  PageGeometry g{};
  g.page_bytes = L.page_bytes;
  g.code_row_bytes = static_cast<int32_t>(L.code_row_bytes);
  g.groups = static_cast<int32_t>(L.groups);
  for (int p = 0; p < 2; ++p) {
    g.codes[p] = static_cast<int32_t>(L.codes[p]);
    g.scales[p] = static_cast<int32_t>(L.scales[p]);
    g.zeros[p] = static_cast<int32_t>(L.zeros[p]);
  }
  return g;
}

struct AppendArgs {
  const __nv_bfloat16* qkv;
  int64_t row_stride;
  int32_t part_offset[2];  // k_offset, v_offset
  int32_t rows, n_kv_heads, head_dim;
  const int32_t* row_page;
  const int32_t* row_slot;
  const uint16_t* key_anchors;  // INT4_HADAMARD only
  const int32_t* row_anchor;    // INT4_HADAMARD only
  uint8_t* pool;
  PageGeometry geo;
  int32_t hadamard_block;  // formats::hadamard_block_for(head_dim) (INT4_HADAMARD)
  float hadamard_scale;    // formats::hadamard_scale(hadamard_block), computed by the host's own function
};

struct AnchorArgs {
  const __nv_bfloat16* qkv;
  int64_t row_stride;
  int32_t k_offset, n_kv_heads, head_dim;
  const int32_t* first_row;
  const int32_t* row_count;
  const int32_t* anchor_index;
  uint16_t* key_anchors;
  int32_t hadamard_block;
  float hadamard_scale;
};

// Lane l's channels 32 i + l of one head vector, widened to fp32 (exact); channels past head_dim read as 0 and
// are never stored.
__device__ __forceinline__ void load_head(const __nv_bfloat16* src, int head_dim, int lane, float (&x)[kMaxPerLane]) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int c = i * kWarp + lane;
    x[i] = c < head_dim ? __bfloat162float(src[c]) : 0.0f;
  }
}

// hadamard_blocks(x, head_dim, block) over the warp's head vector (head_dim a multiple of 32, block a power of two
// in 32..128 dividing it), in formats/hadamard.h's order: butterfly strides 1, 2, ..., block / 2, each pair
// (j, j + h) becoming (a + b, a - b) with a = x[j]; then one multiply by `scale` per element. An fp32 add is
// commutative, so only the subtraction's operand order has to follow the CPU.
__device__ __forceinline__ void hadamard_warp(float (&x)[kMaxPerLane], int nv, int block, float scale, int lane) {
  for (int h = 1; h < kWarp && h < block; h *= 2) {
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i < nv) {  // nv is warp-uniform: every lane takes part in the shuffle
        const float other = __shfl_xor_sync(kFullMask, x[i], h);
        // The lane with bit h clear holds x[j] (a), its partner x[j + h] (b).
        x[i] = (lane & h) ? __fsub_rn(other, x[i]) : __fadd_rn(x[i], other);
      }
    }
  }
#pragma unroll
  for (int m = 1; m < kMaxPerLane; m *= 2) {  // stride h = 32 m, inside each lane (compile-time register indices)
    if (kWarp * m < block) {
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        if ((i & m) == 0 && i < nv) {
          const float a = x[i], b = x[i | m];
          x[i] = __fadd_rn(a, b);
          x[i | m] = __fsub_rn(a, b);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) x[i] = __fmul_rn(x[i], scale);
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(kFullMask, v, o);
    v = w < v ? w : v;
  }
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(kFullMask, v, o);
    v = v < w ? w : v;
  }
  return v;
}

__device__ __forceinline__ uint16_t f32_to_f16_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ float f16_bits_to_f32(uint16_t b) { return __half2float(__ushort_as_half(b)); }

// The int4 rule of int4.h with {group 32, asymmetric, F16 scales} (int4_group_params + int4_quantize_value) on
// the warp's head vector y (nv groups): codes to the slot's code row `row`, fp16 scale bits and u8 zero-points to
// the slot's `scales` and `zeros` (nv entries each).
__device__ __forceinline__ void store_int4(const float (&y)[kMaxPerLane], int nv, uint8_t* row, uint16_t* scales,
                                           uint8_t* zeros, int lane) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (i >= nv) continue;  // warp-uniform
    // The grid always contains 0: lo <= 0 <= hi. (The sign of a zero lo cannot change s or z below.)
    const float lo = warp_min(y[i] < 0.0f ? y[i] : 0.0f);
    const float hi = warp_max(0.0f < y[i] ? y[i] : 0.0f);
    const float s = __fdiv_rn(__fsub_rn(hi, lo), kInt4Levels);
    uint16_t scale_bits = f32_to_f16_bits(s);
    float scale = f16_bits_to_f32(scale_bits);
    if (!(scale > 0.0f)) {  // all-zero group, or a scale that underflows fp16: unit scale, as the CPU
      scale_bits = kF16One;
      scale = 1.0f;
    }
    const float zf = rintf(__fdiv_rn(-lo, scale));  // rintf: round half to even, as std::nearbyint
    const int zero = static_cast<int>(fminf(fmaxf(zf, 0.0f), kInt4Levels));
    const float q = __fadd_rn(rintf(__fdiv_rn(y[i], scale)), static_cast<float>(zero));
    const uint32_t u = static_cast<uint32_t>(fminf(fmaxf(q, 0.0f), kInt4Levels));
    // Channel 32 i + l: byte 16 i + l / 2, the even channel in the low nibble.
    const uint32_t u_odd = __shfl_down_sync(kFullMask, u, 1);
    if ((lane & 1) == 0) row[i * (kWarp / 2) + lane / 2] = static_cast<uint8_t>(u | (u_odd << 4));
    if (lane == i) {
      scales[i] = scale_bits;
      zeros[i] = static_cast<uint8_t>(zero);
    }
  }
}

// fp8_quantize_per_token on the head vector: scale = amax / 448 (1 when that is 0), code = encode(x / scale).
__device__ __forceinline__ void store_fp8(const float (&x)[kMaxPerLane], int head_dim, uint8_t* row, float* scale,
                                          int lane) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const float a = fabsf(x[i]);  // channels past head_dim hold 0
    amax = amax < a ? a : amax;
  }
  amax = warp_max(amax);
  float s = __fdiv_rn(amax, kFp8Max);
  if (!(s > 0.0f)) s = 1.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int c = i * kWarp + lane;
    // IEEE division, never a reciprocal multiply (fp8.h).
    if (c < head_dim) row[c] = static_cast<uint8_t>(ptx::cvt_rn_satfinite_e4m3x2_f32(__fdiv_rn(x[i], s), 0.0f));
  }
  if (lane == 0) *scale = s;
}

// BF16: the input is already bf16, and f32_to_bf16 of its (exact) fp32 widening gives the same bits back, except
// that a signalling NaN comes back quiet (bit 6 set).
__device__ __forceinline__ uint16_t quiet_bf16_nan(uint16_t b) {
  return (b & 0x7fffu) > 0x7f80u ? static_cast<uint16_t>(b | 0x40u) : b;
}
__device__ __forceinline__ void store_bf16(const __nv_bfloat16* src, int head_dim, uint16_t* row, int lane) {
  for (int c = lane; c < head_dim; c += kWarp) row[c] = quiet_bf16_nan(__bfloat16_as_ushort(src[c]));
}

// Where one (page id, KV head, part) slot's bytes go: its code row and the part's scale and zero regions (the slot's
// entries inside them are indexed by the store functions).
struct SlotDst {
  uint8_t* row;
  uint8_t* scales;
  uint8_t* zeros;
};

// Select K's or V's fields with a branch, not a runtime array index: indexing a kernel parameter array with a
// runtime value makes nvcc copy the whole argument struct to local memory.
__device__ __forceinline__ SlotDst slot_dst(uint8_t* pool, const PageGeometry& geo, int page_id, int n_kv_heads, int h,
                                            int slot, bool v) {
  uint8_t* page = pool + (static_cast<int64_t>(page_id) * n_kv_heads + h) * geo.page_bytes;
  return {page + (v ? geo.codes[1] : geo.codes[0]) + slot * geo.code_row_bytes,
          page + (v ? geo.scales[1] : geo.scales[0]), page + (v ? geo.zeros[1] : geo.zeros[0])};
}

// The quantised formats' encoding of the warp's head vector x (lane layout above, channels past head_dim 0) into
// slot `slot`: FP8 per token; INT4 per 32-channel group; INT4_HADAMARD rotates x first (hadamard_block/scale of
// the format) and subtracts `anchor` (fp16 bits, head_dim values; nullptr: none) before the INT4 rule. x is
// modified.
template <formats::KvFormat F>
__device__ __forceinline__ void encode_quantized(float (&x)[kMaxPerLane], int head_dim, const SlotDst& d, int slot,
                                                 int groups, const uint16_t* anchor, int hadamard_block,
                                                 float hadamard_scale, int lane) {
  static_assert(F != formats::KvFormat::BF16, "BF16 stores the input bits (store_bf16)");
  if constexpr (F == formats::KvFormat::FP8) {
    store_fp8(x, head_dim, d.row, reinterpret_cast<float*>(d.scales) + slot, lane);
  } else {
    const int nv = head_dim / kWarp;
    if constexpr (F == formats::KvFormat::INT4_HADAMARD) {
      hadamard_warp(x, nv, hadamard_block, hadamard_scale, lane);
      if (anchor != nullptr) {
#pragma unroll
        for (int i = 0; i < kMaxPerLane; ++i) {
          if (i < nv) x[i] = __fsub_rn(x[i], f16_bits_to_f32(anchor[i * kWarp + lane]));
        }
      }
    }
    store_int4(x, nv, d.row, reinterpret_cast<uint16_t*>(d.scales) + slot * groups, d.zeros + slot * groups, lane);
  }
}

// One warp per (row, KV head, part); the warp's item index is warp-uniform, so its early returns keep the
// shuffles of the warps that continue full.
template <formats::KvFormat F>
__global__ void __launch_bounds__(kAppendWarps * kWarp) kv_append_kernel(const AppendArgs a) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kAppendWarps + threadIdx.x / kWarp;
  const int part = static_cast<int>(item % 2);
  const int64_t row_head = item / 2;
  if (row_head >= static_cast<int64_t>(a.rows) * a.n_kv_heads) return;
  const int h = static_cast<int>(row_head % a.n_kv_heads);
  const int r = static_cast<int>(row_head / a.n_kv_heads);
  const int page_id = a.row_page[r];
  const int slot = a.row_slot[r];
  if (page_id < 0 || slot < 0 || slot >= kPageTokens) return;  // padding row (or a slot no page has)
  const bool v = part == 1;
  const int64_t part_offset = v ? a.part_offset[1] : a.part_offset[0];
  const SlotDst d = slot_dst(a.pool, a.geo, page_id, a.n_kv_heads, h, slot, v);
  const __nv_bfloat16* src = a.qkv + r * a.row_stride + part_offset + static_cast<int64_t>(h) * a.head_dim;

  if constexpr (F == formats::KvFormat::BF16) {
    store_bf16(src, a.head_dim, reinterpret_cast<uint16_t*>(d.row), lane);
  } else {
    float x[kMaxPerLane];
    load_head(src, a.head_dim, lane, x);
    const uint16_t* anchor = nullptr;
    if constexpr (F == formats::KvFormat::INT4_HADAMARD) {
      const int ai = v ? -1 : a.row_anchor[r];
      if (ai >= 0) anchor = a.key_anchors + (static_cast<int64_t>(ai) * a.n_kv_heads + h) * a.head_dim;
    }
    encode_quantized<F>(x, a.head_dim, d, slot, a.geo.groups, anchor, a.hadamard_block, a.hadamard_scale, lane);
  }
}

// formats::kv_key_anchor: c = fp16(H·m), m the mean of the chunk's raw keys from fp64 sums of 32-row blocks (token
// order inside a block) added in block order. One cluster of kAnchorCluster CTAs per (KV head, sequence): grid
// (n_kv_heads · kAnchorCluster, n_seqs), CTA rank r sums channels r · head_dim / 8 … (r + 1) · head_dim / 8 − 1,
// so 64 SMs work at the 8B shape instead of 8. Inside a CTA the threads form groups of (its channels / kPairs)
// threads, each thread kPairs adjacent channels (kPairs = 2: 4-byte loads when every key row is 4-byte aligned,
// decided by the host); group g sums block `round + g` of each round with its 32 rows' loads issued together
// (straight from global memory: the rows are L2-resident after the QKV GEMM) and stages the block sums in shared
// memory; group 0 then adds the round's block sums in block order. After a cluster barrier, one warp of rank 0
// gathers the whole mean vector from the cluster's shared memory, rotates it (hadamard_warp, the CPU's
// butterflies) and rounds it to fp16; a second barrier keeps every CTA's shared memory alive until then.
// static: this header is included by more than one .cu file (fused_ops.cu reuses its device functions).
template <int kPairs>
static __global__ void __launch_bounds__(kAnchorThreads) kv_key_anchor_kernel(const AnchorArgs a) {
  namespace cg = cooperative_groups;
  __shared__ double staged[kAnchorStagedSums];
  __shared__ float mean[kKvAppendMaxHeadDim / kAnchorCluster];
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int h = static_cast<int>(blockIdx.x) / kAnchorCluster;
  const int seq = static_cast<int>(blockIdx.y);
  const int first = a.first_row[seq];
  const int count = a.row_count[seq];
  const int index = a.anchor_index[seq];
  if (first < 0 || count <= 0 || index < 0) return;  // cluster-uniform: no barrier is skipped by only some
  const int channels = a.head_dim / kAnchorCluster;  // this CTA's
  const int group_threads = channels / kPairs;
  const int groups = kAnchorThreads / group_threads;  // blocks summed per round
  const int t = static_cast<int>(threadIdx.x);
  const int g = t / group_threads;
  const int c0 = (t % group_threads) * kPairs;  // this thread's first channel within the CTA's
  const int n_blocks = (count + kAnchorBlockTokens - 1) / kAnchorBlockTokens;
  const uint16_t* keys = reinterpret_cast<const uint16_t*>(a.qkv) + static_cast<int64_t>(first) * a.row_stride +
                         a.k_offset + static_cast<int64_t>(h) * a.head_dim + rank * channels + c0;
  double total[kPairs] = {};
  for (int round = 0; round < n_blocks; round += groups) {
    const int b = round + g;
    if (g < groups && b < n_blocks) {
      const int r0 = b * kAnchorBlockTokens;
      const int rows = min(kAnchorBlockTokens, count - r0);
      const uint16_t* p = keys + static_cast<int64_t>(r0) * a.row_stride;
      uint32_t v[kAnchorBlockTokens];  // the block's bf16 values (kPairs = 2: both channels' bits in one word)
#pragma unroll
      for (int r = 0; r < kAnchorBlockTokens; ++r) {
        if (r < rows) {
          const uint16_t* row = p + static_cast<int64_t>(r) * a.row_stride;
          if constexpr (kPairs == 2) v[r] = *reinterpret_cast<const uint32_t*>(row);
          else v[r] = *row;
        }
      }
      double s[kPairs] = {};
#pragma unroll
      for (int r = 0; r < kAnchorBlockTokens; ++r) {
        if (r < rows) {
#pragma unroll
          for (int j = 0; j < kPairs; ++j)
            s[j] = __dadd_rn(s[j], static_cast<double>(__uint_as_float((v[r] >> (16 * j)) << 16)));
        }
      }
#pragma unroll
      for (int j = 0; j < kPairs; ++j) staged[g * channels + c0 + j] = s[j];
    }
    __syncthreads();
    if (g == 0) {
      const int n = min(groups, n_blocks - round);
      for (int k = 0; k < n; ++k) {
#pragma unroll
        for (int j = 0; j < kPairs; ++j) total[j] = __dadd_rn(total[j], staged[k * channels + c0 + j]);
      }
    }
    __syncthreads();  // the staged sums are overwritten by the next round
  }
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) mean[c0 + j] = __double2float_rn(__ddiv_rn(total[j], static_cast<double>(count)));
  }
  cluster.sync();  // barrier.cluster (release / acquire): every rank's means are visible to rank 0
  if (rank == 0 && t < kWarp) {
    const int lane = t;
    const int nv = a.head_dim / kWarp;
    float x[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int c = i * kWarp + lane;
      x[i] = i < nv ? cluster.map_shared_rank(mean, c / channels)[c % channels] : 0.0f;
    }
    hadamard_warp(x, nv, a.hadamard_block, a.hadamard_scale, lane);
    uint16_t* out = a.key_anchors + (static_cast<int64_t>(index) * a.n_kv_heads + h) * a.head_dim;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i < nv) {
        const float v = isnan(x[i]) ? 0.0f : x[i];  // inf − inf in a butterfly of means near fp32's limit
        out[i * kWarp + lane] = f32_to_f16_bits(fminf(fmaxf(v, -kF16Max), kF16Max));
      }
    }
  }
  cluster.sync();  // no CTA leaves (freeing its shared memory) before rank 0 has read it
}

}  // namespace futransformer::cuda::kv
