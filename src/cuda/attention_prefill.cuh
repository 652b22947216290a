// Prefill attention over the paged KV cache on Hopper (FlashAttention-2 style, mma.sync): many query rows per
// chunk, causal, GQA. Index maps and shared-memory layout: src/cuda/attention_prefill_layout.h; design notes:
// docs/kernels.md ("Prefill attention").
//
// - A CTA (4 warps) owns 64 query vectors (row, query head) of one chunk and one KV head: all G heads of the KV head,
//   so each cache page is read once per CTA. Each warp owns 16 vectors (the A rows of its mma) and keeps their
//   online-softmax state (running max m, sum l, unnormalised O in fp32) in registers.
// - Key blocks are pages (64 tokens). The CTA walks them in order with a cp.async double buffer: while block j is
//   computed, page j + 1 is in flight. BF16 pages land directly as the BF16 block (rows past the tile's last key are
//   zero-filled by the copy); INT4 pages land raw and all 128 threads dequantise them once per CTA into shared memory
//   as the exact integers u − z in BF16 plus fp32 scales, shared by the 4 warps.
// - S = Q·Kᵀ and O += P·V are mma.m16n8k16 (bf16 in, fp32 accumulate). INT4: per 32-channel group, the integer
//   products are summed exactly in fp32 accumulators and multiplied by the key scale of their token (the S column);
//   the value scale of (token, group) is folded into P, which is rounded once to BF16 per group. Causal masking
//   is applied only in the blocks that reach past a warp's first position; 16-token parts of a block beyond a warp's
//   last position are skipped.
// - No atomics, no split of the keys: each output element is written once by one lane, in a fixed order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda/attention_prefill_layout.h"
#include "cuda/ptx/bits.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/math.cuh"
#include "cuda/ptx/mma.cuh"

namespace futransformer::cuda::prefill {

struct PrefillArgs {
  const __nv_bfloat16* q;          // [rows, n_heads, D]
  const uint8_t* pool;             // page of (page_id, kv_head) at (page_id * n_kv_heads + kv_head) * page_bytes
  const int32_t* block_table;      // [n_chunks, max_pages]
  const int32_t* chunk_first_row;  // [n_chunks + 1]
  const int32_t* chunk_start_pos;  // [n_chunks]
  __nv_bfloat16* out;              // [rows, n_heads, D]
  int rows, n_heads, n_kv_heads, gqa, max_pages, max_chunk_rows;
  float score_scale;  // log2(e) / sqrt(D): scores go straight to the exp2 domain
  // Un-rotating instances only (attention_prefill_int4_unrotated): the Hadamard block (a power of two in 2..D) and
  // rotate_heads_bf16's scale for it.
  int unrotate_block;
  float unrotate_scale;
  // wgmma kernel only: the two consumer warpgroups take turns issuing their wgmmas (FlashAttention-3's ping-pong:
  // one issues while the other runs its softmax). 0: they issue freely.
  int pingpong;
};

constexpr float kNegInf = -__builtin_huge_valf();
constexpr uint32_t kBf16Magic = 0x43004300u;  // bf16x2 {128, 128}: 0x4300 | u is exactly 128 + u for u < 128
constexpr uint32_t kNibbleMask = 0x000f000fu;

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  std::memcpy(&r, &v, 4);
  return r;
}
__device__ __forceinline__ uint32_t sub_bf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  x = __hsub2(x, y);
  uint32_t r;
  std::memcpy(&r, &x, 4);
  return r;
}

// The online softmax's max step for a lane's two A rows (g, g + 8), shared by both prefill kernels: bmax (the
// lane's maxima over its columns of the block) becomes the row's block maximum across its 4 lanes, m the new running
// maximum, m_use the value the exponents subtract and alpha = 2^(m_old − m_use), the factor the running sum and O
// take. Key 0 is visible to every row, so m is finite from block 0 on; the guard keeps a row with no visible key at
// p = 0 instead of NaN; alpha is 0 on the first block (m = −inf).
__device__ __forceinline__ void online_max_update(float (&bmax)[2], float (&m)[2], float (&m_use)[2],
                                                  float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 1));
    bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 2));
    const float m_new = fmaxf(m[r], bmax[r]);
    m_use[r] = m_new == kNegInf ? 0.0f : m_new;
    alpha[r] = ptx::ex2_approx(m[r] - m_use[r]);
    m[r] = m_new;
  }
}

