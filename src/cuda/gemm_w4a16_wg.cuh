// W4A16 GEMM, warpgroup path (Tiling::wgmma, M <= 32): the swapped v4 kernel's data flow with one wgmma per four
// warps instead of one mma.sync per warp and activation tile. Same packed weights, scales, cp.async ring, cross-warp
// and split-K reductions and epilogues (gemm_w4a16.cuh, gemm_w4a16_v4.cuh); what differs (layout in
// gemm_w4a16_layout.h, "Warpgroup path"):
// - A warpgroup is four consecutive warps on four consecutive n blocks and the same K range. Each warp's packed word
//   (ks, np) becomes the A fragment of its 16 x 16 weight tile in registers (exact u - 8: lop3 + sub.bf16x2), and one
//   wgmma.m64nNk16 multiplies the four tiles by the N = 8 * ceil(M / 8) activation columns, read from shared memory
//   through a descriptor: per 512-byte block a warp issues 4 wgmma whatever M is, where mma.sync needs 4 per 8 rows
//   plus the ldmatrix loads of the activations.
// - wgmma is asynchronous: a pair of blocks is dequantised into two register sets, then its eight wgmmas run while
//   the warp refills the ring and loads the next pair (ptxas serialises wgmmas whose A registers are written while
//   an earlier group is pending, so the next pair's conversion waits for them); wait_group 0 also before a group's
//   partial sums are scaled into the fp32 sums (acc += s * part; the first wgmma after that restarts the partial
//   sums, scale-d = 0).
#pragma once

#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_w4a16_v4.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/ptx/wgmma_16bit.cuh"

namespace futransformer::cuda::w4a16 {

// wgmma.m64n(8 kTiles)k16, A from registers, B K-major.
template <int kTiles>
__device__ __forceinline__ void wg_mma(float (&d)[4 * kTiles], const uint32_t (&a)[4], uint64_t db, uint32_t accumulate) {
  if constexpr (kTiles == 1) {
    ptx::wgmma_bf16_rs_kmajor_m64n8k16(d, a, db, accumulate);
  } else if constexpr (kTiles == 2) {
    ptx::wgmma_bf16_rs_kmajor_m64n16k16(d, a, db, accumulate);
  } else if constexpr (kTiles == 3) {
    ptx::wgmma_bf16_rs_kmajor_m64n24k16(d, a, db, accumulate);
  } else {
    static_assert(kTiles == 4, "one to four n = 8 activation tiles (M <= 32)");
    ptx::wgmma_bf16_rs_kmajor_m64n32k16(d, a, db, accumulate);
  }
}

// The 16 A registers of one packed block (word w = 2 ks + np gives f[4 w .. 4 w + 3], A fragment order v4_slot).
__device__ __forceinline__ void wg_dequant_block(const uint4& q, uint32_t (&f)[16]) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    f[4 * w + 0] = dequant_slot<0>(words[w]);
    f[4 * w + 1] = dequant_slot<8>(words[w]);
    f[4 * w + 2] = dequant_slot<4>(words[w]);
    f[4 * w + 3] = dequant_slot<12>(words[w]);
  }
}

// Activation rows into the swizzled panels (wg_x_offset) after griddepcontrol.wait, then wait for every cp.async
// group and the whole CTA (as wait_then_stage_rows).
__device__ __forceinline__ void wg_wait_then_stage_rows(const KernelArgs& args, int rows, int64_t k0, int slice_k,
                                                        unsigned char* a_s, int tid, int nthreads) {
  ptx::griddepcontrol_wait();
  const int row_chunks = slice_k / 8;
  const int n_tokens = wg_tokens(rows);
  for (int c = tid; c < rows * row_chunks; c += nthreads) {
    const int r = c / row_chunks, cc = c % row_chunks;
    ptx::cp_async_16(ptx::smem_addr(a_s + wg_x_offset(r, cc, n_tokens)),
                     args.x + static_cast<int64_t>(r) * args.K + k0 + cc * 8);
  }
  ptx::cp_async_commit_group();
  ptx::cp_async_wait_group<0>();
  ptx::fence_proxy_async_shared();  // cp.async wrote through the generic proxy; wgmma reads through the async one
  __syncthreads();
}

