// The W4A16 chain kernel (w4a16_chain.h states the contract). One CTA per SM, all resident (cooperative launch);
// kChainConsumerWarps consumer warps and one producer warp (w4a16_chain_layout.h has the sizes).
//
// Producer (kWarpCopies off; the last warp, lane 0): walks the CTA's jobs of every stage in order — stage s, its
// 32-column blocks j (chain_first_job, then every `ctas`), the K / kChainSlotK slots q of each — and for slot q of a job
// fills the next free slot of consumer warp chain_slot_warp(q)'s sub-ring: one mbarrier.arrive.expect_tx, one bulk copy
// of the slot's packed blocks, one of their groups' scales. It waits only for a sub-ring slot to be released (and for
// the stages_ahead throttle), never for data, so it runs ahead of the consumers across stage boundaries by up to the
// ring. kWarpCopies: no producer; each consumer warp cp.async's its own slots kChainSlotsPerWarp - 1 ahead.
//
// Consumers: per stage, thread 0 publishes the CTA's completion of the previous stage (fence, then a release add of 1
// to that stage's counter) and spins until the counter reaches `ctas` (acquire), then waits delay_ns; the consumer
// threads stage x_s (M rows of K bf16, from L2 with ld.global.cg: y_{s-1} was written by other CTAs during this
// launch) into shared memory; then per job each warp consumes its slots with the v4 swapped M <= 8 arithmetic
// (gemm_w4a16_v4.cuh: the word as the A fragment of 128 + u, one mma per k16 step with 136 as A for the offset,
// flushed per group with the group's scales), hands its 2 x 4 fp32 partial sums per lane to warp 0 through shared
// memory, and warp 0 adds them in warp order and stores BF16. Deterministic: fixed job owners, fixed order of
// additions.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/decoder_ops.cuh"
#include "cuda/gemm_w4a16_v4.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/w4a16_chain.h"

