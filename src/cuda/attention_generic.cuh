// Generic paged decode attention (include/futransformer/cuda/attention_generic.h): plain fp32 CUDA cores, any
// head_dim that is a whole number of 16-byte code chunks (BF16: 8 channels per chunk, INT4: 32 = one scale
// group), any GQA ratio. Correctness and clarity first; the fast mma kernel is attention_decode.cuh.
//
// Grid (splits, n_heads, batch), cluster (splits, 1, 1), kThreads threads: the cluster owns one (sequence, query
// head); CTA `rank` of it owns a contiguous run of the sequence's pages. Per page (64 tokens, one block-table
// read for the whole CTA):
//   1. scores: two adjacent lanes per token, each a dot product over every other 16-byte chunk of the key row,
//      joined with one shuffle; s = dot · score_scale, written to shared memory (−inf past the sequence);
//   2. online softmax: every thread scans the page's 64 scores (shared-memory broadcasts) for the maximum, so the
//      running max m and sum l are identical in every thread without a reduction; p = exp(s − m) replaces s;
//   3. O += P·V: thread (group g, chunk c) owns the kChunkChannels channels of chunk c and accumulates, in
//      registers, the tokens g, g + groups, … of each page (groups = the number of thread groups that fit).
// The end sums the groups' registers through shared memory in group order, then rank 0 merges the cluster's
// CTAs (max, rescale, sum in rank order) by reading their shared memory directly (DSMEM) and writes BF16. Every
// summation order is fixed, so the result is deterministic; nothing but the output touches global memory.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention_generic_layout.h"

namespace futransformer::cuda::attn_generic {

static_assert(kLanesPerToken == 2, "the score phase joins a token's two lanes with one shfl.xor 1");

struct GenericArgs {
  const __nv_bfloat16* q;      // [batch, n_heads, head_dim]
  const uint8_t* pool;         // page of (page id, KV head) at (page id * n_kv_heads + KV head) * page_bytes
  const int32_t* block_table;  // [batch, max_pages]
  const int32_t* seq_lens;     // [batch]
  __nv_bfloat16* out;          // [batch, n_heads, head_dim]
  int n_heads, n_kv_heads, gqa, head_dim, max_pages;
  int64_t page_bytes;
  PageGeometry geo;
  float score_scale;  // 1 / sqrt(head_dim), rounded to fp32 as the CPU twin does
};

// One 16-byte chunk of token `slot`'s K (part 0) or V (part 1) row, decoded to fp32 (attention_generic_layout.h).
// The pool is 16-byte aligned and every region and row a multiple of 16 bytes, so the uint4 load is aligned.
template <bool kInt4>
__device__ __forceinline__ void decode_chunk(const PageGeometry& g, const uint8_t* page, int part, int slot, int chunk,
                                             float (&x)[Format<kInt4>::kChunkChannels]) {
  const uint4 v = *reinterpret_cast<const uint4*>(page + chunk_offset(g, part, slot, chunk));
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float s = 0.0f;
  int z = 0;
  if constexpr (kInt4) {
    s = __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(page + scale_offset(g, part, slot, chunk))));
    z = page[zero_offset(g, part, slot, chunk)];
  }
  decode_chunk_words<kInt4>(w, s, z, x);
}