template <bool kInt4, int kD>
struct Block {
  using L = Layout<kInt4, kD>;
  static constexpr int kKSteps = kD / 16;  // k-steps of S
  static constexpr int kNTiles = kD / 8;   // n-tiles of O

  // Copies page `page` into stage `dst` (shared-window address). BF16: the K and V rows go to their swizzled place in
  // the block, and rows at or past `valid` tokens are zero-filled without reading them (their bytes may be anything:
  // a zero key and a zero value keep the masked products finite). INT4: the page's bytes as they are.
  static __device__ __forceinline__ void issue(uint32_t dst, const uint8_t* page, int valid) {
    if constexpr (kInt4) {
      for (int i = threadIdx.x; i < L::kRawPageChunks; i += kThreads) ptx::cp_async_16(dst + i * kChunk, page + i * kChunk);
    } else {
      constexpr int kPartChunks = kBlockTokens * L::kRowChunks;
#pragma unroll
      for (int k = 0; k < 2 * kPartChunks / kThreads; ++k) {
        const int i = threadIdx.x + k * kThreads;
        const int part = i / kPartChunks, row = (i % kPartChunks) / L::kRowChunks, col = i % L::kRowChunks;
        ptx::cp_async_16_zfill(dst + part * L::kPartBytes + block_chunk_offset(L::kRowChunks, row, col),
                               page + part * L::kPartBytes + row * L::kRowBytes + col * kChunk, row < valid);
      }
    }
  }

  // INT4: the raw page at `raw` -> the block at `blk`: codes as bf16 (u − z), exactly; scales as fp32. Tokens at or
  // past `valid` get zero codes and zero scales (their page bytes may be anything), so their products are exact
  // zeros and P' = p · 0 = 0.
  static __device__ __forceinline__ void dequantise(const unsigned char* raw, unsigned char* blk, int valid) {
    using Page = typename L::Page;
    constexpr int kPartWords = kBlockTokens * L::kCodeWords;
#pragma unroll 4
    for (int i = threadIdx.x; i < 2 * kPartWords; i += kThreads) {
      const int part = i / kPartWords, row = (i % kPartWords) / L::kCodeWords, w = i % L::kCodeWords;
      const unsigned char* src = raw + part * Page::kPagePartBytes;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (row < valid) {
        const uint32_t code = *reinterpret_cast<const uint32_t*>(src + row * L::kCodeRowBytes + 4 * w);
        const uint32_t z = src[Page::kPageCodeBytes + Page::kPageScaleBytes + row * L::kGroups + w / 4];
        const uint32_t bias = (z * 0x00010001u) | kBf16Magic;  // bf16x2 {128 + z, 128 + z}
        const uint32_t hi = code >> 4;
        uint32_t o[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          // {128 + u(2j), 128 + u(2j + 1)} − {128 + z, 128 + z}: exact small integers in bf16.
          o[j] = sub_bf16x2(ptx::lop3<0xea>(ptx::prmt(code, hi, dequant_selector(j)), kNibbleMask, kBf16Magic), bias);
        }
        v = make_uint4(o[0], o[1], o[2], o[3]);
      }
      *reinterpret_cast<uint4*>(blk + part * L::kPartBytes + block_chunk_offset(L::kRowChunks, row, w)) = v;
    }
    float* scales = reinterpret_cast<float*>(blk + 2 * L::kPartBytes);  // [part][group][token]
    for (int i = threadIdx.x; i < 2 * kBlockTokens * L::kGroups; i += kThreads) {
      const int part = i / (kBlockTokens * L::kGroups), rem = i % (kBlockTokens * L::kGroups);
      const int row = rem / L::kGroups, gi = rem % L::kGroups;
      float s = 0.0f;
      if (row < valid) {
        __half h;
        std::memcpy(&h, raw + part * Page::kPagePartBytes + Page::kPageCodeBytes + (row * L::kGroups + gi) * 2, 2);
        s = __half2float(h);
      }
      scales[(part * L::kGroups + gi) * kBlockTokens + row] = s;
    }
  }

