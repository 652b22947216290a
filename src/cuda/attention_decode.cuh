// Decode attention over the paged KV cache on Hopper (FlashDecoding-style): one query token per sequence, GQA.
// Fragment maps and page/stage geometry: src/cuda/attention_decode_layout.h; design notes: docs/kernels.md.
//
// - A CTA (4 warps) owns one (sequence, KV head, split): all G <= 8 query heads that share the KV head, so every
//   cache byte is read once. The split's 16-token tiles are dealt to the warps round-robin; each warp keeps its
//   own online-softmax state (running max m, sum l, unnormalised O) for the G heads.
// - Each warp streams its tiles through a private ring of kStages shared-memory stages with cp.async (16-byte
//   chunks; no L2 evict-first hint: it faulted on the H200, see docs/kernels.md). Only the warp's own lanes read
//   a stage, so the main loop synchronises with __syncwarp, never with the whole CTA.
// - mma.m16n8k16 (bf16 in, fp32 accumulate). BF16 cache: S = Q·Kᵀ and O += P·V (Q and P the A operand, rows 8..15
//   empty). INT4 cache: the transposed products Sᵀ = K·Qᵀ and Oᵀ += Vᵀ·P'ᵀ (Int4Tile), the codes as the 16-row A
//   operand and the query heads as the n = 8 columns, so no mma row is empty. INT4 codes become exact integers
//   u − z in bf16 registers (lop3 magic number, one bf16x2 subtract); key scales multiply the per-group fp32
//   partial scores, value scales are folded into P (rounded once to bf16 with it; movmatrix turns P' from Sᵀ's
//   accumulator layout into Oᵀ's B layout).
// - The end merges the warps through shared memory (log-sum-exp). One split writes BF16; several write the
//   normalised partial O and its log2-sum-exp, merged by attention_decode_combine_kernel in split order: the
//   result is deterministic. The combine can also un-rotate an int4-hadamard output (attention_decode_int4_unrotated),
//   which saves the caller's separate rotate_heads_bf16 launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/attention_decode_layout.h"
#include "cuda/fused_ops.cuh"
#include "cuda/ptx/bits.cuh"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/griddep.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/math.cuh"
#include "cuda/ptx/mma.cuh"

namespace futransformer::cuda::attn {

struct DecodeArgs {
  const __nv_bfloat16* q;      // [batch, n_heads, D]
  const uint8_t* pool;         // page of (page_id, kv_head) at (page_id * n_kv_heads + kv_head) * page_bytes
  const int32_t* block_table;  // [batch, max_pages]
  const int32_t* seq_lens;     // [batch]
  __nv_bfloat16* out;          // [batch, n_heads, D]                 (splits == 1)
  float* partial_o;            // [batch, n_heads, splits, D]         (splits > 1)
  float* partial_lse;          // [batch, n_heads, splits], log2 domain (splits > 1)
  int n_heads, n_kv_heads, gqa, max_pages, splits;
  float score_scale;  // log2(e) / sqrt(D): scores go straight to the exp2 domain
  // Copy the cache tiles before griddepcontrol.wait, all but the one holding each sequence's last token
  // (seq_lens[b] - 1), which the kernel before may be writing: the launchers' early_copies (decode steps only); the
  // prologue instances always do it.
  int prefetch_early;
  // Read by the cluster instances (kCl, splits > 1) only: un-rotate the combined head as
  // attention_decode_combine_kernel does (unrotate_block > 1), else store it as is.
  int unrotate_block;
  float unrotate_scale;
};

constexpr float kNegInf = -__builtin_huge_valf();

__device__ __forceinline__ uint32_t sub_bf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  x = __hsub2(x, y);
  uint32_t r;
  std::memcpy(&r, &x, 4);
  return r;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  std::memcpy(&r, &v, 4);
  return r;
}
// bf16x2 {128 + u_lo, 128 + u_hi} from the nibbles at bits shift and 16 + shift.
__device__ __forceinline__ uint32_t nibbles_plus_128(uint32_t word, int shift) {
  return ptx::lop3<0xea>(word >> shift, kNibbleMask, kBf16Magic);  // (a & b) | c
}
__device__ __forceinline__ float half_to_float(uint32_t word, int half) {
  __half2 h;
  std::memcpy(&h, &word, 4);
  return __half2float(half ? __high2half(h) : __low2half(h));
}
// N 32-bit words from shared memory in one vector load (N = 1, 2 or 4; p aligned to 4 N bytes).
template <int N>
__device__ __forceinline__ void load_words(const unsigned char* p, uint32_t (&w)[N]) {
  if constexpr (N == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (N == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}

template <bool kInt4, int kD>
struct Tile {
  using Geo = Geometry<kInt4, kD>;
  static constexpr int kKSteps = kD / 16;  // k-steps of S
  static constexpr int kNTiles = kD / 8;   // n-tiles of O
  static constexpr int kG = Geo::kGroups;

  // BF16 cache. S (row g, tokens 8 nt + 2t + j of the tile) for the stage at st / st_s; qa from load_q.
  static __device__ __forceinline__ void scores(uint32_t st_s, int lane, const uint32_t (&qa)[kKSteps][2],
                                                float (&s)[2][2]) {
    static_assert(!kInt4, "the INT4 cache runs Int4Tile");
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t w[4];  // chunk 2ks tokens 0-7, 8-15 (reg 0), chunk 2ks + 1 tokens 0-7, 8-15 (reg 1)
      ptx::ldmatrix_x4(w, st_s + ldmatrix_pair_offset<Geo::kRowChunks>(lane, 2 * ks));
      const uint32_t b0[2] = {w[0], w[2]}, b1[2] = {w[1], w[3]};
      ptx::mma_m16n8k16_bf16_rows8(s[0], qa[ks][0], qa[ks][1], b0);
      ptx::mma_m16n8k16_bf16_rows8(s[1], qa[ks][0], qa[ks][1], b1);
    }
  }

  // BF16 cache: o += P·V for the stage; p[r][h] is the probability of token 2t + 8r + h (0 for rows past the
  // sequence, which the copy zero-filled, so p = 0 meets finite values).
  static __device__ __forceinline__ void accumulate(uint32_t st_s, int lane, const float (&p)[2][2],
                                                    float (&o)[kNTiles][2]) {
    const uint32_t a0 = pack_bf16x2(p[0][0], p[0][1]), a2 = pack_bf16x2(p[1][0], p[1][1]);
#pragma unroll
    for (int cp = 0; cp < Geo::kRowChunks; cp += 2) {
      uint32_t w[4];
      ptx::ldmatrix_x4_trans(w, st_s + Geo::kStageCodeBytes + ldmatrix_pair_offset<Geo::kRowChunks>(lane, cp));
      const uint32_t b0[2] = {w[0], w[1]}, b1[2] = {w[2], w[3]};
      ptx::mma_m16n8k16_bf16_rows8(o[cp], a0, a2, b0);
      ptx::mma_m16n8k16_bf16_rows8(o[cp + 1], a0, a2, b1);
    }
  }

  // Q's A fragments (rows 0..7; lanes of rows >= G hold zeros) in the kernel's key channel order.
  static __device__ __forceinline__ void load_q(const __nv_bfloat16* qrow, bool present, int t,
                                                uint32_t (&qa)[kKSteps][2]) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) qa[ks][0] = qa[ks][1] = 0u;
    if (!present) return;
    if constexpr (kInt4) {
#pragma unroll
      for (int gi = 0; gi < kG; ++gi) {
        // Channels 32 gi + 8t .. + 7 as bf16 pairs (c0 c1)(c2 c3)(c4 c5)(c6 c7); k-step 2gi + ks, reg r wants
        // (c[2ks + r], c[2ks + r + 4]).
        const uint4 v = *reinterpret_cast<const uint4*>(qrow + kGroup * gi + 8 * t);
        qa[2 * gi][0] = ptx::prmt(v.x, v.z, 0x5410u);
        qa[2 * gi][1] = ptx::prmt(v.x, v.z, 0x7632u);
        qa[2 * gi + 1][0] = ptx::prmt(v.y, v.w, 0x5410u);
        qa[2 * gi + 1][1] = ptx::prmt(v.y, v.w, 0x7632u);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
          qa[ks][r] = *reinterpret_cast<const uint32_t*>(qrow + key_channel_bf16(ks, t, r, 0));
      }
    }
  }

};

