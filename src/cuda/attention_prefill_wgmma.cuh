// Prefill attention over the paged KV cache with warpgroup MMAs (sm_90a): the same work, inputs and outputs as
// the mma.sync kernel (src/cuda/attention_prefill.cuh), restructured for Hopper. Layout, descriptors and budgets:
// src/cuda/attention_prefill_wgmma_layout.h; design and numerics: docs/kernels.md ("Prefill attention").
//
// - A CTA is a producer warpgroup and two consumer warpgroups (Shape) and owns a tile of 128 query vectors — (row,
//   query head) pairs of one chunk, all G heads of one KV head.
//   The producer puts each key block (page) into a ring of stages in the swizzled operand layout — BF16 pages by
//   cp.async straight into place; INT4 pages through raw page buffers (one bulk copy per page, two pages ahead),
//   then dequantised to f16 values (u − z) · s — and hands stages over with mbarriers. Each consumer runs S = Q·Kᵀ and O += P·V as wgmma
//   (fp32 accumulate) for its 64 vectors, online softmax in registers. So the INT4 dequantisation of the next block
//   overlaps the MMAs of the current one, once per CTA instead of once per warp.
// - Operand type: BF16 caches — bf16 (the cache's own values, q as given, P rounded to bf16). INT4 caches — f16:
//   keys and values (u − z) · s rounded once to f16 (2^-11 relative), q converted from bf16 to f16 (exact for
//   2^-14 ≤ |q| ≤ 65504), P rounded to f16. The scales therefore ride in the operands and the consumer is one path.
// - S: eight (head_dim 128) m64n64k16 RS wgmmas, Q's A fragments from registers (loaded once per tile), K from
//   shared memory. P·V: the S accumulator is P's A fragment (RS wgmma), m64n(head_dim)k16 per 16 tokens.
// - The consumers are software-pipelined: block j's S is issued with block j − 1's P·V (see the loop). The softmax
//   is lean: the score scale rides in the exponent's FMA, the mask only in blocks that reach past a row's position,
//   O's rescale is skipped when no row's max moved. Variant (template flag): kUnrotate (int4-hadamard output
//   un-rotated in the store).
// - Causal masking when a block reaches past the tile's first position; each output element is written once by
//   one lane, in a fixed order: deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda/attention_prefill.cuh"  // PrefillArgs, pack_bf16x2, constants
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
#include "cuda/ptx/wgmma_16bit.cuh"

namespace futransformer::cuda::prefill_wgmma {

using prefill::kBlockTokens;
using prefill::kNegInf;
using prefill::pack_bf16x2;
using prefill::PrefillArgs;

__device__ __forceinline__ uint32_t sub_f16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// One bf16x2 word -> f16x2 (round to nearest even; |x| beyond 65504 becomes ±inf).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t x) {
  return pack_f16x2(__uint_as_float(x << 16), __uint_as_float(x & 0xFFFF0000u));
}

// The operands' 16-bit type: bf16 for BF16 caches, f16 for INT4 caches (dequantised values with their scales).
template <bool kF16>
struct Mma16;
template <>
struct Mma16<false> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_bf16x2(lo, hi); }
  static __device__ __forceinline__ void ss_n64(float (&d)[32], uint64_t da, uint64_t db, bool acc) {
    ptx::wgmma_bf16_ss_m64n64k16(d, da, db, acc);
  }
  static __device__ __forceinline__ void rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    ptx::wgmma_bf16_rs_m64n64k16(d, a, db, true);
  }
  static __device__ __forceinline__ void rs_k_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, uint32_t acc) {
    ptx::wgmma_bf16_rs_kmajor_m64n64k16(d, a, db, acc);
  }
  static __device__ __forceinline__ void rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    ptx::wgmma_bf16_rs_m64n128k16(d, a, db, true);
  }
};
template <>
struct Mma16<true> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_f16x2(lo, hi); }
  static __device__ __forceinline__ void ss_n64(float (&d)[32], uint64_t da, uint64_t db, bool acc) {
    ptx::wgmma_f16_ss_m64n64k16(d, da, db, acc);
  }
  static __device__ __forceinline__ void rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    ptx::wgmma_f16_rs_m64n64k16(d, a, db, true);
  }
  static __device__ __forceinline__ void rs_k_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, uint32_t acc) {
    ptx::wgmma_f16_rs_kmajor_m64n64k16(d, a, db, acc);
  }
  static __device__ __forceinline__ void rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    ptx::wgmma_f16_rs_m64n128k16(d, a, db, true);
  }
};

