// W4A16 GEMM kernels for decode on Hopper: y[M, N] = x[M, K] * W[N, K]^T with x BF16 (M <= 64), W symmetric
// INT4 in the packed layout of gemm_w4a16_layout.h, group scales (FP16 or BF16), fp32 accumulation, BF16 out.
//
// Decode is bound by the weight stream, so the design keeps as many weight bytes in flight as the SM allows
// and spends few instructions per byte:
// - A CTA (8 warps) owns 32 * warps_n output columns and one K slice (grid.y = split-K slices). Its slice of
//   the activations (its M rows only) and of the scales is staged in shared memory once, at the start.
// - Each warp walks its part of the slice one 32 x 32 packed block at a time. Every lane copies exactly the
//   16 bytes that hold its own B fragments into a private ring of kStages (16) slots with cp.async.cg (L1
//   bypassed: weights are read once), 15 blocks = 60 KB per CTA in flight; because no lane reads another lane's
//   slot, the main loop has no barrier at all.
//   An L2::evict_first cache hint on these copies raised "illegal instruction" on the H200 (driver 580.159,
//   see docs/kernels.md), so the copies carry no hint.
// - Nibbles become B registers in registers (lop3 magic number, then one bf16x2 subtract: the integers u - 8,
//   exact), activations come from shared memory through ldmatrix, products accumulate in fp32 per group and
//   are scaled in fp32 when a group ends, so FP16 scales are applied exactly as well.
// - warps_k > 1 warps are reduced through shared memory in warp order; split-K slices write fp32 partial sums
//   that gemm_w4a16_reduce_kernel (gemm_w4a16_reduce.cuh) adds in slice order: the result is deterministic. The
//   kCluster instances (M = 9..16) keep the slices' sums in shared memory instead and finish them inside the
//   cluster of the column block's slices, in the same order (gemm_w4a16_cluster.cuh).
// - The final store applies the launch's epilogue (gemm_w4a16_epilogue.cuh): BF16 y, an fp32 residual add, or
//   SwiGLU of an interleaved gate|up weight; with split-K the reduce kernel applies it instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda/gemm_w4a16_cluster.cuh"
#include "cuda/gemm_w4a16_epilogue.cuh"
#include "cuda/gemm_w4a16_layout.h"
#include "cuda/ptx/bits.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/griddep.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mma.cuh"

namespace futransformer::cuda::w4a16 {

struct KernelArgs {
  const __nv_bfloat16* x;   // [M, K]
  const uint4* w;           // packed blocks, 16 bytes per lane
  const uint16_t* scales;   // packed scales
  __nv_bfloat16* y;         // [M, N], or h [M, N / 2] for swiglu_bf16 (written when tiling.splits == 1)
  float* partial;           // [splits, M, N] fp32 (written when tiling.splits > 1)
  int M, N, K, group;
  Tiling tiling;
  float* residual = nullptr;                 // [M, N] fp32, read and written by residual_f32 (splits == 1)
  Epilogue epilogue = Epilogue::store_bf16;  // with splits > 1 the reduce kernel applies it instead