// INT4 cache, transposed products (attention_decode_layout.h): Sᵀ = K·Qᵀ (A = the tile's keys, 16 token rows;
// B = Q, head g in column g) and Oᵀ = Vᵀ·P'ᵀ (A = the values, 16 channel rows per m-tile; B = P', head g in column
// g). Lane (g, t) holds Sᵀ elements (token g + 8 (i >> 1), head 2t + (i & 1)) and Oᵀ elements (channel
// value_channel_t(mt, g, i >> 1), head 2t + (i & 1)).
template <int kD>
struct Int4Tile {
  using Geo = Geometry<true, kD>;
  static constexpr int kKSteps = kD / 16;
  static constexpr int kMTiles = kD / 16;  // m-tiles of Oᵀ: two per group
  static constexpr int kG = Geo::kGroups;

  // Sᵀ for the stage (unscaled: per-group partial products times the key scales, summed in fp32); qb from load_q.
  static __device__ __forceinline__ void scores(const unsigned char* st, uint32_t st_s, int lane,
                                                const uint32_t (&qb)[kKSteps][2], float (&s)[4]) {
    const int g = lane >> 2;
    uint32_t zk[2], sk[2][kG / 2];  // tokens g and g + 8: zero bytes (one per group), scale halves
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tok = g + 8 * r;
      if constexpr (kG == 4) {
        zk[r] = *reinterpret_cast<const uint32_t*>(st + Geo::kStageZeros + tok * kG);
      } else {
        zk[r] = *reinterpret_cast<const uint16_t*>(st + Geo::kStageZeros + tok * kG);
      }
      load_words<kG / 2>(st + Geo::kStageScales + tok * kG * 2, sk[r]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = 0.0f;
#pragma unroll
    for (int cp = 0; cp < kG; cp += 2) {
      uint32_t w[4];  // chunk cp tokens 0-7, 8-15, chunk cp + 1 tokens 0-7, 8-15: lane (g, t) word t of token g (+8)
      ptx::ldmatrix_x4(w, st_s + ldmatrix_pair_offset<Geo::kRowChunks>(lane, cp));
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        const int gi = cp + d;
        const uint32_t zsel = static_cast<uint32_t>(gi | (4 << 4) | (gi << 8) | (4 << 12));
        const uint32_t bias[2] = {ptx::prmt(zk[0], 0x43u, zsel), ptx::prmt(zk[1], 0x43u, zsel)};  // 128 + z
        float acc[4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          const uint32_t a[4] = {sub_bf16x2(nibbles_plus_128(w[2 * d], key_shift_int4(ks, 0)), bias[0]),
                                 sub_bf16x2(nibbles_plus_128(w[2 * d + 1], key_shift_int4(ks, 0)), bias[1]),
                                 sub_bf16x2(nibbles_plus_128(w[2 * d], key_shift_int4(ks, 1)), bias[0]),
                                 sub_bf16x2(nibbles_plus_128(w[2 * d + 1], key_shift_int4(ks, 1)), bias[1])};
          if (ks == 0) {
            ptx::mma_m16n8k16_bf16_zero_c(acc, a, qb[2 * gi]);
          } else {
            ptx::mma_m16n8k16_bf16(acc, a, qb[2 * gi + 1]);
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float scale = half_to_float(sk[i >> 1][gi >> 1], gi & 1);  // token g + 8 (i >> 1), group gi
          s[i] = fmaf(acc[i], scale, s[i]);
        }
      }
    }
  }

  // o += Vᵀ·P'ᵀ for the stage; p[i] is the probability of (token g + 8 (i >> 1), head 2t + (i & 1)), valid[r]
  // whether token g + 8 r exists. kFull: the caller knows every token of the tile exists (valid is all true), so
  // no select is emitted.
  template <bool kFull>
  static __device__ __forceinline__ void accumulate(const unsigned char* st, uint32_t st_s, int lane,
                                                    const float (&p)[4], const bool (&valid)[2],
                                                    float (&o)[kMTiles][4]) {
    const int g = lane >> 2, t = lane & 3;
    uint32_t sv[2][kG / 2], zv[2][2];  // value scale halves of tokens g, g + 8; zero bytes of tokens 2t + 8r, + 1
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      load_words<kG / 2>(st + Geo::kStageScales + Geo::kStageScaleBytes + (g + 8 * r) * kG * 2, sv[r]);
      const unsigned char* zp = st + Geo::kStageZeros + Geo::kStageZeroBytes + (2 * t + 8 * r) * kG;
      if constexpr (kG == 4) {
        const uint2 z = *reinterpret_cast<const uint2*>(zp);
        zv[r][0] = z.x, zv[r][1] = z.y;
      } else {
        zv[r][0] = zv[r][1] = *reinterpret_cast<const uint32_t*>(zp);
      }
    }
#pragma unroll
    for (int cp = 0; cp < kG; cp += 2) {
      uint32_t w[4];  // chunk cp tokens (2t, 2t+1), (2t+8, 2t+9), chunk cp + 1 likewise
      ptx::ldmatrix_x4_trans(w, st_s + Geo::kStageCodeBytes + ldmatrix_pair_offset<Geo::kRowChunks>(lane, cp));
#pragma unroll
      for (int d = 0; d < 2; ++d) {
        const int grp = cp + d;
        uint32_t b[2], bias[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // A missing token's scale may be anything (inf, NaN): its weight is an exact 0, not 0 * s.
          const float sc = half_to_float(sv[r][grp >> 1], grp & 1);
          const bool keep = kFull || valid[r];
          const float p0 = keep ? p[2 * r] * sc : 0.0f, p1 = keep ? p[2 * r + 1] * sc : 0.0f;
          b[r] = ptx::movmatrix_trans(pack_bf16x2(p0, p1));  // (token g + 8r, heads 2t, 2t+1) -> (head g, tokens)
          const uint32_t zsel = static_cast<uint32_t>(grp | ((kG + grp) << 8));
          bias[r] = ptx::lop3<0xea>(ptx::prmt(zv[r][0], zv[r][1], zsel), 0x00ff00ffu, kBf16Magic);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int mt = 2 * grp + j;
          const uint32_t a[4] = {sub_bf16x2(nibbles_plus_128(w[2 * d], value_shift_t(mt, 0)), bias[0]),
                                 sub_bf16x2(nibbles_plus_128(w[2 * d], value_shift_t(mt, 1)), bias[0]),
                                 sub_bf16x2(nibbles_plus_128(w[2 * d + 1], value_shift_t(mt, 0)), bias[1]),
                                 sub_bf16x2(nibbles_plus_128(w[2 * d + 1], value_shift_t(mt, 1)), bias[1])};
          ptx::mma_m16n8k16_bf16(o[mt], a, b);
        }
      }
    }
  }
};