constexpr int kConsumerBarrier = 2;  // named barriers of the consumer warpgroups: 2, 3
constexpr int kTurnBarrier = 4;      // ping-pong: consumer c waits for its turn on 4 + c (both warpgroups take part)

template <bool kInt4, int kD>
struct Producer {
  using L = Layout<kInt4, kD>;  // part geometry only
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

  // INT4: raw page bytes -> stage as f16 values (u − z) · s, the code difference exact (magic-number conversion,
  // 1024 + u − (1024 + z)), the product rounded once to f16. Tokens at or past `valid` get zeros (their page
  // bytes may be anything). A thread takes kUnits (row, 32-channel group) units: 16 bytes of codes, one zero-point
  // and one scale each, four 16-byte chunks out (a warp's loads are 512 contiguous bytes, its stores
  // conflict-free). All of a thread's shared-memory loads are issued before its first store: the compiler cannot
  // move a load of the raw buffer above a store to the stage (it cannot prove they do not alias), so a loop that
  // loads and stores unit by unit pays the load latency once per unit (ncu, twenty-second session: the producer's
  // first use of each LDS was its hottest instruction and the consumers waited for `full` ~19 % of their time).
  // kPartial: the page may hold fewer than kRows valid tokens (the last block); the other blocks take the
  // instance without the per-unit branch, whose loads the compiler would otherwise sink into it.
  // `stage_free()` is called between the loads and the first store: it waits until the consumers have released the
  // stage, so the raw loads' latency overlaps that wait.
  template <bool kPartial, class StageFree>
  static __device__ __forceinline__ void dequantise(const unsigned char* raw, unsigned char* stage, int valid,
                                                    int tid, uint32_t raw_empty, StageFree&& stage_free) {
    constexpr int kPartUnits = kRows * L::kGroups;
    constexpr int kUnits = 2 * kPartUnits / kWarpgroupThreads;  // 4 (head_dim 128) or 2 (64)
    static_assert(2 * kPartUnits % kWarpgroupThreads == 0, "units split evenly over the producer's threads");
    uint4 code[kUnits];
    uint32_t zero[kUnits], scale_bits[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int i = tid + k * kWarpgroupThreads;
      const int part = i / kPartUnits, row = (i % kPartUnits) / L::kGroups, grp = i % L::kGroups;
      const unsigned char* src = raw + part * Page::kPagePartBytes;
      const int group = row * L::kGroups + grp;
      // Rows at or past `valid` are loaded too (the raw buffer is always whole page bytes) and not used.
      code[k] = *reinterpret_cast<const uint4*>(src + row * (kD / 2) + 16 * grp);
      zero[k] = src[Page::kPageCodeBytes + Page::kPageScaleBytes + group];
      scale_bits[k] = *reinterpret_cast<const uint16_t*>(src + Page::kPageCodeBytes + 2 * group);
    }
    ptx::mbarrier_arrive(raw_empty);  // this thread is done with the raw buffer (release: its loads come first)
    stage_free();
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int i = tid + k * kWarpgroupThreads;
      const int part = i / kPartUnits, row = (i % kPartUnits) / L::kGroups, grp = i % L::kGroups;
      unsigned char* dst = stage + part * L::kPartBytes;
      if (!kPartial || row < valid) {
        const uint32_t bias = f16_bias_pair(zero[k]);         // f16x2 {1024 + z, 1024 + z}
        const uint32_t scale = f16_scale_pair(scale_bits[k]);  // f16x2 {s, s}
        const uint32_t words[4] = {code[k].x, code[k].y, code[k].z, code[k].w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint32_t hi = words[w] >> 4;
          uint32_t o[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t u =
                ptx::lop3<0xea>(ptx::prmt(words[w], hi, prefill::dequant_selector(j)), kF16NibbleMask, kF16Magic);
            o[j] = mul_f16x2(sub_f16x2(u, bias), scale);
          }
          *reinterpret_cast<uint4*>(dst + operand_offset(row, 4 * grp + w)) = make_uint4(o[0], o[1], o[2], o[3]);
        }
      } else {
#pragma unroll
        for (int w = 0; w < 4; ++w)
          *reinterpret_cast<uint4*>(dst + operand_offset(row, 4 * grp + w)) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
};

template <int N>
__device__ __forceinline__ void fence_array(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) ptx::fence_operand(r[i]);
}

// kUnrotate (INT4_HADAMARD): the output is un-rotated before it is stored — the BF16 output values, then
// rotate_heads_bf16's butterflies (strides 1, 2, ..., block / 2 by increasing stride, (a + b, a − b), then one multiply
// by the scale), rounded to BF16 again: the same bits as attention_prefill followed by rotate_heads_bf16. In the
// accumulator fragment, channel c = 8 nt + 2 t + e of a row is register 4 nt + 2 r + e of lane t of the row's quad:
// stride 1 is e, strides 2 and 4 a quad shuffle (lane ^ 1, lane ^ 2), strides 8 .. 64 the nt index.
template <bool kInt4, int kD, bool kUnrotate = false>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinCtasPerSm)
    attention_prefill_wgmma_kernel(const PrefillArgs args) {
  static_assert(!kUnrotate || kInt4, "only INT4_HADAMARD outputs are rotated");
  using Sh = Shape;
  using L = Layout<kInt4, kD>;
  constexpr int kConsumers = Sh::kConsumers;
  using P = Producer<kInt4, kD>;
  using M = Mma16<kInt4>;
  constexpr int kStages = L::kStages;
  extern __shared__ __align__(16) unsigned char smem_window[];
  const uint32_t window_s = ptx::smem_addr(smem_window);
  const uint32_t base_s = (window_s + (kAlign - 1)) & ~static_cast<uint32_t>(kAlign - 1);
  unsigned char* const base = smem_window + (base_s - window_s);

  const prefill::TileSlot slot = prefill::tile_slot(static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                                                     static_cast<int>(gridDim.x), static_cast<int>(gridDim.y));
  const int chunk = blockIdx.z, kvh = slot.kv_head;
  const int G = args.gqa;
  // The chunk's rows, clamped as in the mma.sync kernel; whole-CTA exits only before the barriers exist.
  const int first_row = args.chunk_first_row[chunk];
  int n_rows = args.chunk_first_row[chunk + 1] - first_row;
  n_rows = min(n_rows, args.max_chunk_rows);
  n_rows = min(n_rows, args.rows - first_row);
  if (first_row < 0 || n_rows <= 0) return;
  const int tile = tiles_for_rows(n_rows, G, Sh::kTileVectors) - 1 - slot.rank;  // heaviest first
  if (tile < 0) return;
  const int start = max(0, args.chunk_start_pos[chunk]);
  const int capacity = args.max_pages * kBlockTokens;
  const prefill::TileWork work = tile_work(n_rows, G, start, capacity, tile, Sh::kTileVectors);
  if (work.blocks <= 0) return;

  // full[s] at bar_s + 8 s (the producer's 128 arrivals), empty[s] at bar_s + 8 (kStages + s) (every consumer
  // thread's arrival).
  const uint32_t bar_s = base_s + L::kBarOffset;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(bar_s + 8 * s, kWarpgroupThreads);
      ptx::mbarrier_init(bar_s + 8 * (kStages + s), kConsumers * kWarpgroupThreads);
    }