// Streamed activations: a panel (64 columns of M <= 32 rows) is at most 256 chunks of 16 bytes, one per thread of
// the CTA. Thread tid copies chunk tid (row tid / 8, chunk tid % 8) of every panel: its source advances 64 columns
// per panel, its place in a panel is fixed. The panels are fetched in order, so the copy is a running cursor: the
// source, the columns left in the slice for this thread's chunk and the ring slot to write, each advanced by an add
// (and the slot by a compare), where recomputing j % kPanels and the 64-bit source per panel cost about twelve
// instructions a pair (twenty-seventh session, ncu source counters).
template <int kNTokens, int kPanels>
struct WgPanelCursor {
  static constexpr uint32_t kPanelBytes = kNTokens * 128;
  static constexpr uint32_t kRingBytes = kPanels * kPanelBytes;
  const __nv_bfloat16* src;  // this thread's chunk of the next panel to fetch
  int left;                  // columns of the slice from that chunk on (> 0: the chunk exists; -1: no chunk at all)
  uint32_t write;            // shared address of the chunk's place in the next panel's slot

  __device__ __forceinline__ WgPanelCursor(const KernelArgs& args, int rows, int64_t k0, int slice_k, int tid,
                                           uint32_t a_addr) {
    constexpr int kChunks = kWgPanelK / 8;
    static_assert(kNTokens * kChunks <= kThreads, "one chunk per thread");
    const int r = tid / kChunks, cc = tid % kChunks;
    src = args.x + static_cast<int64_t>(r) * args.K + k0 + cc * 8;
    left = r < rows ? slice_k - cc * 8 : -1;
    write = a_addr + (r < rows ? static_cast<uint32_t>(wg_x_offset(r, cc, kNTokens)) : 0u);
    ring_begin = a_addr;
  }
  // The next panel (slice columns 64 j .. 64 j + 63 for the j-th call) into its ring slot; a cp.async copy the caller
  // commits.
  __device__ __forceinline__ void fetch() {
    if (left > 0) ptx::cp_async_16(write, src);
    src += kWgPanelK;
    left -= kWgPanelK;
    write += kPanelBytes;
    if (write >= ring_begin + kRingBytes) write -= kRingBytes;
  }

 private:
  uint32_t ring_begin;
};