namespace futransformer::cuda::w4a16 {

namespace chain_detail {

constexpr int kConsumerBarrier = 1;  // named barrier of the 256 consumer threads
constexpr int kConsumerThreads = kChainConsumerWarps * 32;

__device__ __forceinline__ void consumers_sync() { ptx::bar_sync(kConsumerBarrier, kConsumerThreads); }

__device__ __forceinline__ void release_add(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t acquire_load(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// The stage table entry (the table never changes during a launch).
__device__ __forceinline__ ChainStage load_stage(const ChainStage* __restrict__ stages, int s) { return stages[s]; }

// kWarpCopies: one consumer warp's slots in the order it consumes them, across stages — the issue cursor of the
// variant in which each warp copies its own slots with cp.async (no producer warp, no mbarriers).
struct WarpSlotCursor {
  const ChainStage* stages;
  int n_stages, cta, ctas, warp;
  int s = 0, j = 0, q = 0, nblocks = 0, kslots = 0, K = 0, group = 0;
  int64_t rot = 0;
  const unsigned char* w = nullptr;
  const unsigned char* sc = nullptr;
  // From stage s on, the first stage in which this warp has a slot.
  __device__ __forceinline__ void enter_stage() {
    for (; s < n_stages; ++s) {
      const ChainStage st = load_stage(stages, s);
      nblocks = st.N / kBlockN;
      kslots = st.K / kChainSlotK;
      K = st.K;
      group = st.group;
      w = static_cast<const unsigned char*>(st.w);
      sc = static_cast<const unsigned char*>(st.scales);
      j = chain_first_job(cta, ctas, rot);
      q = warp;
      if (j < nblocks && q < kslots) return;
      rot = (rot + nblocks) % ctas;
    }
  }
  __device__ __forceinline__ bool valid() const { return s < n_stages; }
  __device__ __forceinline__ void next() {
    q += kChainConsumerWarps;
    if (q < kslots) return;
    q = warp;
    j += ctas;
    if (j < nblocks) return;
    rot = (rot + nblocks) % ctas;
    ++s;
    enter_stage();
  }
};

// The cursor's slot into ring slot `slot` with cp.async: lane l copies bytes l * 16 of each of the slot's blocks (exactly
// what it reads back) and, l < scale bytes / 16, one 16-byte piece of the scales. One commit group either way, so the
// wait counts stay uniform past the last slot.
__device__ __forceinline__ void issue_warp_slot(const WarpSlotCursor& c, uint32_t ring_s, uint32_t slot, int lane) {
  if (c.valid()) {
    const unsigned char* wsrc = c.w + chain_slot_weight_offset(c.j, c.K, c.q) + lane * 16;
    const uint32_t dst = ring_s + slot * kChainSlotBytes + lane * 16;
#pragma unroll
    for (int b = 0; b < kChainSlotBlocks; ++b) ptx::cp_async_16(dst + b * 512, wsrc + b * 512);
    if (lane * 16 < chain_slot_scale_bytes(c.group))
      ptx::cp_async_16(ring_s + slot * kChainSlotBytes + kChainSlotWeightBytes + lane * 16,
                       c.sc + chain_slot_scale_offset(c.j, c.K, c.group, c.q) + lane * 16);
  }
  ptx::cp_async_commit_group();
}

}  // namespace chain_detail

template <bool kF16Scales, bool kWarpCopies>
__global__ void __launch_bounds__(kChainThreads, 1)
    w4a16_chain_kernel(const ChainStage* __restrict__ stages, int n_stages, const __nv_bfloat16* __restrict__ x0,
                       int M, uint32_t* __restrict__ counters, int stages_ahead) {
  using namespace chain_detail;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + kChainRingBytes);
  float* red = reinterpret_cast<float*>(smem + kChainRingBytes + kChainXBytes);
  const uint32_t bars = ptx::smem_addr(smem + kChainRingBytes + kChainXBytes + kChainRedBytes);
  auto full_bar = [&](uint32_t slot) { return bars + 8 * slot; };
  auto empty_bar = [&](uint32_t slot) { return bars + 8 * (kChainSlots + slot); };
  volatile int* consumer_stage =
      reinterpret_cast<volatile int*>(smem + kChainRingBytes + kChainXBytes + kChainRedBytes + kChainBarBytes);

  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int cta = static_cast<int>(blockIdx.x), ctas = static_cast<int>(gridDim.x);
  if (tid == 0) {
    for (int i = 0; i < kChainSlots; ++i) {
      ptx::mbarrier_init(full_bar(i), 1);   // the producer's arrive.expect_tx; the bytes complete it
      ptx::mbarrier_init(empty_bar(i), 1);  // the consuming warp's lane 0
    }
    ptx::fence_mbarrier_init();
    *consumer_stage = 0;
  }
  __syncthreads();

  if (warp == kChainConsumerWarps) {
    // ---- producer -------------------------------------------------------------------------------------------
    if (kWarpCopies || lane != 0) return;
    const uint32_t ring_s = ptx::smem_addr(ring);
    uint32_t filled[kChainConsumerWarps] = {};  // slots handed to each consumer warp so far
    int64_t rot = 0;
    for (int s = 0; s < n_stages; ++s) {
      if (s - stages_ahead > 0) {
        while (*consumer_stage < s - stages_ahead) {
        }
      }
      const ChainStage st = load_stage(stages, s);
      const int nblocks = st.N / kBlockN, kslots = st.K / kChainSlotK;
      const uint32_t sbytes = static_cast<uint32_t>(chain_slot_scale_bytes(st.group));
      const unsigned char* wbase = static_cast<const unsigned char*>(st.w);
      const unsigned char* sbase = static_cast<const unsigned char*>(st.scales);
      for (int j = chain_first_job(cta, ctas, rot); j < nblocks; j += ctas) {
        for (int q = 0; q < kslots; ++q) {
          const int w = chain_slot_warp(q);
          const uint32_t c = filled[w]++;
          const uint32_t slot = chain_ring_slot(w, c), use = chain_slot_use(c);
          if (use > 0) ptx::mbarrier_wait_parity(empty_bar(slot), (use - 1) & 1);
          ptx::mbarrier_arrive_expect_tx(full_bar(slot), kChainSlotWeightBytes + sbytes);
          const uint32_t dst = ring_s + slot * kChainSlotBytes;
          ptx::bulk_load(dst, wbase + chain_slot_weight_offset(j, st.K, q), kChainSlotWeightBytes, full_bar(slot));
          ptx::bulk_load(dst + kChainSlotWeightBytes, sbase + chain_slot_scale_offset(j, st.K, st.group, q), sbytes,
                         full_bar(slot));
        }
      }
      rot = (rot + nblocks) % ctas;
    }
    return;
  }

  // ---- consumers --------------------------------------------------------------------------------------------
  const uint32_t k136[4] = {kMagicSub, kMagicSub, kMagicSub, kMagicSub};
  const uint32_t half_sel = scale_prmt_selector(swap_scale_half(lane), kF16Scales);
  const int scale_t = swap_scale_t(lane);
  uint32_t taken = 0;  // slots this warp consumed so far
  // kWarpCopies: the warp's own copies run kChainSlotsPerWarp - 1 slots ahead of its consumption, across stages.
  const uint32_t ring_s = ptx::smem_addr(ring);
  WarpSlotCursor cursor{stages, n_stages, cta, ctas, warp};
  uint32_t issued = 0;
  if constexpr (kWarpCopies) {
    cursor.enter_stage();
    for (int i = 0; i < kChainSlotsPerWarp - 1; ++i, ++issued) {
      issue_warp_slot(cursor, ring_s, chain_ring_slot(warp, issued), lane);
      if (cursor.valid()) cursor.next();
    }
  }
  uint32_t jobs_done = 0;
  int64_t rot = 0;
  const __nv_bfloat16* prev_y = nullptr;
  int prev_n = 0;
  for (int s = 0; s < n_stages; ++s) {
    const ChainStage st = load_stage(stages, s);
    const int K = st.K, N = st.N, pitch = K + kChainXPad;
    if (s > 0) {
      consumers_sync();  // every consumer warp is done with stage s - 1: its stores, its reads of xs and red
      if (tid == 0) {
        __threadfence();
        release_add(counters + s - 1, 1u);
        while (acquire_load(counters + s - 1) < static_cast<uint32_t>(ctas)) {
        }
        if (st.delay_ns > 0) {
          const uint64_t t0 = global_ns();
          while (global_ns() - t0 < static_cast<uint64_t>(st.delay_ns)) {
          }
        }
        *consumer_stage = s;
      }
      consumers_sync();
    }
    // Stage x_s: M rows of K, 8 elements per 16-byte load, from L2 (other CTAs wrote y_{s-1} in this launch). A
    // thread's loads of kStageBatch units are issued before any is used: one L2 round trip per batch (the 8B down's
    // 14336 SwiGLU inputs at M = 1 are 4 units a thread), where a plain loop would pay one per unit.
    {
      constexpr int kStageBatch = 4;
      const int units_per_row = K / 8, units = M * units_per_row;
      const bool swiglu = s > 0 && st.input == ChainInput::swiglu;
      for (int base = tid; base < units; base += kStageBatch * kConsumerThreads) {
        uint4 v[kStageBatch], u[kStageBatch];
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
          const int i = base + b * kConsumerThreads;
          if (i >= units) continue;
          const int m = i / units_per_row, c = i - m * units_per_row;
          if (s == 0) {
            v[b] = __ldcg(reinterpret_cast<const uint4*>(x0 + static_cast<int64_t>(m) * K) + c);
          } else {
            const __nv_bfloat16* row = prev_y + static_cast<int64_t>(m) * prev_n + st.input_offset;
            v[b] = __ldcg(reinterpret_cast<const uint4*>(row) + c);
            if (swiglu) u[b] = __ldcg(reinterpret_cast<const uint4*>(row + K) + c);
          }
        }
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
          const int i = base + b * kConsumerThreads;
          if (i >= units) continue;
          const int m = i / units_per_row, c = i - m * units_per_row;
          if (swiglu) {
            float gf[8], uf[8];
            ops::bf16x8_to_f32(v[b], gf);
            ops::bf16x8_to_f32(u[b], uf);
            v[b].x = ops::pack_bf16x2_rn(ops::silu_mul(gf[0], uf[0]), ops::silu_mul(gf[1], uf[1]));
            v[b].y = ops::pack_bf16x2_rn(ops::silu_mul(gf[2], uf[2]), ops::silu_mul(gf[3], uf[3]));
            v[b].z = ops::pack_bf16x2_rn(ops::silu_mul(gf[4], uf[4]), ops::silu_mul(gf[5], uf[5]));
            v[b].w = ops::pack_bf16x2_rn(ops::silu_mul(gf[6], uf[6]), ops::silu_mul(gf[7], uf[7]));
          }
          *reinterpret_cast<uint4*>(xs + static_cast<int64_t>(m) * pitch + c * 8) = v[b];
        }
      }
    }
    consumers_sync();

