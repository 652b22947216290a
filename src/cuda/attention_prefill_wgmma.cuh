// Prefill attention over the paged KV cache with warpgroup MMAs (sm_90a): the same work, inputs, outputs and
// numerics contract as the mma.sync kernel (src/cuda/attention_prefill.cuh), restructured for Hopper.
// Layout, descriptors and budgets: src/cuda/attention_prefill_wgmma_layout.h; design: docs/kernels.md.
//
// - A CTA is two warpgroups and owns one 64-vector tile (64 (row, query head) pairs of one chunk, all G heads of
//   one KV head). Warpgroup 0 is the producer: it copies each key block (page) into a two-stage ring in the
//   swizzled operand layout — BF16 pages by cp.async straight into place, INT4 pages through two raw page
//   buffers (cp.async one page ahead) and then dequantised to the exact integers u − z in BF16 plus fp32 scales —
//   and hands stages over with mbarriers. Warpgroup 1 is the consumer: S = Q·Kᵀ and O += P·V as wgmma (bf16 in,
//   fp32 accumulate), online softmax in registers. So the INT4 dequantisation of block j + 1 overlaps the MMAs of
//   block j instead of sitting between two barriers.
// - S: BF16 — eight m64n64k16 SS wgmmas (Q and K from shared memory). INT4 — per 32-channel group, two k-steps
//   into a fresh accumulator (exact integer products summed in fp32), then S += acc · s_k(token, group) in group
//   order; two accumulators alternate so group g + 1's wgmmas run while group g is scaled.
// - P·V: the S accumulator is P's A fragment (wgmma RS). BF16 — m64n(D)k16 per 16 tokens. INT4 — per group an
//   m64n32k16 whose A is P' = p · s_v(token, group) rounded once to BF16, so the value codes stay exact.
// - The consumer waits for P·V(j) at the end of block j and then releases the stage; the second CTA on the SM
//   (two per SM) overlaps one CTA's softmax with the other's MMAs.
// - Causal masking when a block reaches past the tile's first position; each output element is written once by
//   one lane, in a fixed order: deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda/attention_prefill.cuh"  // PrefillArgs, pack_bf16x2, sub_bf16x2, constants
#include "cuda/attention_prefill_wgmma_layout.h"
#include "cuda/ptx/bits.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/math.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/tma.cuh"  // fence_proxy_async_shared
#include "cuda/ptx/wgmma.cuh"
#include "cuda/ptx/wgmma_bf16.cuh"

namespace futransformer::cuda::prefill_wgmma {

using prefill::kBf16Magic;
using prefill::kBlockTokens;
using prefill::kNegInf;
using prefill::kNibbleMask;
using prefill::pack_bf16x2;
using prefill::PrefillArgs;
using prefill::sub_bf16x2;

constexpr int kProducerBarrier = 1;  // named barrier of the producer warpgroup (0 is __syncthreads')
constexpr int kConsumerBarrier = 2;  // named barrier of the consumer warpgroup

template <bool kInt4, int kD>
struct Producer {
  using L = Layout<kInt4, kD>;
  using Page = typename L::Page;

  // BF16: page -> stage at `dst` (K part, V part), rows at or past `valid` zero-filled without reading them.
  static __device__ __forceinline__ void copy_bf16(uint32_t dst, const uint8_t* page, int valid, int tid) {
    constexpr int kPartChunks = kRows * L::kChunksPerRow;
#pragma unroll 4
    for (int i = tid; i < 2 * kPartChunks; i += kWarpgroupThreads) {
      const int part = i / kPartChunks, row = (i % kPartChunks) / L::kChunksPerRow, c = i % L::kChunksPerRow;
      ptx::cp_async_16_zfill(dst + part * L::kPartBytes + operand_offset(row, c),
                             page + part * (kRows * 2 * kD) + row * (2 * kD) + c * 16, row < valid);
    }
  }