// kStreamStages > 0: activations streamed through the panel ring (Tiling::stream_x: warps_k = 1, a weight ring of
// kStreamStages slots, kWgStreamStages or kWgStreamDeepStages) instead of staged for the whole slice.
template <int kTiles, bool kF16Scales, int kStreamStages = 0, bool kCluster = false>
__global__ void __launch_bounds__(kThreads, kWgMinBlocksPerSm) gemm_w4a16_wg_kernel(const KernelArgs args) {
  static_assert(kTiles >= 1 && kTiles <= kWgMaxM / 8, "one to four n = 8 activation tiles");
  constexpr int kAccRegs = 4 * kTiles;  // fp32 registers of one m64n(8 kTiles) accumulator per thread
  constexpr bool kStream = kStreamStages > 0;
  static_assert(!kStream || wg_stream_stages_ok(kStreamStages), "a streamed ring of 8 or 16 slots");
  constexpr int kRing = kStream ? kStreamStages : kStages;
  constexpr int kPanels = wg_stream_panels(kRing);  // streamed only
  constexpr int kPairs = kRing / 2;
  constexpr int kNTokens = 8 * kTiles;
  constexpr uint32_t kPanelBytes = kNTokens * 128;
  ptx::griddepcontrol_launch_dependents();

  extern __shared__ __align__(16) unsigned char smem[];
  Tiling t = args.tiling;
  t.warps = kWarps;  // the warpgroup path runs 8-warp CTAs only (tiling_is_valid)
  t.stages = kRing;
  const int K = args.K, group = args.group;
  const int tid = threadIdx.x, lane = tid & 31;
  // Broadcast from lane 0 so the compiler knows the warp index, and all that follows from it (the warp's K steps,
  // the loop bounds, the panel descriptors), is warp-uniform: it keeps them in uniform registers.
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int wn = warp % t.warps_n, wk = warp / t.warps_n;

  const int group_shift = __ffs(group) - 1;
  const int64_t groups = K / group;
  const Range gr = split_range(groups, t.splits, blockIdx.y);
  const int64_t sgm = slice_groups_max(groups, t.splits);
  const int64_t k0 = gr.begin * group;
  const int slice_k = static_cast<int>((gr.end - gr.begin) * group);
  const SmemLayout lay = smem_layout(t, K, group);
  // The swizzled panels need a 1024-byte aligned base (smem_layout reserves the slack in a_bytes).
  const uint32_t smem_base = ptx::smem_addr(smem);
  const uint32_t a_pad = ((smem_base + static_cast<uint32_t>(kWgAlign) - 1) & ~static_cast<uint32_t>(kWgAlign - 1)) -
                         smem_base;
  unsigned char* a_s = smem + a_pad;
  const uint32_t a_addr = smem_base + a_pad;
  uint16_t* s_s = reinterpret_cast<uint16_t*>(smem + lay.a_bytes);
  unsigned char* ring = smem + lay.ring_offset;

  // Weights and scales before griddepcontrol.wait, activations after it (as v2 / v4).
  const int64_t nb0 = static_cast<int64_t>(blockIdx.x) * t.warps_n;
  stage_slice_scales(args, t, gr, groups, sgm, nb0, s_s, tid, kThreads);
  ptx::cp_async_commit_group();

  const int64_t nb = nb0 + wn;
  const Range steps = split_range(slice_k / kBlockK, t.warps_k, wk);  // the same for the four warps of a warpgroup
  const int n_steps = static_cast<int>(steps.end - steps.begin);
  const int64_t kb0 = k0 / kBlockK + steps.begin;
  const uint4* wsrc = args.w + (nb * (K / kBlockK) + kb0) * kWarpSize + lane;
  const uint32_t ring_lane = ptx::smem_addr(ring + tid * 16);
  prefetch_ring_pairs<kPairs, kThreads>(ring_lane, wsrc, n_steps);

  WgPanelCursor<kNTokens, kPanels> panels(args, t.rows, k0, slice_k, tid, a_addr);
  if constexpr (kStream) {
    // The panels of the pairs whose weights are already in flight; later ones ride with their pair's weights.
    ptx::griddepcontrol_wait();
#pragma unroll
    for (int j = 0; j < kPairs - 1; ++j) panels.fetch();
    ptx::cp_async_commit_group();
    ptx::cp_async_wait_group<0>();
    ptx::fence_proxy_async_shared();
    __syncthreads();
  } else {
    wg_wait_then_stage_rows(args, t.rows, k0, slice_k, a_s, tid, kThreads);
  }

  float acc[2][kAccRegs] = {};  // [np][4 j + e]: element e of token tile j of 16-row tile np
  float part[2][kAccRegs] = {};  // this group's sums since the last flush (restarted by the first wgmma of a group)
  // Descriptor of this warp's first k16 step; block i, step ks adds wg_b_desc_offset's bytes for its column.
  const uint64_t desc0 = fp8::make_smem_desc(a_addr);
  const int kcol0 = static_cast<int>(kb0) * kBlockK;  // K < 2^18
  const int slice_col0 = static_cast<int>(steps.begin) * kBlockK;
  const int group_base = static_cast<int>(gr.begin);
  const uint16_t* s_lane = s_s + s_frag_offset(wn, 0, sgm, swap_scale_t(lane));
  const uint32_t half_sel = scale_prmt_selector(swap_scale_half(lane), kF16Scales);
  bool fresh = true;  // the next wgmma starts the partial sums (scale-d = 0)
  GroupCursor groups_left(kcol0, group, group_shift, group_base);  // the v4 loop's group bookkeeping

  // The partial sums of the group with scale index gl into the sums (acc += s * part), once its wgmmas are done.
  auto flush = [&](int gl) {
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int np = 0; np < 2; ++np)
#pragma unroll
      for (int r = 0; r < kAccRegs; ++r) ptx::fence_operand(part[np][r]);
    const uint4 sv = *reinterpret_cast<const uint4*>(s_lane + gl * kScalesPerGroupBlock);
    float s[kTilesPerBlock];
    swapped_tile_scales<kF16Scales>(sv, half_sel, s);
#pragma unroll
    for (int np = 0; np < 2; ++np)
#pragma unroll
      for (int r = 0; r < kAccRegs; ++r) acc[np][r] = fmaf(part[np][r], s[2 * np + ((r & 3) >> 1)], acc[np][r]);
  };

  // Block i (warp-local) from its A registers f: four wgmma, one commit group. Streamed: panel_desc is the
  // descriptor of block i's panel in the ring (block i is half i & 1 of panel i / 2; warps_k = 1, so i counts from
  // the slice start). restart: scale-d of the first k16 step is 0 (the block starts a group's partial sums).
  auto issue_block = [&](uint32_t (&f)[16], int i, uint64_t panel_desc, bool restart) {
    uint64_t db[2];
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      db[ks] = kStream ? fp8::advance_smem_desc(panel_desc, static_cast<uint32_t>((i & 1) * 64 + ks * 32))
                       : fp8::advance_smem_desc(
                             desc0, static_cast<uint32_t>(wg_b_desc_offset(slice_col0 + i * kBlockK + 16 * ks, kNTokens)));
    }
    uint32_t accumulate[2] = {restart ? 0u : 1u, 1u};  // scale-d of k16 steps 0 and 1
    // Every input register of the batch is defined before the fence (ptxas serialises the wgmmas otherwise).
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) ptx::fence_operand(db[ks]), ptx::fence_operand(accumulate[ks]);
#pragma unroll
    for (int r = 0; r < 16; ++r) ptx::fence_operand(f[r]);