    const int nblocks = N / kBlockN, kslots = K / kChainSlotK;
    const int blocks_per_group = st.group / kBlockK;
    const uint32_t x_lane = ptx::smem_addr(xs) + 2 * static_cast<uint32_t>(xb_frag_offset(lane, 0, pitch, M));
    for (int j = chain_first_job(cta, ctas, rot); j < nblocks; j += ctas) {
      float acc[2][4] = {}, part[2][4] = {}, corr[4] = {};
      for (int q = warp; q < kslots; q += kChainConsumerWarps) {
        const uint32_t slot = chain_ring_slot(warp, taken), use = chain_slot_use(taken);
        ++taken;
        if constexpr (kWarpCopies) {
          // Refill the slot consumed last, then wait for this one (the oldest of the groups in flight).
          issue_warp_slot(cursor, ring_s, chain_ring_slot(warp, issued++), lane);
          if (cursor.valid()) cursor.next();
          ptx::cp_async_wait_group<kChainSlotsPerWarp - 1>();
          __syncwarp();  // the scale pieces other lanes copied
          (void)use;
        } else {
          ptx::mbarrier_wait_parity(full_bar(slot), use & 1);
        }
        const unsigned char* sl = ring + slot * kChainSlotBytes;
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(sl + kChainSlotWeightBytes) + scale_t * 8;
        const uint32_t xq = x_lane + static_cast<uint32_t>(q) * kChainSlotK * 2;
#pragma unroll
        for (int b = 0; b < kChainSlotBlocks; ++b) {
          const uint4 wq = *reinterpret_cast<const uint4*>(sl + b * 512 + lane * 16);
          uint32_t f[16];
          biased_word<true>(wq.x, f);
          biased_word<true>(wq.y, f + 4);
          biased_word<true>(wq.z, f + 8);
          biased_word<true>(wq.w, f + 12);
          uint32_t xb[4];
          ptx::ldmatrix_x4(xb, xq + b * kBlockK * 2);
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
            const uint32_t bx[2] = {xb[2 * ks], xb[2 * ks + 1]};
#pragma unroll
            for (int np = 0; np < 2; ++np) {
              const uint32_t a[4] = {f[(2 * ks + np) * 4], f[(2 * ks + np) * 4 + 1], f[(2 * ks + np) * 4 + 2],
                                     f[(2 * ks + np) * 4 + 3]};
              ptx::mma_m16n8k16_bf16(part[np], a, bx);
            }
            ptx::mma_m16n8k16_bf16(corr, k136, bx);
          }
          if ((b + 1) % blocks_per_group == 0) {
            // The group ends with this block (a slot holds whole groups): acc += scale * (part - corr).
            const int gl = (b + 1) / blocks_per_group - 1;
            const uint4 sv = *reinterpret_cast<const uint4*>(sc + gl * kScalesPerGroupBlock);
            float sg[kTilesPerBlock];
            swapped_tile_scales<kF16Scales>(sv, half_sel, sg);
#pragma unroll
            for (int np = 0; np < 2; ++np)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                acc[np][e] = fmaf(part[np][e] - corr[e], sg[2 * np + (e >> 1)], acc[np][e]);
                part[np][e] = 0.0f;
              }
#pragma unroll
            for (int e = 0; e < 4; ++e) corr[e] = 0.0f;
          }
        }
        if constexpr (kWarpCopies) {
          __syncwarp();  // every lane has read the slot before any refills it
        } else {
          // Every lane's generic-proxy reads of the slot ordered before the bulk copy (async proxy) that refills it
          // once the producer sees the release (racecheck reported the WAR without the fence).
          ptx::fence_proxy_async_shared();
          __syncwarp();
          if (lane == 0) ptx::mbarrier_arrive(empty_bar(slot));
        }
      }
      // Warps 1.. hand their sums to warp 0 (two buffers: a buffer is rewritten only after warp 0 passed the next
      // job's barrier, i.e. after it read this one).
      float* rb = red + (jobs_done & 1) * (kChainConsumerWarps * 8 * 32);
      ++jobs_done;
      if (warp > 0) {
#pragma unroll
        for (int np = 0; np < 2; ++np)
#pragma unroll
          for (int e = 0; e < 4; ++e) rb[(warp * 8 + np * 4 + e) * 32 + lane] = acc[np][e];
      }
      consumers_sync();
      if (warp == 0) {
        for (int w2 = 1; w2 < kChainConsumerWarps; ++w2)
#pragma unroll
          for (int np = 0; np < 2; ++np)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[np][e] += rb[(w2 * 8 + np * 4 + e) * 32 + lane];
#pragma unroll
        for (int np = 0; np < 2; ++np)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int m = swap_c_m(lane, e);
            if (m < M)
              st.y[static_cast<int64_t>(m) * N + static_cast<int64_t>(j) * kBlockN + swap_c_n(lane, np, e)] =
                  __float2bfloat16_rn(acc[np][e]);
          }
      }
    }
    rot = (rot + nblocks) % ctas;
    prev_y = st.y;
    prev_n = N;
  }
  if constexpr (kWarpCopies) ptx::cp_async_wait_group<0>();  // only empty groups are left; leave none behind
  // The last stage's completion, so that every counter reads `ctas` after a launch (the tests check it).
  consumers_sync();
  if (tid == 0) {
    __threadfence();
    release_add(counters + n_stages - 1, 1u);
  }
}

}  // namespace futransformer::cuda::w4a16