// The attention prologue the decode kernel can run itself (attention_decode_int4_with_prologue): none, or RoPE, the
// cache append of each sequence's new token and the query rotation for an INT4 / INT4_HADAMARD cache.
enum class Prologue { kNone, kInt4, kInt4Hadamard };

// Shared memory of the prologue: the row's RoPE (cos, sin) pairs and the CTA's G rotated query heads (BF16).
struct PrologueSmem {
  float2 cs[fused::kQuadHeadDim / 2];
  __nv_bfloat16 q[kMaxGqa][fused::kQuadHeadDim];
};

// H_block of one head held one channel per thread (thread c of the CTA: channel c % kD, the heads of kN / kD
// consecutive thread groups side by side), block a power of two in 2..kD: rotate_heads_bf16's operations in its order
// (butterfly strides 1, 2, .., block / 2, the pair (j, j + h) becoming (a + b, a − b) with a = x[j], each one IEEE
// operation; then one multiply by scale), so the same bits. Strides below 32 pair lanes of one warp (channel c ^ h is
// lane ^ h); larger ones pair warps through shared memory, one barrier per stage: the two exchange buffers
// alternate, so a stage's writes never meet the previous stage's reads. A stride h < kD keeps c ^ h in c's group,
// and c & h is the channel's bit. block is uniform over the CTA and every thread arrives here (kN threads), so the
// shuffles are full and every thread takes part in every barrier.
template <int kD, int kN = kD>
__device__ __forceinline__ float hadamard_head(float x, int block, float scale, float (&exchange)[2][kN]) {
  static_assert(kN % kD == 0, "whole heads");
  const int c = static_cast<int>(threadIdx.x);
  for (int h = 1; h < block && h < kWarpSize; h *= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, x, h);
    x = (c & h) ? __fsub_rn(other, x) : __fadd_rn(x, other);
  }
  int buf = 0;
  for (int h = kWarpSize; h < block; h *= 2, buf ^= 1) {
    exchange[buf][c] = x;
    __syncthreads();
    const float other = exchange[buf][c ^ h];
    x = (c & h) ? __fsub_rn(other, x) : __fadd_rn(x, other);  // c & h is warp-uniform for h >= 32
  }
  return __fmul_rn(x, scale);
}

