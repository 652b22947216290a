// W4A16 GEMM, variant v4: the v2 kernel (gemm_w4a16.cuh) with less work per weight byte inside the SM, which is
// where v2 was limited (docs/notes/w4a16-tuning.md: the packed stream alone reaches 4.3 TB/s, v2 1.2-2.3 TB/s).
// Same packed weights and scales, same staging, ring, cross-warp and split-K reductions; three changes:
// 1. No sub.bf16x2: the MMA operand is the exact bf16 integer 128 + u of the lop3 (u - 8 + 136). The offset
//    136 * sum_k x is removed in fp32 when a group is flushed. That sum comes from the same bf16 activation
//    registers through one extra mma per k16 step whose other operand is the constant 136 (exact products), into
//    its own accumulator restarted with the group's partial sums, so it covers exactly the k the partial sums
//    cover, also for a warp whose range starts or ends inside a group.
// 2. M <= 8 ("swapped"): the packed word (ks, np) is the A fragment of a 16 x 16 weight tile as it stands (see
//    v4_slot), activations are the m = 8 B operand: 4 mma per block instead of 8, and no MMA row wasted.
// 3. Two 512-byte blocks per loop iteration: one commit / wait and one loop test per pair, and two independent
//    dequant chains for the scheduler.
// The CTA size and ring depth are template parameters (kV4KernelShapes lists the compiled ones) so that the
// bytes in flight per SM can be swept (docs/notes/w4a16-tuning.md); M = 9..16 can also run swapped with two n = 8
// activation tiles (kSwapTiles = 2): 8 weight mma per block like the 16-row path, and the 136 * sum(x) chain as one
// mma per k16 step whose A operand is the activations themselves (swap16_a_tile), its rows moved to the lanes
// that need them by four shuffles per group flush. M = 17..32 runs swapped with three (M <= 24) or four n = 8 tiles
// (swap32, kSwapTiles = 3 / 4): per k16 step two ldmatrix give the tiles' B registers (swap32_xb_offset), each weight
// fragment meets every tile, and each tile has its own offset chain with 136 as A (as M <= 8), in place for the flush.
// kNormRows (M <= 8 only): the activations are RMSNorm(x) of fp32 rows, normalised while they are staged
// (gemm_w4a16_norm.cuh); everything after the staging is the plain instance's code.
#pragma once

#include "cuda/gemm_w4a16.cuh"
#include "cuda/gemm_w4a16_norm.cuh"
#include "cuda/ptx/sreg.cuh"

#include <type_traits>