  // S (unscaled) for the token pairs p < n_pairs of the block at blk / blk_s; qa from the caller.
  static __device__ __forceinline__ void scores(const unsigned char* blk, uint32_t blk_s, int lane, int n_pairs,
                                                const uint32_t (&qa)[kKSteps][4], float (&s)[8][4]) {
    const int t = lane & 3;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[2 * p][e] = s[2 * p + 1][e] = 0.0f;
      if (p >= n_pairs) continue;  // warp-uniform: tokens past every row of the warp
      const uint32_t row_s = blk_s + key_ldmatrix_token(lane, p) * L::kRowBytes;
      const int swz = key_ldmatrix_token(lane, p) & 7;
      if constexpr (kInt4) {
        const float* sk = reinterpret_cast<const float*>(blk + 2 * L::kPartBytes);
#pragma unroll
        for (int gi = 0; gi < L::kGroups; ++gi) {
          float acc[2][4] = {};
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int ks = 2 * gi + h;
            uint32_t w[4];
            ptx::ldmatrix_x4(w, row_s + ((key_ldmatrix_chunk(lane, ks) ^ swz) * kChunk));
            const uint32_t b0[2] = {w[0], w[1]}, b1[2] = {w[2], w[3]};
            ptx::mma_m16n8k16_bf16(acc[0], qa[ks], b0);
            ptx::mma_m16n8k16_bf16(acc[1], qa[ks], b1);
          }
          // The group's exact integer dot products times the key scale of their token (column 2t + (e & 1)).
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const float2 sc = *reinterpret_cast<const float2*>(sk + gi * kBlockTokens + 16 * p + 8 * nt + 2 * t);
            s[2 * p + nt][0] = fmaf(acc[nt][0], sc.x, s[2 * p + nt][0]);
            s[2 * p + nt][1] = fmaf(acc[nt][1], sc.y, s[2 * p + nt][1]);
            s[2 * p + nt][2] = fmaf(acc[nt][2], sc.x, s[2 * p + nt][2]);
            s[2 * p + nt][3] = fmaf(acc[nt][3], sc.y, s[2 * p + nt][3]);
          }
        }
      } else {
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          uint32_t w[4];
          ptx::ldmatrix_x4(w, row_s + ((key_ldmatrix_chunk(lane, ks) ^ swz) * kChunk));
          const uint32_t b0[2] = {w[0], w[1]}, b1[2] = {w[2], w[3]};
          ptx::mma_m16n8k16_bf16(s[2 * p], qa[ks], b0);
          ptx::mma_m16n8k16_bf16(s[2 * p + 1], qa[ks], b1);
        }
      }
    }
  }

  // o += P·V over the token pairs kk < n_pairs; p holds the probabilities in S's C fragment layout.
  static __device__ __forceinline__ void accumulate(const unsigned char* blk, uint32_t blk_s, int lane, int n_pairs,
                                                    const float (&p)[8][4], float (&o)[kNTiles][4]) {
    const int t = lane & 3;
    const uint32_t v_s = blk_s + L::kPartBytes;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk >= n_pairs) continue;  // warp-uniform; those probabilities are all zero
      const int row = value_ldmatrix_token(lane, kk);
      const uint32_t row_s = v_s + row * L::kRowBytes;
      const int swz = row & 7;
      if constexpr (kInt4) {
        const float* sv = reinterpret_cast<const float*>(blk + 2 * L::kPartBytes + L::kScaleBytes);
#pragma unroll
        for (int grp = 0; grp < L::kGroups; ++grp) {
          // P' = p · s_v(token, group) for tokens 16kk + 2t (+1) and 16kk + 8 + 2t (+1), rounded once to bf16.
          const float2 sa = *reinterpret_cast<const float2*>(sv + grp * kBlockTokens + 16 * kk + 2 * t);
          const float2 sb = *reinterpret_cast<const float2*>(sv + grp * kBlockTokens + 16 * kk + 8 + 2 * t);
          const uint32_t a[4] = {pack_bf16x2(p[2 * kk][0] * sa.x, p[2 * kk][1] * sa.y),
                                 pack_bf16x2(p[2 * kk][2] * sa.x, p[2 * kk][3] * sa.y),
                                 pack_bf16x2(p[2 * kk + 1][0] * sb.x, p[2 * kk + 1][1] * sb.y),
                                 pack_bf16x2(p[2 * kk + 1][2] * sb.x, p[2 * kk + 1][3] * sb.y)};
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int c = 4 * grp + 2 * h;  // n-tiles c, c + 1 (8 channels each) lie in group grp
            uint32_t w[4];
            ptx::ldmatrix_x4_trans(w, row_s + ((value_ldmatrix_chunk(lane, c) ^ swz) * kChunk));
            const uint32_t b0[2] = {w[0], w[1]}, b1[2] = {w[2], w[3]};
            ptx::mma_m16n8k16_bf16(o[c], a, b0);
            ptx::mma_m16n8k16_bf16(o[c + 1], a, b1);
          }
        }
      } else {
        const uint32_t a[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]), pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                               pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int c = 0; c < kNTiles; c += 2) {
          uint32_t w[4];
          ptx::ldmatrix_x4_trans(w, row_s + ((value_ldmatrix_chunk(lane, c) ^ swz) * kChunk));
          const uint32_t b0[2] = {w[0], w[1]}, b1[2] = {w[2], w[3]};
          ptx::mma_m16n8k16_bf16(o[c], a, b0);
          ptx::mma_m16n8k16_bf16(o[c + 1], a, b1);
        }
      }
    }
  }
};