// The cluster combine of attention_decode_kernel<.., kCl = true> (see there), called by every thread of every CTA of
// the cluster once each CTA has written its partial O [kMaxGqa][kD] and log2-sum-exp [kMaxGqa] at `buf` (the same
// offset in every CTA); `exchange` holds the un-rotation's two rows of kN floats (CtaShape::kExchangeOffset). CTA
// `split` owns heads split + S i < G (S = args.splits, its cluster size; rank = split, the cluster spanning grid x);
// kN / kD heads a round, thread c on channel c % kD. Per head: attention_decode_combine_kernel
// on the S partials (M = max lse, w_s = 2^(lse_s − M), num = Σ_s w_s o_s by fmaf in split order, den = Σ_s w_s),
// rounded to BF16, then hadamard_head's un-rotation where asked. A last cluster barrier keeps every CTA's partials
// alive until every reader is done.
template <int kD, int kN>
__device__ __forceinline__ void cluster_combine(const DecodeArgs& args, unsigned char* buf, float (&exchange)[2][kN],
                                                int64_t head0, int split, int G) {
  constexpr int kHeadsPerRound = kN / kD;
  static_assert(kHeadsPerRound >= 1 && kN % kD == 0, "whole heads per round");
  const int S = args.splits;
  const uint32_t o_s = ptx::smem_addr(buf), lse_s = o_s + kMaxGqa * kD * 4;
  const int c = static_cast<int>(threadIdx.x) % kD, slot = static_cast<int>(threadIdx.x) / kD;
  const int owned = split < G ? (G - split + S - 1) / S : 0;  // uniform over the CTA
  const bool unrotate = args.unrotate_block > 1;
  ptx::cluster_sync();  // every CTA's partials written (release) and visible here (acquire)
  for (int round = 0; round * kHeadsPerRound < owned; ++round) {
    // A round's exchange writes after every read of the round before: with one exchange stage (block 2 · kWarpSize)
    // both rounds use the same row.
    if (round > 0 && unrotate) __syncthreads();
    const int i = round * kHeadsPerRound + slot;
    const bool active = i < owned;
    const int h = split + S * i;
    float v = 0.0f;
    if (active) {
      float lse[kMaxClusterCombineSplits], o[kMaxClusterCombineSplits];
#pragma unroll
      for (int s = 0; s < kMaxClusterCombineSplits; ++s) {  // all loads first: their latencies overlap
        if (s < S) {
          const uint32_t r = static_cast<uint32_t>(s);
          lse[s] = ptx::ld_shared_cluster_f32(ptx::map_shared_rank(lse_s + static_cast<uint32_t>(h * 4), r));
          o[s] = ptx::ld_shared_cluster_f32(ptx::map_shared_rank(o_s + static_cast<uint32_t>((h * kD + c) * 4), r));
        }
      }
      float mx = kNegInf;
#pragma unroll
      for (int s = 0; s < kMaxClusterCombineSplits; ++s)
        if (s < S) mx = fmaxf(mx, lse[s]);
      float num = 0.0f, den = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxClusterCombineSplits; ++s) {
        if (s < S) {
          const float w = mx == kNegInf ? 0.0f : ptx::ex2_approx(lse[s] - mx);
          num = fmaf(w, o[s], num);
          den += w;
        }
      }
      v = __bfloat162float(__float2bfloat16_rn(den > 0.0f ? num / den : 0.0f));
    }
    // A BF16 widens to fp32 exactly: the un-rotation starts from the bits the combine kernel would have stored.
    if (unrotate) v = hadamard_head<kD, kN>(v, args.unrotate_block, args.unrotate_scale, exchange);
    if (active) args.out[(head0 + h) * kD + c] = __float2bfloat16_rn(v);
  }
  ptx::cluster_sync();  // no CTA leaves (freeing its shared memory) while another may still read it
}