  // INT4: raw page bytes -> stage: codes as bf16 u − z (exact), scales as fp32 [part][group][token]; tokens at
  // or past `valid` get zero codes and zero scales (their page bytes may be anything).
  static __device__ __forceinline__ void dequantise(const unsigned char* raw, unsigned char* stage, int valid,
                                                    int tid) {
    constexpr int kCodeWords = kD / 8;  // one 32-bit word of codes = 8 channels = one 16-byte chunk
    constexpr int kPartWords = kRows * kCodeWords;
#pragma unroll 4
    for (int i = tid; i < 2 * kPartWords; i += kWarpgroupThreads) {
      const int part = i / kPartWords, row = (i % kPartWords) / kCodeWords, w = i % kCodeWords;
      const unsigned char* src = raw + part * Page::kPagePartBytes;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (row < valid) {
        const uint32_t code = *reinterpret_cast<const uint32_t*>(src + row * (kD / 2) + 4 * w);
        const uint32_t z = src[Page::kPageCodeBytes + Page::kPageScaleBytes + row * L::kGroups + w / 4];
        const uint32_t bias = (z * 0x00010001u) | kBf16Magic;  // bf16x2 {128 + z, 128 + z}
        const uint32_t hi = code >> 4;
        uint32_t o[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          o[j] = sub_bf16x2(
              ptx::lop3<0xea>(ptx::prmt(code, hi, prefill::dequant_selector(j)), kNibbleMask, kBf16Magic), bias);
        v = make_uint4(o[0], o[1], o[2], o[3]);
      }
      *reinterpret_cast<uint4*>(stage + part * L::kPartBytes + operand_offset(row, w)) = v;
    }
    float* scales = reinterpret_cast<float*>(stage + 2 * L::kPartBytes);  // [part][group][token]
    for (int i = tid; i < 2 * kRows * L::kGroups; i += kWarpgroupThreads) {
      const int part = i / (kRows * L::kGroups), rem = i % (kRows * L::kGroups);
      const int row = rem / L::kGroups, gi = rem % L::kGroups;
      float s = 0.0f;
      if (row < valid) {
        __half h;
        std::memcpy(&h, raw + part * Page::kPagePartBytes + Page::kPageCodeBytes + (row * L::kGroups + gi) * 2, 2);
        s = __half2float(h);
      }
      scales[(part * L::kGroups + gi) * kRows + row] = s;
    }
  }
};

template <int N>
__device__ __forceinline__ void fence_array(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) ptx::fence_operand(r[i]);
}

template <bool kInt4, int kD>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) attention_prefill_wgmma_kernel(const PrefillArgs args) {
  using L = Layout<kInt4, kD>;
  using P = Producer<kInt4, kD>;
  extern __shared__ __align__(16) unsigned char smem_window[];
  const uint32_t window_s = ptx::smem_addr(smem_window);
  const uint32_t base_s = (window_s + (kAlign - 1)) & ~static_cast<uint32_t>(kAlign - 1);
  unsigned char* const base = smem_window + (base_s - window_s);

  const int chunk = blockIdx.z, kvh = blockIdx.y;
  const int G = args.gqa;
  // The chunk's rows, clamped as in the mma.sync kernel; whole-CTA exits only before the barriers exist.
  const int first_row = args.chunk_first_row[chunk];
  int n_rows = args.chunk_first_row[chunk + 1] - first_row;
  n_rows = min(n_rows, args.max_chunk_rows);
  n_rows = min(n_rows, args.rows - first_row);
  if (first_row < 0 || n_rows <= 0) return;
  const int tile = prefill::tiles_for_rows(n_rows, G) - 1 - static_cast<int>(blockIdx.x);  // heaviest first
  if (tile < 0) return;
  const int start = max(0, args.chunk_start_pos[chunk]);
  const int capacity = args.max_pages * kBlockTokens;
  const prefill::TileWork work = prefill::tile_work(n_rows, G, start, capacity, tile);
  if (work.blocks <= 0) return;

  const uint32_t bar_s = base_s + L::kBarOffset;  // full[s] at bar_s + 8 s, empty[s] at bar_s + 8 (kStages + s)
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(bar_s + 8 * s, kWarpgroupThreads);
      ptx::mbarrier_init(bar_s + 8 * (kStages + s), kWarpgroupThreads);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  const int tid = threadIdx.x % kWarpgroupThreads;
  const int32_t* bt = args.block_table + int64_t{chunk} * args.max_pages;
  auto page_of = [&](int j) {
    const int page_id = __ldg(bt + j);
    return args.pool + (int64_t{page_id} * args.n_kv_heads + kvh) * L::kRawPageBytes;
  };

  if (threadIdx.x < kWarpgroupThreads) {
    // ---------------- producer ----------------
    ptx::setmaxnreg_dec<kProducerRegs>();
    if constexpr (kInt4) {
      const uint32_t raw_s = base_s + L::kRawOffset;
      auto issue_raw = [&](int j) {
        const uint8_t* page = page_of(j);
        const uint32_t dst = raw_s + (j & 1) * L::kRawPageBytes;
        for (int i = tid; i < L::kRawPageBytes / 16; i += kWarpgroupThreads) ptx::cp_async_16(dst + 16 * i, page + 16 * i);
      };
      issue_raw(0);
      ptx::cp_async_commit_group();
      for (int j = 0; j < work.blocks; ++j) {
        const int s = j % kStages;
        ptx::cp_async_wait_group<0>();                       // this thread's copies of page j have landed
        ptx::bar_sync(kProducerBarrier, kWarpgroupThreads);  // everyone's; and everyone is done with page j − 1
        if (j + 1 < work.blocks) issue_raw(j + 1);           // into the buffer page j − 1 used
        ptx::cp_async_commit_group();
        if (j >= kStages) ptx::mbarrier_wait_parity(bar_s + 8 * (kStages + s), ((j / kStages) - 1) & 1);
        P::dequantise(base + L::kRawOffset + (j & 1) * L::kRawPageBytes, base + L::kStageOffset + s * L::kStageBytes,
                      work.kv_len - j * kBlockTokens, tid);
        ptx::fence_proxy_async_shared();  // generic-proxy stores -> the consumer's wgmma reads
        ptx::mbarrier_arrive(bar_s + 8 * s);
      }
      ptx::cp_async_wait_group<0>();
    } else {
      for (int j = 0; j < work.blocks; ++j) {
        const int s = j % kStages;
        if (j >= kStages) ptx::mbarrier_wait_parity(bar_s + 8 * (kStages + s), ((j / kStages) - 1) & 1);
        P::copy_bf16(base_s + L::kStageOffset + s * L::kStageBytes, page_of(j), work.kv_len - j * kBlockTokens, tid);
        ptx::cp_async_commit_group();
        ptx::cp_async_wait_group<0>();
        ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(bar_s + 8 * s);
      }
    }
    return;
  }

  // ---------------- consumer ----------------
  ptx::setmaxnreg_inc<kConsumerRegs>();
  const int lane = tid & 31, warp = tid >> 5, t = lane & 3;

  // Q tile -> shared memory (K-major operand); vectors past the chunk repeat the last one. q rows are only 4-byte
  // aligned by contract: 4-byte loads.
  const uint32_t q_s = base_s + L::kQOffset;
  for (int i = tid; i < kRows * L::kChunksPerRow; i += kWarpgroupThreads) {
    const int r = i / L::kChunksPerRow, c = i % L::kChunksPerRow;
    const int v = min(work.v_begin + r, work.v_end - 1);
    const int64_t row = first_row + v / G, head = int64_t{kvh} * G + v % G;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(args.q + (row * args.n_heads + head) * kD + 8 * c);
    const uint4 x = make_uint4(src[0], src[1], src[2], src[3]);
    *reinterpret_cast<uint4*>(base + L::kQOffset + operand_offset(r, c)) = x;
  }
  ptx::fence_proxy_async_shared();
  ptx::bar_sync(kConsumerBarrier, kWarpgroupThreads);

  // This lane's two rows (warp rows g, g + 8): their positions.
  int pos[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    pos[r] = prefill::vector_position(start, prefill::warp_row_vector(work, warp, (lane >> 2) + 8 * r), G, capacity);
  const int tile_min_pos = prefill::vector_position(start, work.v_begin, G, capacity);

  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  float o[kD / 2];  // O: register 4 j + e is row g + 8 (e >> 1), channel 8 j + 2 t + (e & 1)
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;

  for (int j = 0; j < work.blocks; ++j) {
    const int s = j % kStages;
    ptx::mbarrier_wait_parity(bar_s + 8 * s, (j / kStages) & 1);
    const uint32_t k_s = base_s + L::kStageOffset + s * L::kStageBytes;
    const uint32_t v_s = k_s + L::kPartBytes;
    const uint32_t sc_s = k_s + 2 * L::kPartBytes;  // INT4: key scales [group][token], then value scales

    float sacc[32];  // S: register 4 nt + e is row g + 8 (e >> 1), token 8 nt + 2 t + (e & 1) of the block
    if constexpr (kInt4) {
      float acc[2][32];
      auto issue_group = [&](int g, float(&a)[32]) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          ptx::wgmma_bf16_ss_m64n64k16(a, make_desc(q_s + kmajor_step_offset(g, h), kLboKMajor),
                                       make_desc(k_s + kmajor_step_offset(g, h), kLboKMajor), h > 0);
        ptx::wgmma_commit_group();
      };
      auto add_group = [&](int g, float(&a)[32]) {
        fence_array(a);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float2 sc = ptx::ld_shared_v2_f32(sc_s + 4 * (g * kRows + 8 * nt + 2 * t));
          if (g == 0) {
            sacc[4 * nt + 0] = a[4 * nt + 0] * sc.x;
            sacc[4 * nt + 1] = a[4 * nt + 1] * sc.y;
            sacc[4 * nt + 2] = a[4 * nt + 2] * sc.x;
            sacc[4 * nt + 3] = a[4 * nt + 3] * sc.y;
          } else {
            sacc[4 * nt + 0] = fmaf(a[4 * nt + 0], sc.x, sacc[4 * nt + 0]);
            sacc[4 * nt + 1] = fmaf(a[4 * nt + 1], sc.y, sacc[4 * nt + 1]);
            sacc[4 * nt + 2] = fmaf(a[4 * nt + 2], sc.x, sacc[4 * nt + 2]);
            sacc[4 * nt + 3] = fmaf(a[4 * nt + 3], sc.y, sacc[4 * nt + 3]);
          }
        }
      };
      ptx::wgmma_fence();
      issue_group(0, acc[0]);
      issue_group(1, acc[1]);
      ptx::wgmma_wait_group<1>();  // group 0 is done
      add_group(0, acc[0]);
      if constexpr (L::kGroups == 4) {
        ptx::wgmma_fence();
        issue_group(2, acc[0]);
        ptx::wgmma_wait_group<1>();
        add_group(1, acc[1]);
        ptx::wgmma_fence();
        issue_group(3, acc[1]);
        ptx::wgmma_wait_group<1>();
        add_group(2, acc[0]);
        ptx::wgmma_wait_group<0>();
        add_group(3, acc[1]);
      } else {
        ptx::wgmma_wait_group<0>();
        add_group(1, acc[1]);
      }
    } else {
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks)
        ptx::wgmma_bf16_ss_m64n64k16(sacc, make_desc(q_s + kmajor_step_offset(ks >> 1, ks & 1), kLboKMajor),
                                     make_desc(k_s + kmajor_step_offset(ks >> 1, ks & 1), kLboKMajor), ks > 0);
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
      fence_array(sacc);
    }

    // Mask, online softmax (exp2 domain), exactly as the mma.sync kernel per row.
    const int kb = j * kBlockTokens;
    const bool masked = kb + kBlockTokens - 1 > tile_min_pos;
    float bmax[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = kb + 8 * nt + 2 * t + (e & 1);
        float& x = sacc[4 * nt + e];
        x = masked && tok > pos[e >> 1] ? kNegInf : x * args.score_scale;
        bmax[e >> 1] = fmaxf(bmax[e >> 1], x);
      }
    }
    float alpha[2], m_use[2], psum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 1));
      bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 2));
      const float m_new = fmaxf(m[r], bmax[r]);
      m_use[r] = m_new == kNegInf ? 0.0f : m_new;
      alpha[r] = ptx::ex2_approx(m[r] - m_use[r]);
      m[r] = m_new;
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      sacc[i] = ptx::ex2_approx(sacc[i] - m_use[(i >> 1) & 1]);
      psum[(i >> 1) & 1] += sacc[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], psum[r]);
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] *= alpha[(i >> 1) & 1];

    // O += P·V; left running while the next block's S is issued.
    ptx::wgmma_fence();
    if constexpr (kInt4) {
      const uint32_t sv_s = sc_s + L::kScaleBytes;  // value scales [group][token]
#pragma unroll
      for (int g = 0; g < L::kGroups; ++g) {
        float(&og)[16] = *reinterpret_cast<float(*)[16]>(o + 16 * g);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const float2 sa = ptx::ld_shared_v2_f32(sv_s + 4 * (g * kRows + 16 * kk + 2 * t));
          const float2 sb = ptx::ld_shared_v2_f32(sv_s + 4 * (g * kRows + 16 * kk + 8 + 2 * t));
          const uint32_t a[4] = {pack_bf16x2(sacc[8 * kk + 0] * sa.x, sacc[8 * kk + 1] * sa.y),
                                 pack_bf16x2(sacc[8 * kk + 2] * sa.x, sacc[8 * kk + 3] * sa.y),
                                 pack_bf16x2(sacc[8 * kk + 4] * sb.x, sacc[8 * kk + 5] * sb.y),
                                 pack_bf16x2(sacc[8 * kk + 6] * sb.x, sacc[8 * kk + 7] * sb.y)};
          ptx::wgmma_bf16_rs_m64n32k16(og, a, make_desc(v_s + nmajor_step_offset(g, kk), kLboNMajor), true);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t a[4] = {pack_bf16x2(sacc[8 * kk + 0], sacc[8 * kk + 1]),
                               pack_bf16x2(sacc[8 * kk + 2], sacc[8 * kk + 3]),
                               pack_bf16x2(sacc[8 * kk + 4], sacc[8 * kk + 5]),
                               pack_bf16x2(sacc[8 * kk + 6], sacc[8 * kk + 7])};
        const uint64_t db = make_desc(v_s + nmajor_step_offset(0, kk), kLboNMajor);
        if constexpr (kD == 128) {
          ptx::wgmma_bf16_rs_m64n128k16(o, a, db, true);
        } else {
          ptx::wgmma_bf16_rs_m64n64k16(o, a, db, true);
        }
      }
    }
    ptx::wgmma_commit_group();
    // P·V(j) completes before the next block: carried across the loop's back edge, ptxas serialises every wgmma
    // (and INT4's 4 groups x 4 k-steps of P' registers would stay live through the next S); the other CTA on the
    // SM fills the gap. Then the stage goes back to the producer.
    ptx::wgmma_wait_group<0>();
    fence_array(o);
    ptx::mbarrier_arrive(bar_s + 8 * (kStages + s));
  }

  // Normalise and store: row r of the lane is vector v (stored only when it is a real vector of the tile).
  const int g = lane >> 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int v = work.v_begin + prefill::kWarpVectors * warp + g + 8 * r;
    if (v >= work.v_end) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int64_t row = first_row + v / G, head = int64_t{kvh} * G + v % G;
    __nv_bfloat16* orow = args.out + (row * args.n_heads + head) * kD;
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt) {
      const uint32_t pair = pack_bf16x2(o[4 * nt + 2 * r] * inv, o[4 * nt + 2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(orow + 8 * nt + 2 * t) = pair;
    }
  }
}

}  // namespace futransformer::cuda::prefill_wgmma