#pragma unroll
    for (int b = 0; b < L::kRawBuffers; ++b) {
      ptx::mbarrier_init(bar_s + 8 * (L::kRawFullBarrier + b), 1);
      ptx::mbarrier_init(bar_s + 8 * (L::kRawEmptyBarrier + b), kWarpgroupThreads);
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
  auto wait_empty = [&](int j) {  // stage of block j free again: the consumers are done with block j − kStages
    if (j >= kStages) ptx::mbarrier_wait_parity(bar_s + 8 * (kStages + j % kStages), ((j / kStages) - 1) & 1);
  };

  if (threadIdx.x < kWarpgroupThreads) {
    // ---------------- producer ----------------
    ptx::setmaxnreg_dec<Sh::kProducerRegs>();
    if constexpr (kInt4) {
      // Raw pages: thread 0 fills raw buffer j % kRaw with page j by one bulk copy (raw_full[b]: one arrival and
      // the page's bytes), kRaw − 1 pages ahead of the dequantisation; every producer thread arrives on
      // raw_empty[b] once it has loaded its units of the page, and thread 0 waits for that before it refills b.
      const uint32_t raw_s = base_s + L::kRawOffset;
      constexpr int kRaw = L::kRawBuffers;
      const uint32_t raw_full_s = bar_s + 8 * L::kRawFullBarrier, raw_empty_s = bar_s + 8 * L::kRawEmptyBarrier;
      auto issue_raw = [&](int j, const uint8_t* page) {  // thread 0
        const int b = j % kRaw;
        if (j >= kRaw) ptx::mbarrier_wait_parity(raw_empty_s + 8 * b, ((j / kRaw) - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(raw_full_s + 8 * b, L::kRawPageBytes);
        ptx::bulk_load(raw_s + b * L::kRawPageBytes, page, L::kRawPageBytes, raw_full_s + 8 * b);
      };
      // The page of the next block to copy, read from the block table one iteration ahead (its global load's
      // latency then hides under a dequantisation instead of stalling the copy issue).
      const uint8_t* next_page = nullptr;
      if (tid == 0) {
#pragma unroll
        for (int p = 0; p < kRaw - 1; ++p)
          if (p < work.blocks) issue_raw(p, page_of(p));
        if (work.blocks > kRaw - 1) next_page = page_of(kRaw - 1);
      }
      for (int j = 0; j < work.blocks; ++j) {
        if (tid == 0) {
          if (j + kRaw - 1 < work.blocks) issue_raw(j + kRaw - 1, next_page);  // into the buffer page j − 1 used
          if (j + kRaw < work.blocks) next_page = page_of(j + kRaw);
        }
        ptx::mbarrier_wait_parity(raw_full_s + 8 * (j % kRaw), (j / kRaw) & 1);
        unsigned char* const raw = base + L::kRawOffset + (j % kRaw) * L::kRawPageBytes;
        unsigned char* const stage = base + L::kStageOffset + (j % kStages) * L::kStageBytes;
        const int valid = work.kv_len - j * kBlockTokens;
        const uint32_t raw_empty = raw_empty_s + 8 * (j % kRaw);
        const auto stage_free = [&] { wait_empty(j); };
        if (valid >= kBlockTokens) {
          P::template dequantise<false>(raw, stage, valid, tid, raw_empty, stage_free);
        } else {
          P::template dequantise<true>(raw, stage, valid, tid, raw_empty, stage_free);
        }
        ptx::fence_proxy_async_shared();  // generic-proxy stores -> the consumers' wgmma reads
        ptx::mbarrier_arrive(bar_s + 8 * (j % kStages));
      }
    } else {
      // Block j's copies are issued before block j − 1's are waited for: two blocks in flight.
      for (int j = 0; j < work.blocks; ++j) {
        wait_empty(j);
        P::copy_bf16(base_s + L::kStageOffset + (j % kStages) * L::kStageBytes, page_of(j),
                     work.kv_len - j * kBlockTokens, tid);
        ptx::cp_async_commit_group();
        if (j > 0) {
          ptx::cp_async_wait_group<1>();
          ptx::fence_proxy_async_shared();
          ptx::mbarrier_arrive(bar_s + 8 * ((j - 1) % kStages));
        }
      }
      ptx::cp_async_wait_group<0>();
      ptx::fence_proxy_async_shared();
      ptx::mbarrier_arrive(bar_s + 8 * ((work.blocks - 1) % kStages));
    }
    return;
  }

  // ---------------- consumers ----------------
  ptx::setmaxnreg_inc<Sh::kConsumerRegs>();
  // This consumer: vectors 64 cw .. 64 cw + 63 of the tile. Broadcast from lane 0 so the compiler knows it is
  // warp-uniform and keeps the wgmma descriptors derived from it in uniform registers.
  const int cw = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0) - 1;
  const int lane = tid & 31, warp = tid >> 5, t = lane & 3;

  // Q -> shared memory (K-major operand); vectors past the tile repeat its last one. q rows are only 4-byte aligned
  // by contract: 4-byte loads, all of a thread's loads issued before the first conversion / store (the global
  // latency is paid once per CTA, not once per chunk).
  const uint32_t q_s = base_s + L::kQOffset + cw * L::kPartBytes;
  {
    constexpr int kPerThread = kRows * L::kChunksPerRow / kWarpgroupThreads;  // 8 (head_dim 128) or 4
    static_assert(kRows * L::kChunksPerRow % kWarpgroupThreads == 0);
    uint4 x[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = tid + k * kWarpgroupThreads;
      const int r = i / L::kChunksPerRow, c = i % L::kChunksPerRow;
      const int v = tile_vector(work, kRows * cw + r);
      const int64_t row = first_row + v / G, head = int64_t{kvh} * G + v % G;
      const uint32_t* src = reinterpret_cast<const uint32_t*>(args.q + (row * args.n_heads + head) * kD + 8 * c);
      x[k] = make_uint4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = tid + k * kWarpgroupThreads;
      const int r = i / L::kChunksPerRow, c = i % L::kChunksPerRow;
      uint4 y = x[k];
      if constexpr (kInt4)
        y = make_uint4(bf16x2_to_f16x2(y.x), bf16x2_to_f16x2(y.y), bf16x2_to_f16x2(y.z), bf16x2_to_f16x2(y.w));
      *reinterpret_cast<uint4*>(base + L::kQOffset + cw * L::kPartBytes + operand_offset(r, c)) = y;
    }
  }
  ptx::fence_proxy_async_shared();
  // Immediate barrier ids: a register id makes ptxas reserve all 16, which would allow one CTA per SM.
  if (cw == 0) {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kConsumerBarrier), "n"(kWarpgroupThreads) : "memory");
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kConsumerBarrier + 1), "n"(kWarpgroupThreads) : "memory");
  }

  // Q's A fragments for S = Q·Kᵀ, held in registers for the whole tile (so S's wgmmas read only the keys from
  // shared memory): k-step ks is the mma.m16n8k16 A fragment of this warp's 16 rows, channels 16 ks .. 16 ks + 15 —
  // one ldmatrix.x4 per k-step (a_fragment_row_offset).
  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
    ptx::ldmatrix_x4(qa[ks], q_s + a_fragment_row_offset(warp, lane, ks));

  // This lane's two rows (warp rows g, g + 8): their positions; the consumer's first and last positions.
  int pos[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    pos[r] = prefill::vector_position(start, tile_vector(work, kRows * cw + 16 * warp + (lane >> 2) + 8 * r), G,
                                      capacity);
  const int my_min_pos = prefill::vector_position(start, tile_vector(work, kRows * cw), G, capacity);
  const int my_max_pos = prefill::vector_position(start, tile_vector(work, kRows * cw + kRows - 1), G, capacity);
  const int my_blocks = my_max_pos / kBlockTokens + 1;  // blocks this consumer's rows see (<= work.blocks)

  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  float o[kD / 2];  // O: register 4 j + e is row g + 8 (e >> 1), channel 8 j + 2 t + (e & 1)
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;

  auto stage_addr = [&](int j) { return base_s + L::kStageOffset + (j % kStages) * L::kStageBytes; };
  auto wait_full = [&](int j) { ptx::mbarrier_wait_parity(bar_s + 8 * (j % kStages), (j / kStages) & 1); };
  auto release = [&](int j) { ptx::mbarrier_arrive(bar_s + 8 * (kStages + j % kStages)); };
  float sacc[32];  // S, then P: register 4 nt + e is row g + 8 (e >> 1), token 8 nt + 2 t + (e & 1) of the block
  // S(j) = Q·Kᵀ into sacc: issued and committed as one group.
  // Descriptors of stage 0's K and V, once; a stage and a k step only add to the start-address field.
  const uint64_t k_desc0 = make_desc(stage_addr(0), kLboKMajor);
  const uint64_t v_desc0 = make_desc(stage_addr(0) + L::kPartBytes, kLboNMajor);
  auto issue_s = [&](int j) {
    const uint64_t k_desc = advance_desc(k_desc0, static_cast<uint32_t>((j % kStages) * L::kStageBytes));
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks)
      M::rs_k_n64(sacc, qa[ks], advance_desc(k_desc, kmajor_step_offset(ks >> 1, ks & 1)), ks > 0 ? 1u : 0u);
    ptx::wgmma_commit_group();
  };
  // Mask and online softmax of block j (exp2 domain, exactly as the mma.sync kernel per row): sacc becomes the
  // unnormalised probabilities, m the new running max; returns nothing, leaves alpha (the factor O and l take).
  float alpha[2];
  auto softmax = [&](int j) {
    const int kb = j * kBlockTokens;
    const bool masked = kb + kBlockTokens - 1 > my_min_pos;
    float bmax[2] = {kNegInf, kNegInf};
    // Raw scores: the scale is applied inside the exponent's FMA (max commutes with a positive scale, and
    // rounding is monotonic, so m is the same); the mask only in the blocks that reach past a row's position.
    if (masked) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& x = sacc[4 * nt + e];
          x = kb + 8 * nt + 2 * t + (e & 1) > pos[e >> 1] ? kNegInf : x;
        }
      }
    }
    // Each row's 16 scores reduced as a tree (max is exact and order-free: the same value as a chain, four
    // dependent steps instead of sixteen).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float v[8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) v[nt] = fmaxf(sacc[4 * nt + 2 * r], sacc[4 * nt + 2 * r + 1]);