#pragma unroll
    for (int np = 0; np < 2; ++np)
#pragma unroll
      for (int r = 0; r < kAccRegs; ++r) ptx::fence_operand(part[np][r]);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const uint32_t a[4] = {f[(2 * ks + np) * 4], f[(2 * ks + np) * 4 + 1], f[(2 * ks + np) * 4 + 2],
                               f[(2 * ks + np) * 4 + 3]};
        wg_mma<kTiles>(part[np], a, db[ks], accumulate[ks]);
      }
    }
    ptx::wgmma_commit_group();
  };
  // The same, then the flush at a group's end (any group size, any range start).
  auto run_block = [&](uint32_t (&f)[16], int i, uint64_t panel_desc) {
    issue_block(f, i, panel_desc, fresh);
    fresh = false;
    if (!groups_left.block_ends_group() && i != n_steps - 1) return;
    flush(groups_left.next_group());
    fresh = true;
  };

  int fetch = 2 * (kPairs - 1);
  const uint4* wnext = wsrc + fetch * kWarpSize;
  const uint32_t ring_smem = ptx::smem_addr(ring);
  RingCursor<kRing, kThreads> cursor(tid);
  // One pair's turn of the ring: refill the slots the previous pair used, wait for this pair's copies, read its two
  // packed blocks into q0 / q1 and wait for the previous pair's wgmmas (ptxas serialises wgmmas whose input registers
  // are defined while an earlier wgmma group is pending, so both blocks' A registers are built after this wait, and
  // the pair's eight wgmmas run while the ring is refilled and the next pair is loaded). A pair without a second
  // block reads an older block, or a slot never written, into q1: converted, never used.
  // full: every pair of the range has two blocks (n_steps even), so a fetched pair is whole or past the end.
  auto next_pair = [&](uint4& q0, uint4& q1, bool full) {
    if (full) {
      if (fetch < n_steps) issue_ring_pair<kThreads>(ring_smem + cursor.fetch, 0, wnext, 2);  // both blocks
    } else {
      issue_ring_pair<kThreads>(ring_smem + cursor.fetch, fetch, wnext, n_steps);
    }
    // Streamed: the panel of the fetched pair, into the slot of the pair two before this one, which every warp
    // finished with before the previous pair's barrier.
    if constexpr (kStream) panels.fetch();
    ptx::cp_async_commit_group();
    fetch += 2;
    wnext += 2 * kWarpSize;
    ptx::cp_async_wait_group<kPairs - 1>();
    const unsigned char* slot0 = ring + cursor.read;
    cursor.advance();
    q0 = *reinterpret_cast<const uint4*>(slot0);
    q1 = *reinterpret_cast<const uint4*>(slot0 + kThreads * 16);
    ptx::wgmma_wait_group<0>();
    if constexpr (kStream) {
      // Every thread's copies of this pair's panel have landed (the wait above) and every warp is done with the
      // wgmmas of the pair before (its wait): the panel may be read, and the next pair may overwrite the one before.
      ptx::fence_proxy_async_shared();
      __syncthreads();
    }
  };
  // Streamed: the descriptor of the current pair's panel (the start address field takes 16-byte units; see
  // fp8::advance_smem_desc), and its byte offset in the panel ring, kept beside it as the 32-bit wrap test.
  uint64_t panel_desc = desc0;
  uint32_t panel_read = 0;
  auto advance_panel = [&] {
    if constexpr (kStream) {
      panel_read += kPanelBytes;
      panel_desc += kPanelBytes >> 4;
      if (panel_read == kPanels * kPanelBytes) panel_read = 0, panel_desc = desc0;
    }
  };
  bool group_units = false;  // the streamed tilings always give warps_k = 1 and whole pairs; tested, not assumed
  if constexpr (kStream) group_units = group == 4 * kBlockK && t.warps_k == 1 && n_steps % 4 == 0;
  if (group_units) {
    // Streamed with groups of 128 columns: the slice is whole groups (warps_k = 1), so every pair is full and a group
    // is exactly two pairs. Each iteration runs one group with its restart and flush fixed at compile time, without
    // the per-block group bookkeeping and tests of the general loop below.
    for (int i0 = 0, gl = 0; i0 < n_steps; i0 += 4, ++gl) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 q0, q1;
        next_pair(q0, q1, true);
        uint32_t f0[16], f1[16];
        wg_dequant_block(q0, f0);
        wg_dequant_block(q1, f1);
        issue_block(f0, 0, panel_desc, h == 0);
        issue_block(f1, 1, panel_desc, false);
        advance_panel();
      }
      flush(gl);
    }
  } else {
    for (int i0 = 0; i0 < n_steps; i0 += 2) {
      uint4 q0, q1;
      next_pair(q0, q1, false);
      const bool has1 = i0 + 1 < n_steps;  // uniform over the warpgroup: only the last pair can be a single block
      uint32_t f0[16], f1[16];
      wg_dequant_block(q0, f0);
      wg_dequant_block(q1, f1);
      run_block(f0, i0, panel_desc);
      if (has1) run_block(f1, i0 + 1, panel_desc);
      advance_panel();
    }
  }
  ptx::cp_async_wait_group<0>();
  ptx::wgmma_wait_group<0>();  // the last block always flushed; kept for the compiler's register view

  // acc[np][4 j + e] is the swapped paths' accumulator tile j * 2 + np, element e.
  auto acc_at = [&](int j, int e) { return acc[j & 1][4 * (j >> 1) + e]; };
  if (t.warps_k > 1) {
    constexpr int kAcc = 2 * kAccRegs;
    float* red = reinterpret_cast<float*>(smem);
    static_assert(kAcc <= (kNTokens + 15) / 16 * 16, "smem_layout sizes the reduction buffer for m_tiles * 16 floats per lane");
    __syncthreads();
    if (wk > 0) {
#pragma unroll
      for (int np = 0; np < 2; ++np)
#pragma unroll
        for (int r = 0; r < kAccRegs; ++r) red[(warp * kAcc + np * kAccRegs + r) * kWarpSize + lane] = acc[np][r];
    }
    __syncthreads();
    if (wk == 0) {
      for (int w2 = 1; w2 < t.warps_k; ++w2) {
        const float* src = red + (w2 * t.warps_n + wn) * kAcc * kWarpSize + lane;
#pragma unroll
        for (int np = 0; np < 2; ++np)
#pragma unroll
          for (int r = 0; r < kAccRegs; ++r) acc[np][r] += src[(np * kAccRegs + r) * kWarpSize];
      }
    }
  }
  if constexpr (kCluster) {
    cluster_tail(args, smem, wk == 0,
                 [&](const EpilogueOut& o) { store_swapped<kTiles>(o, nb, lane, blockIdx.y, acc_at); });
  } else {
    if (wk != 0) return;
    store_swapped<kTiles>(args.out(), nb, lane, blockIdx.y, acc_at);
  }
}

}  // namespace futransformer::cuda::w4a16