// One CTA per (split, KV head, sequence b): grid (splits, n_kv_heads, batch).
// kP != kNone (the fused prologue; INT4 cache, head_dim 128): q is not read from args.q. Instead the CTA reads row b of
// pro.qkv (the QKV projection of sequence b's new token, BF16) and, quad by quad with fused_ops.cuh's functions (so
// the same bits as kv_append_rotate_q_quad_kernel<F, true>):
//  - RoPEs and rotates its G query heads into shared memory (every split does this: it is 4 heads);
//  - in the one split whose tiles hold the sequence's last token (seq_lens[b] - 1, the token this step appends), RoPEs
//    the KV head's key and encodes key and value into their cache slot (pro.row_page[b], pro.row_slot[b]), before any
//    lane copies that tile.
// The RoPE'd q and k are not written back into qkv and no q_out is written. Cache tiles that do not hold the new token
// are copied before griddepcontrol.wait, and the key anchor prefetched into L1 (in a decode step no kernel writes
// either), so their latency overlaps the kernel before (the QKV GEMM).
//
// kCl (kP == kNone; launched with cluster dims (splits, 1, 1), 2 <= splits <= 16): the splits of one (KV head, b) are
// one cluster, and instead of partials in global memory for attention_decode_combine_kernel each CTA leaves its
// normalised partial O and log2-sum-exp in its shared memory; after a cluster barrier, CTA `split` combines heads
// split, split + splits, .. < G of the group, reading every CTA's partials through distributed shared memory with
// the combine kernel's operations in its order (and its un-rotation, args.unrotate_block > 1): the same bits in
// args.out, one kernel and two L2 round trips fewer.
template <bool kInt4, int kD, Prologue kP = Prologue::kNone, int kW = kWarps, bool kCl = false>
__global__ void __launch_bounds__(CtaShape<kInt4, kD, kW>::kThreadsPerCta, (CtaShape<kInt4, kD, kW>::kMinCtasPerSm))
    attention_decode_kernel(const DecodeArgs args, const fused::QkvArgs pro) {
  using Geo = Geometry<kInt4, kD>;
  using Cta = CtaShape<kInt4, kD, kW>;
  constexpr int kCtaThreads = Cta::kThreadsPerCta;
  using T = Tile<kInt4, kD>;
  constexpr bool kPro = kP != Prologue::kNone;
  constexpr formats::KvFormat kFormat =
      kP == Prologue::kInt4Hadamard ? formats::KvFormat::INT4_HADAMARD : formats::KvFormat::INT4;
  static_assert(!kPro || (kInt4 && kD == fused::kQuadHeadDim), "the fused prologue is the quad path's: INT4, hd 128");
  static_assert(!(kPro && kCl), "the cluster combine comes without the fused prologue");
  static_assert(kMaxGqa <= kWarpSize / 4 && kW >= 3, "warp 0's quads hold the query heads; warps 1, 2 k and v");
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) unsigned char pro_smem[kPro ? sizeof(PrologueSmem) : 16];
  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int G = args.gqa;
  // seq_lens is an input no kernel of the pass writes (uploaded before it, like the block table): read before the
  // wait, so its latency overlaps the previous kernel under programmatic launch.
  const int len = max(0, min(args.seq_lens[b], args.max_pages * kPageTokens));
  const Range tiles = split_range(tiles_for(len), args.splits, split);
  const int first = tiles.begin + warp;  // this warp's tiles: first, first + kW, ...
  const int n_mine = first < tiles.end ? (tiles.end - first + kW - 1) / kW : 0;

  // Tiles in flight ahead of the one being read. The 8-warp INT4 loop is software-pipelined (tile k + 1's scores are
  // computed beside tile k's value products), so it holds two stages at once and issues one tile less ahead. The
  // 4-warp instances keep one tile at a time: the pipeline raised their registers (130 -> 168 at head_dim 128) and
  // made the 8B batch-1 step 1.5-2 % slower (docs/results.md, twenty-fourth session); the 8-warp instances are capped
  // at 128 registers either way.
  constexpr bool kPipelined = kInt4 && kW == 8;
  constexpr int kAhead = kPipelined ? Geo::kStages - 2 : Geo::kStages - 1;
  static_assert(kAhead >= 2, "a ring of at least kAhead + 2 stages");
  unsigned char* ring = smem + warp * Geo::kStages * Geo::kStageBytes;
  const uint32_t ring_s = ptx::smem_addr(ring);
  const int32_t* bt = args.block_table + int64_t{b} * args.max_pages;
  // INT4: the lane's copy offsets are computed once (Int4Copies): per tile only the page, the slot and the stage move.
  using Copies = Int4Copies<kInt4 ? kD : 128>;  // (the BF16 instances copy chunk by chunk and never use it)
  const bool has_meta = kInt4 && lane < Copies::kMetaChunks;
  int meta_src = 0, meta_dst = 0, meta_slot_mul = 0;
  if constexpr (kInt4) {
    if (has_meta) {
      const int meta_chunk = 2 * Geo::kCodeChunksPerPart + lane;
      const ChunkCopy c0 = stage_chunk<kInt4, kD>(meta_chunk, 0), c1 = stage_chunk<kInt4, kD>(meta_chunk, 1);
      meta_src = c0.src, meta_dst = c0.dst, meta_slot_mul = c1.src - c0.src;
    }
  }
  // The page id of this warp's tile k (the block table is a pass input no kernel writes).
  auto page_of = [&](int k) { return __ldg(bt + static_cast<unsigned>(first + k * kW) / kTilesPerPage); };
  // Tile k of this warp, on page page_id, into ring stage `stage` (= k % kStages).
  auto issue_at = [&](int k, int stage, int page_id) {
    const unsigned tile = static_cast<unsigned>(first + k * kW);
    const uint8_t* page = args.pool + (int64_t{page_id} * args.n_kv_heads + kvh) * Geo::kPageBytes;
    const int slot0 = static_cast<int>(tile % kTilesPerPage) * kTile;
    const uint32_t dst = ring_s + static_cast<uint32_t>(stage * Geo::kStageBytes);
    if constexpr (kInt4) {
      const uint8_t* src = page + Copies::code_src(lane, 0, slot0);
      const uint32_t cdst = dst + static_cast<uint32_t>(Copies::code_dst(lane, 0));
#pragma unroll
      for (int i = 0; i < Copies::kCodeCopies; ++i)  // constant offsets from copy 0's
        ptx::cp_async_16(cdst + (Copies::code_dst(0, i) - Copies::code_dst(0, 0)),
                         src + (Copies::code_src(0, i, 0) - Copies::code_src(0, 0, 0)));
      if (has_meta) ptx::cp_async_16(dst + meta_dst, page + meta_src + slot0 * meta_slot_mul);
    } else {
#pragma unroll
      for (int i = 0; i < (Geo::kStageChunks + kWarpSize - 1) / kWarpSize; ++i) {
        const int c = lane + i * kWarpSize;
        if (Geo::kStageChunks % kWarpSize != 0 && c >= Geo::kStageChunks) break;
        const ChunkCopy cc = stage_chunk<kInt4, kD>(c, slot0);
        ptx::cp_async_16_zfill(dst + cc.dst, page + cc.src, static_cast<int>(tile) * kTile + cc.row < len);
      }
    }
  };
  auto issue = [&](int k, int stage) { issue_at(k, stage, page_of(k)); };

  const int64_t head0 = int64_t{b} * args.n_heads + int64_t{kvh} * G;  // the CTA's first query head
  uint32_t qa[T::kKSteps][2];
  // Early copies (the prologue instances, or args.prefetch_early): every cache tile but the one holding the sequence's
  // new token (seq_lens[b] - 1) is copied before the wait; deferred is this warp's k of that tile when it is among
  // the first stages (issued after the wait, or after the prologue appended it).
  const bool early = kPro || args.prefetch_early;
  const int new_tile = tiles_for(len) - 1;  // -1 for an empty (padding) sequence
  int deferred = -1;
  // The page ids of the warp's first kAhead + 1 tiles, loaded together: one block-table round trip before the first
  // copies instead of one per tile (tile k + 1's load waited for tile k's copies to be issued). Entry kAhead is the
  // main loop's first fill_page. Loaded before the wait only where the caller promised early copies (the public
  // header: otherwise the block table is read after it).
  int first_pages[kAhead + 1];
  auto load_first_pages = [&] {
#pragma unroll
    for (int k = 0; k <= kAhead; ++k) first_pages[k] = k < n_mine ? page_of(k) : 0;
  };
  if (early) {
    load_first_pages();
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      if (k < n_mine) {
        if (first + k * kW == new_tile) {
          deferred = k;
        } else {
          issue_at(k, k, first_pages[k]);
        }
      }
      ptx::cp_async_commit_group();
    }
  }
  if constexpr (kPro) {
    PrologueSmem& ps = *reinterpret_cast<PrologueSmem*>(pro_smem);
    const bool owner = new_tile >= tiles.begin && new_tile < tiles.end;
    // Before the wait: the position's RoPE table and the append's destination (pass inputs no kernel writes).
    if (static_cast<int>(threadIdx.x) < fused::kQuadHeadDim / 2)
      ps.cs[threadIdx.x] = ops::rope_cos_sin(static_cast<double>(pro.positions[b]), pro.inv_freq[threadIdx.x]);
    fused::QkvRowMeta meta{-1, -1, -1};
    if (owner) meta = fused::qkv_row_meta<kFormat>(pro, b);
    if constexpr (kFormat == formats::KvFormat::INT4_HADAMARD) {
      // The key's anchor row (fp16, 256 bytes; finish_quad_item reads lane t's 64 after the wait) into L1.
      if (owner && warp == 1 && lane < 4 && meta.anchor >= 0)
        ptx::prefetch_l1(pro.key_anchors + (int64_t{meta.anchor} * pro.n_kv_heads + kvh) * fused::kQuadHeadDim +
                         fused::kQuadPerLane * lane);
    }
    ptx::griddepcontrol_wait();
    ptx::griddepcontrol_launch_dependents();
    __syncthreads();  // the RoPE table
    // Warp 0's quads take the G query heads, warp 1's first quad the key, warp 2's the value (owner only): the three
    // kinds of work run side by side instead of one after another in one diverged warp.
    const int quad = lane >> 2;
    const unsigned quad_mask = 0xFu << (lane & 28);
    const bool is_q = warp == 0 && quad < G;
    if (is_q || (owner && (warp == 1 || warp == 2) && quad == 0)) {  // quad-uniform
      const int item = is_q ? kvh * G + quad : args.n_heads + (warp - 1) * args.n_kv_heads + kvh;
      float x[fused::kQuadPerLane];
      fused::load_quad_head(pro.qkv + int64_t{b} * pro.row_width + int64_t{item} * fused::kQuadHeadDim, t, x);
      if (warp <= 1) {  // q and k heads
        uint32_t bits[fused::kQuadPerLane / 2];
        fused::rope_quad(x, ps.cs, t, quad_mask, bits);
      }
      if (is_q) {
        fused::rotate_store_q_quad(pro, x, t, quad_mask, ps.q[quad]);
      } else {
        fused::finish_quad_item<kFormat>(pro, x, b, item, meta, t, quad_mask);
      }
    }
    __syncthreads();  // the rotated q heads; the new token's cache slot, before its tile is copied
    T::load_q(ps.q[g], g < G, t, qa);
  } else {
    // q and the cache come from the kernels before: wait for them before reading either (a no-op without the
    // programmatic launch attribute).
    ptx::griddepcontrol_wait();
    // The combine kernel waits for this grid's completion itself; letting it launch now hides its launch latency.
    ptx::griddepcontrol_launch_dependents();
    T::load_q(args.q + (head0 + g) * kD, g < G, t, qa);
  }
  if (early) {
    if (deferred >= 0) issue(deferred, deferred);
    ptx::cp_async_commit_group();  // every thread: the main loop's wait count stays uniform
  } else {
    load_first_pages();
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      if (k < n_mine) issue_at(k, k, first_pages[k]);
      ptx::cp_async_commit_group();  // empty groups keep the wait count below uniform
    }
  }

  // The ring: tile k sits in stage k % kStages; `stage` follows the tile being read, `fill` the one being issued.
  // The page id of the next tile to issue is loaded one iteration ahead, so its latency never stalls the loop.
  int stage = 0, fill = kAhead;
  int fill_page = first_pages[kAhead];
  auto next_stage = [](int x) { return x + 1 == Geo::kStages ? 0 : x + 1; };
  // Tile k + kAhead goes into the stage of tile k + kAhead - kStages (tile k - 1 for BF16, k - 2 for INT4), which the
  // warp finished before this call.
  auto wait_tile = [&](int k) {
    if (k + kAhead < n_mine) issue_at(k + kAhead, fill, fill_page);
    if (k + kAhead + 1 < n_mine) fill_page = page_of(k + kAhead + 1);
    fill = next_stage(fill);
    ptx::cp_async_commit_group();
    if (k == deferred) {
      ptx::cp_async_wait_group<0>();  // the deferred tile went into a later group (it is the warp's last tile)
    } else {
      ptx::cp_async_wait_group<kAhead>();  // this lane's chunks of tile k have landed
    }
    __syncwarp();  // ... and every other lane's
  };
  float* red_o = reinterpret_cast<float*>(smem);  // merge buffers, overlaying the rings once every warp is done
  float* red_m = red_o + kW * kMaxGqa * kD;
  float* red_l = red_m + kW * kMaxGqa;
  if constexpr (kInt4) {
    using I = Int4Tile<kD>;
    // Lane (g, t) keeps the state of heads 2t and 2t + 1 (j = 0, 1); m is the same on the 8 lanes of a t, l is this
    // lane's part of the sum (its tokens g, g + 8 of each tile).
    float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
    float o[I::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < I::kMTiles; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    // The online softmax of one tile from its scores sc (Sᵀ, unscaled), o rescaled; p and valid for accumulate.
    // kFull: all 16 of the tile's tokens exist (every tile but a sequence's last partial one), so the masks compile
    // away: the same arithmetic on the same values either way, so the same bits.
    auto softmax_step = [&](float (&sc)[4], int tok0, auto full, float (&p)[4], bool (&valid)[2]) {
      constexpr bool kFull = decltype(full)::value;
      valid[0] = kFull || tok0 + g < len;
      valid[1] = kFull || tok0 + g + 8 < len;
      float tmax[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) sc[i] = valid[i >> 1] ? sc[i] * args.score_scale : kNegInf;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        tmax[j] = fmaxf(sc[j], sc[2 + j]);
#pragma unroll
        for (int x = 4; x < kWarpSize; x *= 2) tmax[j] = fmaxf(tmax[j], __shfl_xor_sync(0xffffffffu, tmax[j], x));
      }
      float alpha[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float m_new = fmaxf(m[j], tmax[j]);
        alpha[j] = ptx::ex2_approx(m[j] - m_new);  // 0 on the first tile (m = -inf)
        p[j] = ptx::ex2_approx(sc[j] - m_new);
        p[2 + j] = ptx::ex2_approx(sc[2 + j] - m_new);
        l[j] = fmaf(l[j], alpha[j], p[j] + p[2 + j]);
        m[j] = m_new;
      }
      // Once the running maxima settle, most tiles leave every alpha at exactly 1 (ex2 of 0): skipping the
      // multiplications then changes no bit.
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int mt = 0; mt < I::kMTiles; ++mt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) o[mt][i] *= alpha[i & 1];
        }
      }
    };
    auto stage_ptr = [&](int st) { return ring + st * Geo::kStageBytes; };
    auto stage_s = [&](int st) { return ring_s + static_cast<uint32_t>(st * Geo::kStageBytes); };
    auto tok0_of = [&](int k) { return (first + k * kW) * kTile; };
    // One tile at a time (the 4-warp instances).
    if constexpr (!kPipelined) {
      for (int k = 0; k < n_mine; ++k) {
        wait_tile(k);
        float sc[4], p[4];
        bool valid[2];
        I::scores(stage_ptr(stage), stage_s(stage), lane, qa, sc);
        softmax_step(sc, tok0_of(k), std::false_type{}, p, valid);
        I::template accumulate<false>(stage_ptr(stage), stage_s(stage), lane, p, valid, o);
        __syncwarp();  // every lane is done with this stage before a later issue overwrites it
        stage = next_stage(stage);
      }
    } else {
      // Software pipeline: tile k's softmax, then tile k + 1's scores beside tile k's value products (independent
      // chains in one basic block, so their latencies overlap), per tile the same operations in the same order as
      // one tile at a time. Only a sequence's last tile can be partial, and it is its warp's last tile, so every tile
      // with a successor is full.
      float s_cur[4];
      if (n_mine > 0) {
        wait_tile(0);
        I::scores(stage_ptr(stage), stage_s(stage), lane, qa, s_cur);
      }
      for (int k = 0; k + 1 < n_mine; ++k) {
        float p[4];
        bool valid[2];
        softmax_step(s_cur, tok0_of(k), std::true_type{}, p, valid);
        wait_tile(k + 1);
        const int nst = next_stage(stage);
        float s_next[4];
        I::scores(stage_ptr(nst), stage_s(nst), lane, qa, s_next);
        I::template accumulate<true>(stage_ptr(stage), stage_s(stage), lane, p, valid, o);
        __syncwarp();  // every lane is done with this stage before a later issue overwrites it
#pragma unroll
        for (int i = 0; i < 4; ++i) s_cur[i] = s_next[i];
        stage = nst;
      }
      if (n_mine > 0) {  // the warp's last tile
        const int k = n_mine - 1;
        float p[4];
        bool valid[2];
        if (tok0_of(k) + kTile <= len) {  // warp-uniform
          softmax_step(s_cur, tok0_of(k), std::true_type{}, p, valid);
          I::template accumulate<true>(stage_ptr(stage), stage_s(stage), lane, p, valid, o);
        } else {
          softmax_step(s_cur, tok0_of(k), std::false_type{}, p, valid);
          I::template accumulate<false>(stage_ptr(stage), stage_s(stage), lane, p, valid, o);
        }
      }
    }
    ptx::cp_async_wait_group<0>();  // only empty groups can be left; leave none behind
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int x = 4; x < kWarpSize; x *= 2) l[j] += __shfl_xor_sync(0xffffffffu, l[j], x);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = 2 * t + j;
      if (h < G) {
        if (g == 0) red_m[warp * kMaxGqa + h] = m[j], red_l[warp * kMaxGqa + h] = l[j];
#pragma unroll
        for (int mt = 0; mt < I::kMTiles; ++mt) {
#pragma unroll
          for (int hi = 0; hi < 2; ++hi)
            red_o[(warp * kMaxGqa + h) * kD + value_channel_t(mt, g, hi)] = o[mt][2 * hi + j];
        }
      }
    }
  } else {
    float m = kNegInf, l = 0.0f;
    float o[T::kNTiles][2];  // row g, columns 2t, 2t + 1 of each n-tile
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt) o[nt][0] = o[nt][1] = 0.0f;
    for (int k = 0; k < n_mine; ++k) {
      wait_tile(k);
      const uint32_t st_s = ring_s + static_cast<uint32_t>(stage * Geo::kStageBytes);
      const int tok0 = (first + k * kW) * kTile;
      float s[2][2];
      T::scores(st_s, lane, qa, s);
      // Online softmax of row g over the tile's tokens (every processed tile holds at least one valid token).
      float tmax = kNegInf;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          s[nt][j] = tok0 + score_token(t, nt, j) < len ? s[nt][j] * args.score_scale : kNegInf;
          tmax = fmaxf(tmax, s[nt][j]);
        }
      }
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
      const float m_new = fmaxf(m, tmax);
      const float alpha = ptx::ex2_approx(m - m_new);  // 0 on the first tile (m = -inf)
      float p[2][2], psum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          p[nt][j] = ptx::ex2_approx(s[nt][j] - m_new);
          psum += p[nt][j];
        }
      }
      l = fmaf(l, alpha, psum);
      m = m_new;
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt) o[nt][0] *= alpha, o[nt][1] *= alpha;
      T::accumulate(st_s, lane, p, o);
      __syncwarp();  // every lane is done with this stage before a later issue overwrites it
      stage = next_stage(stage);
    }
    ptx::cp_async_wait_group<0>();  // only empty groups can be left; leave none behind

    // Merge the warps: O [warp][head][channel], m and l per (warp, head).
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    __syncthreads();
    if (g < G) {
      if (t == 0) red_m[warp * kMaxGqa + g] = m, red_l[warp * kMaxGqa + g] = l;
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) red_o[(warp * kMaxGqa + g) * kD + value_channel_bf16(nt, 2 * t + j)] = o[nt][j];
      }
    }
  }
  __syncthreads();
  // The warps' states of head h merged at channel c: num / den over the warps, mx their largest m (-inf when the split
  // holds no token).
  auto merge = [&](int h, int c, float& mx, float& den) {
    mx = kNegInf;
#pragma unroll
    for (int w = 0; w < kW; ++w) mx = fmaxf(mx, red_m[w * kMaxGqa + h]);
    float num = 0.0f;
    den = 0.0f;
    if (mx != kNegInf) {  // otherwise the split holds no token (or the sequence is empty)
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        const float wt = ptx::ex2_approx(red_m[w * kMaxGqa + h] - mx);  // 0 for a warp without tiles
        num = fmaf(wt, red_o[(w * kMaxGqa + h) * kD + c], num);
        den = fmaf(wt, red_l[w * kMaxGqa + h], den);
      }
    }
    return den > 0.0f ? num / den : 0.0f;
  };
  // The un-rotation's exchange rows (CtaShape::kExchangeOffset), used by the unsplit store below and the cluster combine.
  float(&exchange)[2][kCtaThreads] = *reinterpret_cast<float(*)[2][kCtaThreads]>(smem + Cta::kExchangeOffset);
  // Uniform over the CTA: an unsplit int4-hadamard plan stores un-rotated heads, every other plan the merged values.
  const bool unrotate_here = kInt4 && args.splits == 1 && args.unrotate_block > 1;
  if constexpr (kInt4) {
    if (unrotate_here) {
      // Unsplit int4-hadamard output un-rotated here (attention_decode_int4_unrotated): each head rounded to BF16 as
      // the plain store would, widened (exact), then hadamard_head — rotate_heads_bf16's operations in its order, so
      // the same bits as that kernel run afterwards. kCtaThreads / kD heads a round, thread c on channel c % kD; every
      // thread takes part in every round (the butterflies' shuffles and barriers). The exchange rows sit after the
      // merge buffers (the cluster combine's, unused by an unsplit CTA); a barrier between rounds keeps a round's
      // exchange writes after every read of the round before (one exchange stage reuses the same row each round).
      constexpr int kHeadsPerRound = kCtaThreads / kD;
      static_assert(kHeadsPerRound >= 1 && kCtaThreads % kD == 0, "whole heads per round");
      const int c = static_cast<int>(threadIdx.x) % kD, slot = static_cast<int>(threadIdx.x) / kD;
      for (int round = 0; round * kHeadsPerRound < G; ++round) {
        if (round > 0) __syncthreads();
        const int h = round * kHeadsPerRound + slot;
        float v = 0.0f;
        if (h < G) {
          float mx, den;
          v = __bfloat162float(__float2bfloat16_rn(merge(h, c, mx, den)));
        }
        v = hadamard_head<kD, kCtaThreads>(v, args.unrotate_block, args.unrotate_scale, exchange);
        if (h < G) args.out[(head0 + h) * kD + c] = __float2bfloat16_rn(v);
      }
    }
  }
  for (int idx = threadIdx.x; !unrotate_here && idx < G * kD; idx += kCtaThreads) {
    const int h = idx / kD, c = idx % kD;
    float mx, den;
    const float val = merge(h, c, mx, den);
    if (args.splits == 1) {
      args.out[(head0 + h) * kD + c] = __float2bfloat16_rn(val);
    } else if constexpr (kCl) {
      float* cl_o = reinterpret_cast<float*>(smem + Cta::kMergeBytes);
      cl_o[h * kD + c] = val;
      if (c == 0) cl_o[kMaxGqa * kD + h] = den > 0.0f ? mx + log2f(den) : kNegInf;
    } else {
      const int64_t row = (head0 + h) * args.splits + split;
      args.partial_o[row * kD + c] = val;
      if (c == 0) args.partial_lse[row] = den > 0.0f ? mx + log2f(den) : kNegInf;
    }
  }
  if constexpr (kCl) {
    if (args.splits > 1) cluster_combine<kD, kCtaThreads>(args, smem + Cta::kMergeBytes, exchange, head0, split, G);
  }
}