namespace futransformer::cuda::w4a16 {

// bf16x2 {128 + u_lo, 128 + u_hi} of slot kShift / 4 of a packed word: (a & b) | c, no subtract.
template <int kShift>
__device__ __forceinline__ uint32_t biased_slot(uint32_t word) {
  return ptx::lop3<0xea>(word >> kShift, kMagicMask, kMagicBias);
}

// The four registers built from one packed word, in fragment order (v4_slot).
template <bool kSwap>
__device__ __forceinline__ void biased_word(uint32_t word, uint32_t* f) {
  if constexpr (kSwap) {
    f[0] = biased_slot<0>(word);
    f[1] = biased_slot<8>(word);
    f[2] = biased_slot<4>(word);
    f[3] = biased_slot<12>(word);
  } else {
    f[0] = biased_slot<0>(word);
    f[1] = biased_slot<4>(word);
    f[2] = biased_slot<8>(word);
    f[3] = biased_slot<12>(word);
  }
}

// One scale as fp32 from half `sel` of a staged scale pair (prmt selectors, see the kernel).
template <bool kF16Scales>
__device__ __forceinline__ float scale_from_half(uint32_t pair, uint32_t sel) {
  if constexpr (kF16Scales) {
    const uint32_t bits = ptx::prmt(pair, 0u, sel);  // the half in bits 0..15, zeros above
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  } else {
    return __uint_as_float(ptx::prmt(pair, 0u, sel));  // the half in bits 16..31, zeros below: its fp32
  }
}

// Swapped paths: the scales of the four 8-column tiles a lane needs, half `half_sel` (scale_prmt_selector) of each
// word of its staged 16-byte scale vector, as fp32.
template <bool kF16Scales>
__device__ __forceinline__ void swapped_tile_scales(const uint4& sv, uint32_t half_sel, float (&s)[kTilesPerBlock]) {
  s[0] = scale_from_half<kF16Scales>(sv.x, half_sel);
  s[1] = scale_from_half<kF16Scales>(sv.y, half_sel);
  s[2] = scale_from_half<kF16Scales>(sv.z, half_sel);
  s[3] = scale_from_half<kF16Scales>(sv.w, half_sel);
}

// The warp's first kPairs - 1 pairs of packed blocks (from wsrc, this lane's 16 bytes of its first block) into ring
// slots 0 .. 2 kPairs - 3 at ring_lane (this thread's slot 0), one cp.async group per pair; blocks past n_steps are
// not copied, their groups stay empty so the wait counts in the loop are uniform.
template <int kPairs, int kThreadsCta>
__device__ __forceinline__ void prefetch_ring_pairs(uint32_t ring_lane, const uint4* wsrc, int n_steps) {
#pragma unroll
  for (int p = 0; p < kPairs - 1; ++p) {
    if (2 * p < n_steps) ptx::cp_async_16(ring_lane + 2 * p * kThreadsCta * 16, wsrc + 2 * p * kWarpSize);
    if (2 * p + 1 < n_steps)
      ptx::cp_async_16(ring_lane + (2 * p + 1) * kThreadsCta * 16, wsrc + (2 * p + 1) * kWarpSize);
    ptx::cp_async_commit_group();
  }
}

// Blocks fetch (even) and fetch + 1 of the warp (wnext: this lane's 16 bytes of block fetch) into the lane's pair
// of ring slots starting at shared-window address `slot`, those below n_steps; the caller commits. Both copies
// share one address (the second is an immediate offset from it).
template <int kThreadsCta>
__device__ __forceinline__ void issue_ring_pair(uint32_t slot, int fetch, const uint4* wnext, int n_steps) {
  if (fetch + 1 < n_steps) {
    ptx::cp_async_16(slot, wnext);
    ptx::cp_async_16(slot + kThreadsCta * 16, wnext + kWarpSize);
  } else if (fetch < n_steps) {
    ptx::cp_async_16(slot, wnext);
  }
}

// The lane's place in the weight ring as two running byte offsets from the ring's start: `read`, its slot of block
// i0 (slot i0 % kRing), and `fetch`, the pair of slots refilled in this iteration — the pair the previous iteration
// consumed (blocks are fetched kRing - 2 ahead). Advancing is an add and a compare; recomputing
// (i & (kRing - 1)) · slot bytes + tid · 16 every iteration cost about ten instructions, the compiler re-reading the
// thread index to save a register.
template <int kRing, int kThreadsCta>
struct RingCursor {
  static constexpr uint32_t kSlotBytes = kThreadsCta * 16;
  static constexpr uint32_t kRingBytes = kRing * kSlotBytes;
  uint32_t read, fetch;
  __device__ __forceinline__ explicit RingCursor(int tid)
      : read(static_cast<uint32_t>(tid) * 16), fetch(static_cast<uint32_t>(tid) * 16 + (kRing - 2) * kSlotBytes) {}
  __device__ __forceinline__ void advance() {
    fetch = read;
    read += 2 * kSlotBytes;
    if (read >= kRingBytes) read -= kRingBytes;
  }
};

// The group bookkeeping of a warp's K range as running counters (warp-uniform): blocks left in the current group —
// the range may start inside one — and that group's index among the staged scales. Two instructions per block where
// recomputing the block's column and testing it against the group took about five. kcol0: the range's first column;
// group_base: the first group of the CTA's K slice.
struct GroupCursor {
  int blocks, left, at;
  __device__ __forceinline__ GroupCursor(int kcol0, int group, int group_shift, int group_base)
      : blocks(group / kBlockK), left(group / kBlockK - (kcol0 & (group - 1)) / kBlockK),
        at((kcol0 >> group_shift) - group_base) {}
  // After a block: whether it ended its group.
  __device__ __forceinline__ bool block_ends_group() { return --left == 0; }
  // The ending group's scale index; the cursor moves to the next group.
  __device__ __forceinline__ int next_group() {
    left = blocks;
    return at++;
  }
  // Whether the current group holds blocks not flushed yet (a range that ended inside it).
  __device__ __forceinline__ bool open() const { return left != blocks; }
};

// The qkv prologue after the unsplit GEMM's store (kQkvTail; gemm_w4a16_qkv_tail.cuh specialises QkvTail<true> with
// its arguments, its pre-wait tables and the tail itself). The primary template is the plain kernel's.
template <bool kOn>
struct QkvTail {
  using Args = KernelArgs;
};

// kSwapTiles: 0 = 16-row path (activations as A, kMT m tiles), 1 = swapped with one n = 8 activation tile
// (M <= 8), 2 = swapped with two (M = 9..16), 3 / 4 = swapped with three / four (M = 17..24 / 25..32; kMT = 2, the
// m tiles those rows span, which sizes the register cap and the cross-warp reduction buffer). kCtaWarps warps per
// CTA, kRing cp.async slots per thread. kNormRows: the RMSNorm prologue (one activation tile only); its dynamic shared
// memory has kNormScratchBytes more after the ring (smem_layout(...).total). kQkvTail (M <= 8, one K slice): the
// attention prologue of the heads this CTA completes after its store (gemm_w4a16_qkv_tail.cuh); kQkvTailScratchBytes
// more after the ring.
template <int kMT, int kSwapTiles, bool kF16Scales, int kCtaWarps = kWarps, int kRing = kStages, bool kNormRows = false,
          bool kCluster = false, bool kQkvTail = false>
__global__ void __launch_bounds__(kCtaWarps* kWarpSize, min_blocks_per_sm(kMT, kCtaWarps, kSwapTiles == 2))
    gemm_w4a16_v4_kernel(
        const std::conditional_t<kNormRows, NormKernelArgs, typename QkvTail<kQkvTail>::Args> args) {
  static_assert(kMT >= 1 && kMT <= kMaxMTiles, "m tiles must cover 16..64 rows");
  static_assert(kSwapTiles >= 0 && kSwapTiles <= 4, "swapped paths have one to four n = 8 activation tiles");
  static_assert(kSwapTiles == 0 || kMT == (kSwapTiles + 1) / 2, "kMT is the number of m tiles the swapped rows span");
  static_assert(kRing >= 4 && (kRing & (kRing - 1)) == 0, "ring slots are addressed with a mask and used in pairs");
  static_assert(kCtaWarps * kWarpSize <= 1024, "a CTA has at most 1024 threads");
  static_assert(!kNormRows || kSwapTiles == 1, "the RMSNorm prologue serves the M <= 8 swapped path only");
  static_assert(!kQkvTail || (kSwapTiles == 1 && !kNormRows && !kCluster),
                "the qkv tail serves the unsplit M <= 8 swapped path only");
  constexpr bool kSwap = kSwapTiles > 0;
  // swap32: activations loaded per k16 step, two n = 8 tiles per ldmatrix (kMT loads), one offset chain per tile.
  constexpr bool kSwap32 = kSwapTiles > 2;
  constexpr int kThreadsCta = kCtaWarps * kWarpSize;
  constexpr int kPairs = kRing / 2;
  // Accumulator tiles per lane: swapped, 16 (n) x 8 (m) tiles [mt][np] (two per block per activation tile); else
  // kMT x four 16 (m) x 8 (n). The offset chain: one tile per m tile, one for both swap16 activation tiles, one per
  // activation tile for swap32.
  constexpr int kAccTiles = kSwap ? 2 * kSwapTiles : kMT * kTilesPerBlock;
  constexpr int kCorrTiles = kSwap32 ? kSwapTiles : (kSwap ? 1 : kMT);
  constexpr int kXTiles = kSwap && !kSwap32 ? kSwapTiles : kMT;
  // The next kernel may launch now (its CTAs fetch what they can before their wait). Not with the qkv tail: its
  // dependent is the decode attention, whose CTAs, resident this early, crowd onto the SMs this grid leaves free
  // (several per SM) instead of spreading over all of them once it ends; the tail releases it after the store.
  if constexpr (!kQkvTail) ptx::griddepcontrol_launch_dependents();

  extern __shared__ __align__(16) unsigned char smem[];
  Tiling t = args.tiling;
  t.warps = kCtaWarps;  // equal on the host (tiling_is_valid, v4_kernel_any); constants fold smem_layout
  t.stages = kRing;
  const int K = args.K, group = args.group;
  const int tid = threadIdx.x, lane = tid & 31;
  // Broadcast from lane 0 so the compiler knows the warp index, and all that follows from it (the warp's K steps and
  // loop bounds), is warp-uniform: it keeps them in uniform registers.
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int wn = warp % t.warps_n, wk = warp / t.warps_n;

  const int group_shift = __ffs(group) - 1;  // group is 32, 64 or 128
  const int64_t groups = K / group;
  const Range gr = split_range(groups, t.splits, blockIdx.y);
  const int64_t sgm = slice_groups_max(groups, t.splits);
  const int64_t pitch = a_pitch(groups, group, t.splits);
  const int64_t k0 = gr.begin * group;
  const int slice_k = static_cast<int>((gr.end - gr.begin) * group);
  const SmemLayout lay = smem_layout(t, K, group);
  __nv_bfloat16* a_s = reinterpret_cast<__nv_bfloat16*>(smem);
  uint16_t* s_s = reinterpret_cast<uint16_t*>(smem + lay.a_bytes);
  unsigned char* ring = smem + lay.ring_offset;

  // Weights first, activations last. The packed weights and their scales never change between launches, so they
  // are fetched before griddepcontrol.wait: launched as a programmatic dependent (FT_PDL), the CTA fills its ring
  // while the kernel before it still runs and only the activation rows (that kernel's output) wait for it. Without
  // the launch attribute the wait returns at once. Nothing is written before the wait (WAR on shared buffers).
  const int64_t nb0 = static_cast<int64_t>(blockIdx.x) * t.warps_n;
  stage_slice_scales(args, t, gr, groups, sgm, nb0, s_s, tid, kThreadsCta);
  ptx::cp_async_commit_group();

  // This warp's blocks: n block nb, k blocks kb0 .. kb0 + n_steps - 1, consumed in pairs (2p, 2p + 1).
  const int64_t nb = nb0 + wn;
  const Range steps = split_range(slice_k / kBlockK, t.warps_k, wk);
  const int n_steps = static_cast<int>(steps.end - steps.begin);
  const int64_t kb0 = k0 / kBlockK + steps.begin;
  const uint4* wsrc = args.w + (nb * (K / kBlockK) + kb0) * kWarpSize + lane;
  const uint32_t ring_lane = ptx::smem_addr(ring + tid * 16);
  prefetch_ring_pairs<kPairs, kThreadsCta>(ring_lane, wsrc, n_steps);

  const int rows = t.rows;
  if constexpr (kNormRows) {
    wait_then_stage_norm_rows<kThreadsCta>(args, rows, k0, slice_k, pitch, a_s,
                                           reinterpret_cast<float*>(smem + lay.total), tid);
  } else {
    if constexpr (kQkvTail) QkvTail<kQkvTail>::template prepare<kThreadsCta>(args, smem + lay.total, tid);
    wait_then_stage_rows(args, rows, k0, slice_k, pitch, a_s, tid, kThreadsCta);
  }
  // Residual epilogue without a split: the residual rows this CTA adds into are final once griddepcontrol.wait has
  // returned (no other CTA writes these columns), so the storing warps ask L1 for them now and the epilogue's
  // read-modify-write finds them there instead of waiting a round trip to L2 after the main loop. One 128-byte line
  // per row: the 32 fp32 columns of block nb.
  if constexpr (kSwap) {
    if (args.epilogue == Epilogue::residual_f32 && t.splits == 1 && wk == 0 && lane < rows)
      ptx::prefetch_l1(args.residual + static_cast<int64_t>(lane) * args.N + nb * kBlockN);
  }

  float acc[kAccTiles][4] = {};
  float part[kAccTiles][4] = {};   // this group's sums of x * (128 + u), since the last flush
  float corr[kCorrTiles][4] = {};  // the same k's sums of x * 136
  // Constant operand 136 (bf16x2), the offset the flush removes: x * 136 is exact like x * (128 + u).
  const uint32_t k136[4] = {kMagicSub, kMagicSub, kMagicSub, kMagicSub};
  uint32_t x_lane[kXTiles];
#pragma unroll
  for (int mt = 0; mt < kXTiles; ++mt) {
    const int64_t off = kSwap32 ? swap32_xb_offset(lane, mt, 0, pitch, rows)
                                : (kSwap ? xb_frag_offset(lane, 0, pitch, rows, mt)
                                         : a_frag_offset(lane, mt, 0, pitch, false, rows));
    x_lane[mt] = ptx::smem_addr(a_s) + 2 * static_cast<uint32_t>(off);
  }
  // Loop invariants as 32-bit values (registers are the limit at one m tile, see the main loop).
  const uint16_t* s_lane = s_s + s_frag_offset(wn, 0, sgm, kSwap ? swap_scale_t(lane) : (lane & 3));
  const int kcol0 = static_cast<int>(kb0) * kBlockK;            // K < 2^18
  const int group_base = static_cast<int>(gr.begin);
  const uint32_t k_bytes0 = static_cast<uint32_t>(steps.begin) * kBlockK * 2;

  // MMAs of warp-local block i from its 16 fragment registers f (word w = 2 ks + np gives f[4w .. 4w + 3]).
  auto mma_block = [&](const uint4& q, int i) {
    uint32_t f[16];
    biased_word<kSwap>(q.x, f);
    biased_word<kSwap>(q.y, f + 4);
    biased_word<kSwap>(q.z, f + 8);
    biased_word<kSwap>(q.w, f + 12);
    const uint32_t k_bytes = k_bytes0 + static_cast<uint32_t>(i) * kBlockK * 2;
    if constexpr (kSwap32) {
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        // This k16 step's B registers: xb[p] = {tile 2p: b0, b1 | tile 2p + 1: b0, b1} (swap32_xb_offset; rows past
        // M read row M - 1, their sums are never stored). A third tile alone is an ldmatrix.x2.
        uint32_t xb[kMT][4];
#pragma unroll
        for (int p = 0; p < kMT; ++p) {
          if (2 * p + 1 < kSwapTiles) {
            ptx::ldmatrix_x4(xb[p], x_lane[p] + k_bytes + ks * 32);
          } else {
            ptx::ldmatrix_x2(xb[p][0], xb[p][1], x_lane[p] + k_bytes + ks * 32);
          }
        }
#pragma unroll
        for (int j = 0; j < kSwapTiles; ++j) {
          const uint32_t b[2] = {xb[j >> 1][2 * (j & 1)], xb[j >> 1][2 * (j & 1) + 1]};
          ptx::mma_m16n8k16_bf16(corr[j], k136, b);
        }
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const uint32_t a[4] = {f[(2 * ks + np) * 4], f[(2 * ks + np) * 4 + 1], f[(2 * ks + np) * 4 + 2],
                                 f[(2 * ks + np) * 4 + 3]};
#pragma unroll
          for (int j = 0; j < kSwapTiles; ++j) {
            const uint32_t b[2] = {xb[j >> 1][2 * (j & 1)], xb[j >> 1][2 * (j & 1) + 1]};
            ptx::mma_m16n8k16_bf16(part[j * 2 + np], a, b);
          }
        }
      }
    } else if constexpr (kSwap) {
      uint32_t xb[kSwapTiles][4];
#pragma unroll
      for (int mt = 0; mt < kSwapTiles; ++mt) ptx::ldmatrix_x4(xb[mt], x_lane[mt] + k_bytes);
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const uint32_t a[4] = {f[(2 * ks + np) * 4], f[(2 * ks + np) * 4 + 1], f[(2 * ks + np) * 4 + 2],
                                 f[(2 * ks + np) * 4 + 3]};
#pragma unroll
          for (int mt = 0; mt < kSwapTiles; ++mt) {
            const uint32_t b[2] = {xb[mt][2 * ks], xb[mt][2 * ks + 1]};
            ptx::mma_m16n8k16_bf16(part[mt * 2 + np], a, b);
          }
        }
        if constexpr (kSwapTiles == 1) {
          const uint32_t b[2] = {xb[0][2 * ks], xb[0][2 * ks + 1]};
          ptx::mma_m16n8k16_bf16(corr[0], k136, b);
        } else {
          // The two activation tiles are the A fragment of the 16-row activation tile (swap16_a_tile): one mma
          // with 136 as B gives the offsets of all 16 rows.
          const uint32_t xa[4] = {xb[0][2 * ks], xb[1][2 * ks], xb[0][2 * ks + 1], xb[1][2 * ks + 1]};
          const uint32_t b136[2] = {kMagicSub, kMagicSub};
          ptx::mma_m16n8k16_bf16(corr[0], xa, b136);
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) ptx::ldmatrix_x4(a[mt], x_lane[mt] + k_bytes + ks * 32);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const uint32_t b136[2] = {kMagicSub, kMagicSub};
          ptx::mma_m16n8k16_bf16(corr[mt], a[mt], b136);
        }
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const uint32_t* w = f + (2 * ks + np) * 4;
          const uint32_t b_lo[2] = {w[0], w[1]};  // tile 2np
          const uint32_t b_hi[2] = {w[2], w[3]};  // tile 2np + 1
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            ptx::mma_m16n8k16_bf16(part[mt * kTilesPerBlock + np * 2], a[mt], b_lo);
            ptx::mma_m16n8k16_bf16(part[mt * kTilesPerBlock + np * 2 + 1], a[mt], b_hi);
          }
        }
      }
    }
  };

  // At the end of a group (a group never straddles a block) and at the end of the warp's range: acc += scale *
  // (part - corr) in fp32 with group gl's scales, and part and corr restart.
  auto flush_group = [&](int gl) {
    const uint4 sv = *reinterpret_cast<const uint4*>(s_lane + gl * kScalesPerGroupBlock);
    if constexpr (kSwap) {
      // Tile j of the four 8-column tiles: column 8j + g, the scale of accumulator rows g (e < 2) or g + 8 of
      // 16-row tile np = j / 2. It is half (g & 1) of word j of vector t' = g / 2.
      const uint32_t half_sel = scale_prmt_selector(swap_scale_half(lane), kF16Scales);
      float s[kTilesPerBlock];
      swapped_tile_scales<kF16Scales>(sv, half_sel, s);
      // The offset of accumulator element e (token row m = 8 mt + 2t + (e & 1)): one tile, or one chain per tile
      // (swap32), already in place; two tiles, in lane 4 (2t + (e & 1)) as element 2 mt of the activations-as-A
      // chain (warp-uniform: every lane reaches the flush together).
      float off[kSwapTiles][4];
#pragma unroll
      for (int mt = 0; mt < kSwapTiles; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (kSwapTiles == 1) {
            off[mt][e] = corr[0][e];
          } else if constexpr (kSwap32) {
            off[mt][e] = corr[mt][e];
          } else if (e < 2) {
            off[mt][e] = __shfl_sync(0xffffffffu, corr[0][swap16_corr_src_elem(mt)], swap16_corr_src_lane(lane, e));
          } else {
            off[mt][e] = off[mt][e & 1];  // same token row m
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kSwapTiles; ++mt) {
#pragma unroll
        for (int np = 0; np < 2; ++np) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& p = part[mt * 2 + np][e];
            acc[mt * 2 + np][e] = fmaf(p - off[mt][e], s[2 * np + (e >> 1)], acc[mt * 2 + np][e]);
            p = 0.0f;
          }
        }
      }
    } else {
      const float2 s[kTilesPerBlock] = {unpack_scales<kF16Scales>(sv.x), unpack_scales<kF16Scales>(sv.y),
                                        unpack_scales<kF16Scales>(sv.z), unpack_scales<kF16Scales>(sv.w)};
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int tile = 0; tile < kTilesPerBlock; ++tile) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& p = part[mt * kTilesPerBlock + tile][e];
            acc[mt * kTilesPerBlock + tile][e] =
                fmaf(p - corr[mt][e], (e & 1) ? s[tile].y : s[tile].x, acc[mt * kTilesPerBlock + tile][e]);
            p = 0.0f;
          }
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kCorrTiles; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) corr[c][e] = 0.0f;
  };

  GroupCursor groups_left(kcol0, group, group_shift, group_base);
  auto after_block = [&]() {
    if (groups_left.block_ends_group()) flush_group(groups_left.next_group());
  };

  // Block `fetch` (even) and fetch + 1 go to the lane's ring slots at cursor.fetch; wnext points at block fetch of
  // this lane. Running offsets and pointers (RingCursor, GroupCursor): the issue slots this loop spends on addresses
  // are instructions the weight stream cannot use (docs/notes/w4a16-tuning.md).
  int fetch = 2 * (kPairs - 1);
  const uint4* wnext = wsrc + fetch * kWarpSize;
  const uint32_t ring_smem = ptx::smem_addr(ring);
  RingCursor<kRing, kThreadsCta> cursor(tid);
  // A range of whole 128-column groups (warp-uniform; the decode shapes' tilings mostly give one): one iteration per
  // group, two full pairs and the flush at its end, without the per-block group counters and "second block?" tests
  // of the general loop below (as the streamed warpgroup loop, gemm_w4a16_wg.cuh).
  // (Not in the two-tile cluster instances or swap32, which it pushed past their register caps: spills.)
  constexpr bool kGroupLoop = !kSwap32 && !(kCluster && kSwapTiles == 2);
  const bool whole_groups =
      kGroupLoop && group == 4 * kBlockK && (kcol0 & (4 * kBlockK - 1)) == 0 && n_steps % 4 == 0;
  if (whole_groups) {
    for (int i0 = 0, gl = static_cast<int>(kcol0 >> group_shift) - group_base; i0 < n_steps; i0 += 4, ++gl) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (fetch < n_steps) issue_ring_pair<kThreadsCta>(ring_smem + cursor.fetch, 0, wnext, 2);
        ptx::cp_async_commit_group();
        fetch += 2;
        wnext += 2 * kWarpSize;
        ptx::cp_async_wait_group<kPairs - 1>();
        const unsigned char* slot0 = ring + cursor.read;
        cursor.advance();
        const uint4 q0 = *reinterpret_cast<const uint4*>(slot0);
        if constexpr (kSwap && !kSwap32) {
          const uint4 q1 = *reinterpret_cast<const uint4*>(slot0 + kThreadsCta * 16);
          mma_block(q0, i0 + 2 * h);
          mma_block(q1, i0 + 2 * h + 1);
        } else {
          mma_block(q0, i0 + 2 * h);
          mma_block(*reinterpret_cast<const uint4*>(slot0 + kThreadsCta * 16), i0 + 2 * h + 1);
        }
      }
      flush_group(gl);
    }
  }
  for (int i0 = 0; !whole_groups && i0 < n_steps; i0 += 2) {
    issue_ring_pair<kThreadsCta>(ring_smem + cursor.fetch, fetch, wnext, n_steps);
    ptx::cp_async_commit_group();
    fetch += 2;
    wnext += 2 * kWarpSize;
    ptx::cp_async_wait_group<kPairs - 1>();  // this thread's copies of blocks i0, i0 + 1 have landed
    const bool has1 = i0 + 1 < n_steps;  // warp-uniform: only a warp's last pair can be a single block
    const unsigned char* slot0 = ring + cursor.read;
    cursor.advance();
    const uint4 q0 = *reinterpret_cast<const uint4*>(slot0);
    if constexpr (kSwap && !kSwap32) {
      // Both loads up front (the swapped paths up to 16 rows have registers to spare). Without a second block the
      // slot holds an older block or was never written: its value is loaded but not used.
      const uint4 q1 = *reinterpret_cast<const uint4*>(slot0 + kThreadsCta * 16);
      mma_block(q0, i0);
      after_block();
      if (has1) {
        mma_block(q1, i0 + 1);
        after_block();
      }
    } else {
      // Second load after the first block: four registers fewer, which keeps one m tile within the 80 registers
      // of three CTAs per SM (and swap32's 64 accumulators and partial sums within 128).
      mma_block(q0, i0);
      after_block();
      if (has1) {
        mma_block(*reinterpret_cast<const uint4*>(slot0 + kThreadsCta * 16), i0 + 1);
        after_block();
      }
    }
  }
  // A range that ends inside a group (n_steps > 0: a warp without blocks has nothing to flush, and its group index
  // may lie outside the staged scales).
  if (!whole_groups && n_steps > 0 && groups_left.open()) flush_group(groups_left.next_group());
  ptx::cp_async_wait_group<0>();  // only empty groups can be left; leave none behind

  if (t.warps_k > 1) {
    // Warps wk > 0 hand their sums to warp wk == 0 of the same columns, which adds them in wk order.
    constexpr int kAcc = kAccTiles * 4;
    float* red = reinterpret_cast<float*>(smem);
    static_assert(kAcc <= kMT * 16, "smem_layout sizes the reduction buffer for m_tiles * 16 floats per lane");
    __syncthreads();  // every warp is done with the staged activations and scales that red overlaps
    if (wk > 0) {
#pragma unroll
      for (int j = 0; j < kAccTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(warp * kAcc + j * 4 + e) * kWarpSize + lane] = acc[j][e];
    }
    __syncthreads();
    if (wk == 0) {
      for (int w2 = 1; w2 < t.warps_k; ++w2) {
        const float* src = red + (w2 * t.warps_n + wn) * kAcc * kWarpSize + lane;
#pragma unroll
        for (int j = 0; j < kAccTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][e] += src[(j * 4 + e) * kWarpSize];
      }
    }
  }
  // The stores of warp row wk == 0 into `o` (the split-K workspace, the output or, kCluster, the CTA's tile).
  auto store = [&](const EpilogueOut& o) {
    if constexpr (kSwap32) {
      // nb again from the block index: kept live across the main loop (two registers), it made swap32, at its cap
      // of 128, spill 8 bytes.
      const int64_t nb_out = static_cast<int64_t>(ptx::ctaid_x_reread()) * args.tiling.warps_n + wn;
      store_swapped<kSwapTiles>(o, nb_out, lane, blockIdx.y, [&](int j, int e) { return acc[j][e]; });
    } else if constexpr (kSwap) {
      store_swapped<kSwapTiles>(o, nb, lane, blockIdx.y, [&](int j, int e) { return acc[j][e]; });
    } else {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        store_c16_tile(o, nb, lane, mt, blockIdx.y,
                       [&](int tile, int e) { return acc[mt * kTilesPerBlock + tile][e]; });
    }
  };
  if constexpr (kCluster) {
    cluster_tail(args, smem, wk == 0, store);
  } else if constexpr (kQkvTail) {
    if (wk == 0) store(args.out());
    QkvTail<kQkvTail>::template finish<kThreadsCta>(args, smem + lay.total, tid);
  } else {
    if (wk != 0) return;
    store(args.out());
  }
}

}  // namespace futransformer::cuda::w4a16