template <bool kInt4>
__global__ void __launch_bounds__(kThreads) attention_generic_kernel(const GenericArgs a) {
  namespace cg = cooperative_groups;
  constexpr int C = Format<kInt4>::kChunkChannels;
  constexpr float kNegInf = -__builtin_huge_valf();
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float p_s[kPageTokens];  // a page's scores, then its probabilities
  __shared__ float reduce_s[Format<kInt4>::kReduceFloats];
  __shared__ float o_s[kMaxHeadDim];  // this CTA's unnormalised output, read by rank 0 through DSMEM
  __shared__ float ml_s[2];           // this CTA's running max and sum

  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int splits = static_cast<int>(cluster.num_blocks());
  const int head = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int D = a.head_dim;
  const int kv_head = head / a.gqa;

  // Lengths beyond the block table are clamped (as the fast kernel does); negative ones count as empty.
  const int len = clamped_len(a.seq_lens[b], a.max_pages);
  const int n_pages = (len + kPageTokens - 1) / kPageTokens;
  const PageRange range = pages_of_rank(n_pages, splits, rank);

  const __nv_bfloat16* qh = a.q + (static_cast<int64_t>(b) * a.n_heads + head) * D;
  for (int c = tid; c < D; c += kThreads) q_s[c] = __bfloat162float(qh[c]);

  const int chunks = D / C;
  const int groups = pv_groups(chunks);
  const int pv_chunk = tid % chunks, pv_group = tid / chunks;
  const bool pv_active = pv_group < groups;
  const int token = tid / kLanesPerToken, lane_half = tid % kLanesPerToken;
  float acc[C];
#pragma unroll
  for (int k = 0; k < C; ++k) acc[k] = 0.0f;
  float m_run = kNegInf, l_run = 0.0f;
  __syncthreads();

  const int32_t* bt = a.block_table + static_cast<int64_t>(b) * a.max_pages;
  for (int pg = range.begin; pg < range.end; ++pg) {
    const uint8_t* page = a.pool + (static_cast<int64_t>(bt[pg]) * a.n_kv_heads + kv_head) * a.page_bytes;
    const int valid = min(kPageTokens, len - pg * kPageTokens);  // >= 1: pg < n_pages

    // 1. Scores. Slots past `valid` hold whatever the pool held (the tests fill them with NaN bytes): never read.
    float dot = 0.0f;
    if (token < valid) {
#pragma unroll 2
      for (int ch = lane_half; ch < chunks; ch += kLanesPerToken) {
        float x[C];
        decode_chunk<kInt4>(a.geo, page, 0, token, ch, x);
#pragma unroll
        for (int k = 0; k < C; ++k) dot = fmaf(x[k], q_s[ch * C + k], dot);
      }
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    if (lane_half == 0) p_s[token] = token < valid ? dot * a.score_scale : kNegInf;
    __syncthreads();

    // 2. Online softmax. m_new is finite (valid >= 1), so alpha = exp(−inf) = 0 on the first page.
    float m_page = kNegInf;
    for (int i = 0; i < valid; ++i) m_page = fmaxf(m_page, p_s[i]);
    const float m_new = fmaxf(m_run, m_page);
    const float alpha = expf(m_run - m_new);
    __syncthreads();  // every thread has read the scores before they turn into probabilities
    if (lane_half == 0 && token < valid) p_s[token] = expf(p_s[token] - m_new);
    __syncthreads();
    float l_page = 0.0f;
    for (int i = 0; i < valid; ++i) l_page += p_s[i];
    l_run = l_run * alpha + l_page;
    m_run = m_new;

    // 3. O += P·V over this thread's tokens and chunk.
#pragma unroll
    for (int k = 0; k < C; ++k) acc[k] *= alpha;
    if (pv_active) {
#pragma unroll 2
      for (int i = pv_group; i < valid; i += groups) {
        float x[C];
        decode_chunk<kInt4>(a.geo, page, 1, i, pv_chunk, x);
        const float p = p_s[i];
#pragma unroll
        for (int k = 0; k < C; ++k) acc[k] = fmaf(p, x[k], acc[k]);
      }
    }
    __syncthreads();  // p_s is rewritten by the next page
  }

  // The thread groups' partial outputs, summed in group order.
  if (pv_active) {
#pragma unroll
    for (int k = 0; k < C; ++k) reduce_s[pv_group * D + pv_chunk * C + k] = acc[k];
  }
  __syncthreads();
  for (int c = tid; c < D; c += kThreads) {
    float s = 0.0f;
    for (int g = 0; g < groups; ++g) s += reduce_s[g * D + c];
    o_s[c] = s;
  }
  if (tid == 0) {
    ml_s[0] = m_run;
    ml_s[1] = l_run;
  }
  // barrier.cluster with release/acquire semantics: every CTA's o_s and ml_s are visible to rank 0.
  cluster.sync();

  if (rank == 0) {
    float m = kNegInf;
    for (int r = 0; r < splits; ++r) m = fmaxf(m, cluster.map_shared_rank(ml_s, r)[0]);
    __nv_bfloat16* o = a.out + (static_cast<int64_t>(b) * a.n_heads + head) * D;
    if (m == kNegInf) {  // an empty sequence (no rank saw a token)
      for (int c = tid; c < D; c += kThreads) o[c] = __float2bfloat16_rn(0.0f);
    } else {
      float l = 0.0f;
      for (int r = 0; r < splits; ++r) {
        const float* ml = cluster.map_shared_rank(ml_s, r);
        l += ml[1] * expf(ml[0] - m);  // an empty rank has m = −inf: weight 0, and its l and o_s are 0
      }
      for (int c = tid; c < D; c += kThreads) {
        float s = 0.0f;
        for (int r = 0; r < splits; ++r)
          s += cluster.map_shared_rank(o_s, r)[c] * expf(cluster.map_shared_rank(ml_s, r)[0] - m);
        o[c] = __float2bfloat16_rn(s / l);
      }
    }
  }
  // No CTA may exit (freeing its shared memory) while rank 0 still reads it.
  cluster.sync();
}

}  // namespace futransformer::cuda::attn_generic