#pragma unroll
      for (int w = 4; w >= 1; w >>= 1) {
#pragma unroll
        for (int k = 0; k < w; ++k) v[k] = fmaxf(v[k], v[k + w]);
      }
      bmax[r] = fmaxf(bmax[r], v[0]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) bmax[r] *= args.score_scale;  // −inf stays −inf
    float m_use[2], psum[2] = {0.0f, 0.0f};
    prefill::online_max_update(bmax, m, m_use, alpha);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      sacc[i] = ptx::ex2_approx(fmaf(sacc[i], args.score_scale, -m_use[(i >> 1) & 1]));  // −inf -> 0
      psum[(i >> 1) & 1] += sacc[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], psum[r]);
  };
  auto rescale_o = [&] {
    // Most blocks leave every row's max unchanged (alpha = 1): skip the D / 2 multiplies when the whole warp can (a
    // warp-level branch, no wgmma under it).
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
  };
  // P (rounded once to the operand type) as the A fragments of the four k-steps of P·V.
  uint32_t pa[4][4];
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      pa[kk][0] = M::pack(sacc[8 * kk + 0], sacc[8 * kk + 1]);
      pa[kk][1] = M::pack(sacc[8 * kk + 2], sacc[8 * kk + 3]);
      pa[kk][2] = M::pack(sacc[8 * kk + 4], sacc[8 * kk + 5]);
      pa[kk][3] = M::pack(sacc[8 * kk + 6], sacc[8 * kk + 7]);
    }
  };
  // O += P·V(j): issued and committed as one group.
  auto issue_pv = [&](int j) {
    const uint64_t v_desc = advance_desc(v_desc0, static_cast<uint32_t>((j % kStages) * L::kStageBytes));
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t db = advance_desc(v_desc, nmajor_step_offset(0, kk));
      if constexpr (kD == 128) {
        M::rs_n128(o, pa[kk], db);
      } else {
        M::rs_n64(o, pa[kk], db);
      }
    }
    ptx::wgmma_commit_group();
  };

  // Ping-pong (args.pingpong): every group of wgmma issues below is a turn. Consumer c waits on barrier 4 + c
  // (its 128 threads sync, the other consumer's 128 arrive), issues, and hands the turn to the other consumer, so one
  // consumer's wgmmas run while the other does its softmax. Both consumers take work.blocks + 1 turns (their own
  // my_blocks + 1 issue groups, then empty turns while the other still has blocks); consumer 1 gives consumer 0 the
  // first turn and skips the hand-over after its last, so every arrival is matched by a sync.
  const bool pingpong = args.pingpong != 0;  // CTA-uniform
  int turns_left = work.blocks + 1;
  auto take_turn = [&] {
    if (!pingpong) return;
    if (cw == 0) {
      asm volatile("bar.sync %0, %1;\n" ::"n"(kTurnBarrier), "n"(2 * kWarpgroupThreads) : "memory");
    } else {
      asm volatile("bar.sync %0, %1;\n" ::"n"(kTurnBarrier + 1), "n"(2 * kWarpgroupThreads) : "memory");
    }
  };
  auto pass_turn = [&] {
    if (!pingpong) return;
    --turns_left;
    if (cw == 0) {
      asm volatile("bar.arrive %0, %1;\n" ::"n"(kTurnBarrier + 1), "n"(2 * kWarpgroupThreads) : "memory");
    } else if (turns_left > 0) {
      asm volatile("bar.arrive %0, %1;\n" ::"n"(kTurnBarrier), "n"(2 * kWarpgroupThreads) : "memory");
    }
  };
  if (pingpong && cw == 1)  // consumer 0 goes first
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kTurnBarrier), "n"(2 * kWarpgroupThreads) : "memory");
  {
    // Software-pipelined: block j's S is issued together with block j − 1's P·V, and block j's softmax runs while
    // that P·V is still on the tensor cores; both are waited for inside the iteration (nothing in flight across
    // the back edge) and the steady-state loop has no branch around a wgmma (ptxas serialises wgmmas issued in
    // paths it cannot prove warpgroup-uniform). A consumer holds two stages at a time (j − 1's values, j's keys), so
    // of L::kStages (three or four) the producer can fill one or two ahead. my_blocks >= 1: every row sees key 0.
    wait_full(0);
    take_turn();
    issue_s(0);
    pass_turn();
    ptx::wgmma_wait_group<0>();
    fence_array(sacc);
    softmax(0);
    pack_p();  // O is still zero: no rescale
    for (int j = 1; j < my_blocks; ++j) {
      wait_full(j);
      take_turn();
      issue_s(j);
      issue_pv(j - 1);
      pass_turn();
      ptx::wgmma_wait_group<1>();  // S(j) (committed first) is done; P·V(j − 1) may still run
      fence_array(sacc);
      softmax(j);
      ptx::wgmma_wait_group<0>();
      fence_array(o);
      release(j - 1);
      rescale_o();
      pack_p();
    }
    take_turn();
    issue_pv(my_blocks - 1);
    pass_turn();
    ptx::wgmma_wait_group<0>();
    fence_array(o);
    release(my_blocks - 1);
    // Blocks only the other consumer's rows see: wait for each to be filled before handing it back, so that no
    // thread arrives twice on one phase of a stage's barrier (and, ping-ponging, take the matching empty turns).
    for (int j = my_blocks; j < work.blocks; ++j) {
      wait_full(j);
      take_turn();
      pass_turn();
      release(j);
    }
  }

  // Normalise and store: row r of the lane is vector v (stored only when it is a real vector of the tile).
  const int g = lane >> 2;
  if constexpr (kUnrotate) {
    // Every lane takes part in the shuffles (rows past the tile repeat a real vector: finite values).
    float y[2][kD / 4];  // y[r][2 nt + e]: row r, channel 8 nt + 2 t + e
    const int block = args.unrotate_block;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
      for (int i = 0; i < kD / 4; ++i)  // the BF16 output attention_prefill would store, widened (exact)
        y[r][i] = __bfloat162float(__float2bfloat16_rn(o[4 * (i >> 1) + 2 * r + (i & 1)] * inv));
      if (block > 1) {  // stride 1: e
#pragma unroll
        for (int nt = 0; nt < kD / 8; ++nt) {
          const float a = y[r][2 * nt], b = y[r][2 * nt + 1];
          y[r][2 * nt] = __fadd_rn(a, b);
          y[r][2 * nt + 1] = __fsub_rn(a, b);
        }
      }
#pragma unroll
      for (int m = 1; m <= 2; m *= 2) {  // strides 2 and 4: lanes t and t ^ m
        if (2 * m < block) {
#pragma unroll
          for (int i = 0; i < kD / 4; ++i) {
            const float other = __shfl_xor_sync(0xffffffffu, y[r][i], m);
            y[r][i] = (t & m) ? __fsub_rn(other, y[r][i]) : __fadd_rn(y[r][i], other);
          }
        }
      }
#pragma unroll
      for (int m = 1; m < kD / 8; m *= 2) {  // strides 8 m: nt and nt | m
        if (8 * m < block) {
#pragma unroll
          for (int nt = 0; nt < kD / 8; ++nt) {
            if ((nt & m) == 0) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const float a = y[r][2 * nt + e], b = y[r][2 * (nt | m) + e];
                y[r][2 * nt + e] = __fadd_rn(a, b);
                y[r][2 * (nt | m) + e] = __fsub_rn(a, b);
              }
            }
          }
        }
      }
      if (block > 1) {
#pragma unroll
        for (int i = 0; i < kD / 4; ++i) y[r][i] = __fmul_rn(y[r][i], args.unrotate_scale);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int v = work.v_begin + kRows * cw + 16 * warp + g + 8 * r;
      if (v >= work.v_end) continue;
      const int64_t row = first_row + v / G, head = int64_t{kvh} * G + v % G;
      __nv_bfloat16* orow = args.out + (row * args.n_heads + head) * kD;
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt)
        *reinterpret_cast<uint32_t*>(orow + 8 * nt + 2 * t) = pack_bf16x2(y[r][2 * nt], y[r][2 * nt + 1]);
    }
  } else {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int v = work.v_begin + kRows * cw + 16 * warp + g + 8 * r;
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
}

}  // namespace futransformer::cuda::prefill_wgmma