  __device__ EpilogueOut out() const { return EpilogueOut{epilogue, y, residual, partial, M, N, tiling.splits}; }
};

// The epilogue outputs of a CTA of a cluster-reduce instance (kCluster): its slice's sums go to its shared memory,
// from the start of the dynamic window (cluster_reduce_applies: the launcher checked that the tile fits there).
__device__ __forceinline__ EpilogueOut cta_epilogue_out(const KernelArgs& args, unsigned char* smem) {
  EpilogueOut o = args.out();
  o.tile = reinterpret_cast<float*>(smem);
  o.tile_cols = kBlockN * args.tiling.warps_n;
  o.col0 = static_cast<int64_t>(blockIdx.x) * o.tile_cols;
  return o;
}

// The end of a cluster-reduce instance (kCluster; launched in clusters of the column block's K slices): once every
// warp is done with the shared memory the tile overlays (the staged rows, the ring, the reduction buffer), the
// storing warps (`stores`: warp row wk == 0) put the CTA's sums into the tile through store(o), and the cluster
// finishes them (cluster_finish). A separate instance, so the kernels without it keep their registers and code.
template <class Store>
__device__ __forceinline__ void cluster_tail(const KernelArgs& args, unsigned char* smem, bool stores, Store store) {
  __syncthreads();
  const EpilogueOut o = cta_epilogue_out(args, smem);
  if (stores) store(o);
  cluster_finish(o, static_cast<int>(blockDim.x), static_cast<int>(threadIdx.x));
}

// bf16x2 {u_lo - 8, u_hi - 8} from slot `kShift / 4` of a packed word.
template <int kShift>
__device__ __forceinline__ uint32_t dequant_slot(uint32_t word) {
  const uint32_t biased = ptx::lop3<0xea>(word >> kShift, kMagicMask, kMagicBias);  // (a & b) | c
  const uint32_t sub_bits = kMagicSub;
  __nv_bfloat162 v, sub;
  std::memcpy(&v, &biased, 4);
  std::memcpy(&sub, &sub_bits, 4);
  v = __hsub2(v, sub);
  uint32_t r;
  std::memcpy(&r, &v, 4);
  return r;
}

// The two scales of one 32-bit word of staged scales (lower column first) as fp32.
template <bool kF16Scales>
__device__ __forceinline__ float2 unpack_scales(uint32_t pair) {
  if constexpr (kF16Scales) {
    __half2 h;
    std::memcpy(&h, &pair, 4);
    return __half22float2(h);
  } else {
    // A BF16 value is the top half of its fp32: move each 16-bit half up, zero below.
    return make_float2(__uint_as_float(ptx::prmt(pair, 0u, 0x1044u)), __uint_as_float(ptx::prmt(pair, 0u, 0x3244u)));
  }
}

// Staging shared by v2 and v4 (nthreads threads of the CTA, tid = threadIdx.x), each issuing cp.async copies that
// the caller commits. The scales of the CTA's warps_n column blocks for K slice gr: contiguous 64 bytes per group
// and block, laid out [block][group of the slice][64 bytes] with sgm groups per block.
__device__ __forceinline__ void stage_slice_scales(const KernelArgs& args, const Tiling& t, Range gr, int64_t groups,
                                                   int64_t sgm, int64_t nb0, uint16_t* s_s, int tid, int nthreads) {
  const int chunks_per_block = static_cast<int>(gr.end - gr.begin) * (kScalesPerGroupBlock / 8);
  for (int c = tid; c < t.warps_n * chunks_per_block; c += nthreads) {
    const int b = c / chunks_per_block, cc = c % chunks_per_block;
    const uint16_t* src = args.scales + packed_scale_index(nb0 + b, gr.begin, groups, 0, 0, 0) + cc * 8;
    ptx::cp_async_16(ptx::smem_addr(s_s + b * sgm * kScalesPerGroupBlock + cc * 8), src);
  }
}

// The slice's M activation rows (columns k0 .. k0 + slice_k) into a_s with row pitch `pitch` (MMA rows past M are
// fed clamped addresses, see a_frag_offset).
__device__ __forceinline__ void stage_slice_rows(const KernelArgs& args, int rows, int64_t k0, int slice_k,
                                                 int64_t pitch, __nv_bfloat16* a_s, int tid, int nthreads) {
  const int row_chunks = slice_k / 8;
  for (int c = tid; c < rows * row_chunks; c += nthreads) {
    const int r = c / row_chunks, cc = c % row_chunks;
    ptx::cp_async_16(ptx::smem_addr(a_s + r * pitch + cc * 8),
                     args.x + static_cast<int64_t>(r) * args.K + k0 + cc * 8);
  }
}

// The end of both kernels' prologue: wait for the kernels before (griddepcontrol.wait; the weights and scales were
// issued before it), stage the activation rows as the newest cp.async group, and wait for every group (under
// programmatic launch the weight groups were issued long before; otherwise this costs one DRAM latency more than
// waiting for the rows alone) and the whole CTA.
__device__ __forceinline__ void wait_then_stage_rows(const KernelArgs& args, int rows, int64_t k0, int slice_k,
                                                     int64_t pitch, __nv_bfloat16* a_s, int tid, int nthreads) {
  ptx::griddepcontrol_wait();
  stage_slice_rows(args, rows, k0, slice_k, pitch, a_s, tid, nthreads);
  ptx::cp_async_commit_group();
  ptx::cp_async_wait_group<0>();
  __syncthreads();
}

template <int kMT, bool kRows8, bool kF16Scales, bool kCluster = false>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(kMT)) gemm_w4a16_kernel(const KernelArgs args) {
  static_assert(kMT >= 1 && kMT <= kMaxMTiles, "m tiles must cover 16..64 rows");
  static_assert(!kRows8 || kMT == 1, "the 8-row activation path serves M <= 8 only");
  // The reduce kernel waits for this grid's completion itself; letting it launch now hides its launch latency.
  ptx::griddepcontrol_launch_dependents();

  extern __shared__ __align__(16) unsigned char smem[];
  Tiling t = args.tiling;
  t.warps = kWarps;  // v2 runs the default shape only (tiling_is_valid); constants fold smem_layout
  t.stages = kStages;
  const int K = args.K, group = args.group;
  const int tid = threadIdx.x, lane = tid & 31;
  // Broadcast from lane 0: the compiler then knows the warp index (and the weight addresses derived from it) is
  // warp-uniform, as in the v4 and warpgroup kernels.
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

  // Weights first, activations last: the packed weights and scales never change between launches, so they are
  // fetched before griddepcontrol.wait (as a programmatic dependent under FT_PDL, while the kernel before still
  // runs; without the launch attribute the wait returns at once). Nothing is written before the wait.
  const int64_t nb0 = static_cast<int64_t>(blockIdx.x) * t.warps_n;
  stage_slice_scales(args, t, gr, groups, sgm, nb0, s_s, tid, kThreads);
  ptx::cp_async_commit_group();

  // This warp's packed blocks: n block nb, k blocks kb0 .. kb0 + n_steps - 1 (consecutive in memory).
  const int64_t nb = nb0 + wn;
  const Range steps = split_range(slice_k / kBlockK, t.warps_k, wk);
  const int n_steps = static_cast<int>(steps.end - steps.begin);
  const int64_t kb0 = k0 / kBlockK + steps.begin;
  const uint4* wsrc = args.w + (nb * (K / kBlockK) + kb0) * kWarpSize + lane;
  const uint32_t ring_lane = ptx::smem_addr(ring + tid * 16);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_steps) ptx::cp_async_16(ring_lane + i * kThreads * 16, wsrc + i * kWarpSize);
    ptx::cp_async_commit_group();  // empty groups keep the wait count in the loop uniform
  }

  const int rows = t.rows;
  wait_then_stage_rows(args, rows, k0, slice_k, pitch, a_s, tid, kThreads);

  float acc[kMT][kTilesPerBlock][4] = {};
  float part[kMT][kTilesPerBlock][4] = {};
  uint32_t a_lane[kMT];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    a_lane[mt] = ptx::smem_addr(a_s) + 2 * static_cast<uint32_t>(a_frag_offset(lane, mt, 0, pitch, kRows8, rows));

  for (int i = 0; i < n_steps; ++i) {
    const int ahead = i + kStages - 1;
    if (ahead < n_steps) {
      ptx::cp_async_16(ring_lane + (ahead % kStages) * kThreads * 16, wsrc + ahead * kWarpSize);
    }
    ptx::cp_async_commit_group();
    ptx::cp_async_wait_group<kStages - 1>();  // this thread's copy of block i has landed
    const uint4 q = *reinterpret_cast<const uint4*>(ring + ((i % kStages) * kThreads + tid) * 16);
    const uint32_t words[kWordsPerLane] = {q.x, q.y, q.z, q.w};
    const uint32_t k_bytes = static_cast<uint32_t>((steps.begin + i) * kBlockK * 2);

#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const uint32_t addr = a_lane[mt] + k_bytes + ks * 32;
        if constexpr (kRows8) {
          ptx::ldmatrix_x2(a[mt][0], a[mt][2], addr);
          a[mt][1] = a[mt][3] = 0;  // rows 8..15 do not exist
        } else {
          ptx::ldmatrix_x4(a[mt], addr);
        }
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const uint32_t word = words[ks * 2 + np];
        const uint32_t b_lo[2] = {dequant_slot<0>(word), dequant_slot<4>(word)};    // tile 2np
        const uint32_t b_hi[2] = {dequant_slot<8>(word), dequant_slot<12>(word)};   // tile 2np + 1
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          ptx::mma_m16n8k16_bf16(part[mt][np * 2], a[mt], b_lo);
          ptx::mma_m16n8k16_bf16(part[mt][np * 2 + 1], a[mt], b_hi);
        }
      }
    }

    // A group never straddles a block (group >= 32 and K blocks are group aligned): scale at its last block.
    const int kcol = static_cast<int>(kb0 + i) * kBlockK;
    if (((kcol + kBlockK) & (group - 1)) == 0 || i == n_steps - 1) {
      const int gl = (kcol >> group_shift) - static_cast<int>(gr.begin);
      const uint4 sv = *reinterpret_cast<const uint4*>(s_s + s_frag_offset(wn, gl, sgm, lane & 3));
      const float2 s[kTilesPerBlock] = {unpack_scales<kF16Scales>(sv.x), unpack_scales<kF16Scales>(sv.y),
                                        unpack_scales<kF16Scales>(sv.z), unpack_scales<kF16Scales>(sv.w)};
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int tile = 0; tile < kTilesPerBlock; ++tile) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[mt][tile][e] = fmaf(part[mt][tile][e], (e & 1) ? s[tile].y : s[tile].x, acc[mt][tile][e]);
            part[mt][tile][e] = 0.0f;
          }
        }
      }
    }
  }
  ptx::cp_async_wait_group<0>();  // only empty groups can be left; leave none behind

  if (t.warps_k > 1) {
    // Warps wk > 0 hand their sums to warp wk == 0 of the same columns, which adds them in wk order.
    constexpr int kAcc = kMT * kTilesPerBlock * 4;
    float* red = reinterpret_cast<float*>(smem);
    __syncthreads();  // every warp is done with the staged activations and scales that red overlaps
    if (wk > 0) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int tile = 0; tile < kTilesPerBlock; ++tile)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            red[(warp * kAcc + (mt * kTilesPerBlock + tile) * 4 + e) * kWarpSize + lane] = acc[mt][tile][e];
    }
    __syncthreads();
    if (wk == 0) {
      for (int w2 = 1; w2 < t.warps_k; ++w2) {
        const float* src = red + (w2 * t.warps_n + wn) * kAcc * kWarpSize + lane;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int tile = 0; tile < kTilesPerBlock; ++tile)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][tile][e] += src[((mt * kTilesPerBlock + tile) * 4 + e) * kWarpSize];
      }
    }
  }
  auto store = [&](const EpilogueOut& o) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
      store_c16_tile(o, nb, lane, mt, blockIdx.y, [&](int tile, int e) { return acc[mt][tile][e]; });
  };
  if constexpr (kCluster) {
    cluster_tail(args, smem, wk == 0, store);
  } else {
    if (wk != 0) return;
    store(args.out());
  }
}

}  // namespace futransformer::cuda::w4a16