// out[bh, :] = Σ_s 2^(lse_s − M) o_s / Σ_s 2^(lse_s − M), in split order; one CTA of kD threads per (b, head).
// kUnrotate: the BF16-rounded head is then un-rotated (hadamard_head with unrotate_block / unrotate_scale) and
// rounded again, exactly what rotate_heads_bf16 would store after this kernel; the plain instance ignores both.
template <int kD, bool kUnrotate>
__global__ void __launch_bounds__(kD)
    attention_decode_combine_kernel(const float* __restrict__ partial_o, const float* __restrict__ partial_lse,
                                    __nv_bfloat16* __restrict__ out, int splits, int unrotate_block,
                                    float unrotate_scale) {
  static_assert(kMaxSplits <= kD, "one thread per split weight");
  static_assert(kD % kWarpSize == 0, "whole warps: the un-rotation's shuffles are full-warp");
  // The o GEMM behind it may launch now and prefetch its weights while this grid waits for the decode kernel (it
  // waits for this grid's completion itself; ops::pdl_release_then_wait says why releasing first is safe).
  ptx::griddepcontrol_launch_dependents();
  // Launched as a programmatic dependent of the decode kernel: wait until its partials are complete and visible.
  ptx::griddepcontrol_wait();
  __shared__ float weight[kMaxSplits];
  const int64_t bh = blockIdx.x;
  const float* lse = partial_lse + bh * splits;
  float mx = kNegInf;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, lse[s]);
  if (static_cast<int>(threadIdx.x) < splits)
    weight[threadIdx.x] = mx == kNegInf ? 0.0f : ptx::ex2_approx(lse[threadIdx.x] - mx);
  __syncthreads();
  float num = 0.0f, den = 0.0f;
  for (int s = 0; s < splits; ++s) {
    num = fmaf(weight[s], partial_o[(bh * splits + s) * kD + threadIdx.x], num);
    den += weight[s];
  }
  const __nv_bfloat16 v = __float2bfloat16_rn(den > 0.0f ? num / den : 0.0f);
  if constexpr (kUnrotate) {
    __shared__ float exchange[2][kD];
    // A BF16 widens to fp32 exactly: the un-rotation starts from the bits the plain kernel would have stored.
    out[bh * kD + threadIdx.x] =
        __float2bfloat16_rn(hadamard_head<kD>(__bfloat162float(v), unrotate_block, unrotate_scale, exchange));
  } else {
    out[bh * kD + threadIdx.x] = v;
  }
}

}  // namespace futransformer::cuda::attn