template <bool kInt4, int kD>
__global__ void __launch_bounds__(kThreads, (Layout<kInt4, kD>::kMinCtasPerSm))
    attention_prefill_kernel(const PrefillArgs args) {
  using L = Layout<kInt4, kD>;
  using B = Block<kInt4, kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  const TileSlot slot = tile_slot(static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                                  static_cast<int>(gridDim.x), static_cast<int>(gridDim.y));
  const int chunk = blockIdx.z, kvh = slot.kv_head;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int G = args.gqa;

  // The chunk's rows, clamped to the launch's max_chunk_rows and to the q/out rows (a contract violation never
  // reads or writes outside them).
  const int first_row = args.chunk_first_row[chunk];
  int n_rows = args.chunk_first_row[chunk + 1] - first_row;
  n_rows = min(n_rows, args.max_chunk_rows);
  n_rows = min(n_rows, args.rows - first_row);
  if (first_row < 0 || n_rows <= 0) return;
  // Heaviest tiles (the chunk's last rows see the most keys) first, of every KV head (tile_slot): they bound the
  // launch's tail.
  const int tile = tiles_for_rows(n_rows, G) - 1 - slot.rank;
  if (tile < 0) return;
  const int start = max(0, args.chunk_start_pos[chunk]);
  const int capacity = args.max_pages * kBlockTokens;
  const TileWork work = tile_work(n_rows, G, start, capacity, tile);

  // This lane's two A rows (g, g + 8): their vectors, positions and Q fragments.
  int vec[2], pos[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    vec[r] = warp_row_vector(work, warp, g + 8 * r);
    pos[r] = vector_position(start, vec[r], G, capacity);
  }
  const int warp_v0 = work.v_begin + kWarpVectors * warp;
  const bool warp_active = warp_v0 < work.v_end;
  const int warp_min_pos = vector_position(start, warp_row_vector(work, warp, 0), G, capacity);
  const int warp_max_pos = vector_position(start, warp_row_vector(work, warp, kWarpVectors - 1), G, capacity);

  uint32_t qa[B::kKSteps][4];
  {
    const __nv_bfloat16* qrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = first_row + vec[r] / G, head = int64_t{kvh} * G + vec[r] % G;
      qrow[r] = args.q + (row * args.n_heads + head) * kD;
    }
#pragma unroll
    for (int ks = 0; ks < B::kKSteps; ++ks) {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg)
        qa[ks][reg] = *reinterpret_cast<const uint32_t*>(qrow[reg & 1] + 16 * ks + 2 * t + 8 * (reg >> 1));
    }
  }

  const uint32_t smem_s = ptx::smem_addr(smem);
  const int32_t* bt = args.block_table + int64_t{chunk} * args.max_pages;
  auto issue = [&](int j) {
    const int page_id = __ldg(bt + j);
    const uint8_t* page = args.pool + (int64_t{page_id} * args.n_kv_heads + kvh) * L::kRawPageBytes;
    B::issue(smem_s + (j & 1) * L::kStageBytes, page, work.kv_len - j * kBlockTokens);
  };

  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  float o[B::kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < B::kNTiles; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;

  issue(0);
  ptx::cp_async_commit_group();
  for (int j = 0; j < work.blocks; ++j) {
    ptx::cp_async_wait_group<0>();  // this thread's copies of block j have landed
    __syncthreads();                // ... and everyone's; every warp is also done with block j − 1
    if (j + 1 < work.blocks) issue(j + 1);  // into the stage block j − 1 used
    ptx::cp_async_commit_group();
    const unsigned char* blk;
    uint32_t blk_s;
    if constexpr (kInt4) {
      B::dequantise(smem + (j & 1) * L::kStageBytes, smem + L::kBlockOffset, work.kv_len - j * kBlockTokens);
      __syncthreads();  // the dequantised block is complete
      blk = smem + L::kBlockOffset;
      blk_s = smem_s + L::kBlockOffset;
    } else {
      blk = smem + (j & 1) * L::kStageBytes;
      blk_s = smem_s + (j & 1) * L::kStageBytes;
    }
    const int kb = j * kBlockTokens;
    if (!warp_active || kb > warp_max_pos) continue;  // the warp's rows see nothing of this block
    // Pairs of n-tiles (16 tokens) holding a token some row of the warp sees; masking only where a row's position
    // falls inside the block.
    const bool masked = kb + kBlockTokens - 1 > warp_min_pos;
    const int n_pairs = masked ? min(4, (warp_max_pos - kb) / 16 + 1) : 4;

    float s[8][4];
    B::scores(blk, blk_s, lane, n_pairs, qa, s);
    float bmax[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = kb + 8 * nt + 2 * t + (e & 1);
        s[nt][e] = masked && tok > pos[e >> 1] ? kNegInf : s[nt][e] * args.score_scale;
        bmax[e >> 1] = fmaxf(bmax[e >> 1], s[nt][e]);
      }
    }
    float alpha[2], m_use[2], psum[2] = {0.0f, 0.0f};
    online_max_update(bmax, m, m_use, alpha);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = ptx::ex2_approx(s[nt][e] - m_use[e >> 1]);
        psum[e >> 1] += s[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], psum[r]);
#pragma unroll
    for (int nt = 0; nt < B::kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] *= alpha[e >> 1];
    }
    B::accumulate(blk, blk_s, lane, n_pairs, s, o);
  }
  ptx::cp_async_wait_group<0>();  // only an empty group can be left; leave none behind

  // Normalise and store: row r of the lane is vector vec[r] (stored only when it is a real vector of the tile).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int v = warp_v0 + g + 8 * r;
    if (v >= work.v_end) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int64_t row = first_row + v / G, head = int64_t{kvh} * G + v % G;
    __nv_bfloat16* orow = args.out + (row * args.n_heads + head) * kD;
#pragma unroll
    for (int nt = 0; nt < B::kNTiles; ++nt) {
      const uint32_t pair = pack_bf16x2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(orow + 8 * nt + 2 * t) = pair;
    }
  }
}

}  // namespace futransformer::cuda::prefill
