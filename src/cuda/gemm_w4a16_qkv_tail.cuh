// The attention prologue (RoPE, KV-cache append, q rotation) inside the unsplit W4A16 qkv GEMM at decode sizes: the
// tail of the v4 kernel's swapped M <= 8 instances with kQkvTail (gemm_w4a16_v4.cuh), for INT4 and INT4_HADAMARD
// caches at head_dim 128. Without a K split the GEMM used to store BF16 qkv and leave the prologue to
// qkv_rope_kv_append's kernel (one more kernel boundary per decode layer). Here each CTA, after storing its columns,
// counts itself into a per-head counter; the CTA that completes a head (the last of the 128 / (32 warps_n) CTAs whose
// columns make it up, or the CTA itself when it holds whole heads) runs the prologue of that head for every row:
// one warp per (row, head) item in the lane layout of the split-K reduce (fused::HeadLanes<32>: lane t holds
// channels 4 t .. 4 t + 3), reading the head's BF16 values back from qkv, then fused::rope_lanes and
// fused::finish_item_lanes, the code of gemm_w4a16_reduce_qkv_lanes_kernel and of qkv_rope_kv_append's own INT4
// kernels (the same operations in the same order, so the same bits as gemm_w4a16 + qkv_rope_kv_append).
//
// The handover is the classic last-block pattern: __syncthreads (the CTA's stores are issued), one thread fences
// (gpu scope) and adds 1 to the head's counter; the thread that reads count - 1 knows every other CTA of the head
// fenced its stores before it, resets the counter to 0 (nothing else touches it before the next launch in stream
// order), fences, and the CTA reads the head through L2 (ld.global.cg: another SM's L1 never held these lines, this
// one's might from an earlier launch). The counters are the caller's: zero before the launch, zero after it, and
// launches that share them must not overlap (one stream).
//
// Included by the translation unit that compiles the tail instances (gemm_w4a16_v4_qkv_tail.cu) after
// gemm_w4a16_v4.cuh, whose kernel reaches these through QkvTail<true>.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/fused_ops.cuh"
#include "cuda/gemm_w4a16_v4.cuh"
#include "futransformer/formats/kv_cache.h"

namespace futransformer::cuda::w4a16 {

// The kernel arguments of a tail instance: the plain ones, the prologue's and the counters.
struct QkvTailArgs : KernelArgs {
  fused::QkvArgs q;          // q.qkv == y (the GEMM's BF16 output), checked by make_qkv_args
  uint32_t* head_counters;   // [n_heads + 2 n_kv_heads], zero before and after the launch
  int hadamard;              // 1: INT4_HADAMARD, 0: INT4
};

// Shared memory after the GEMM's layout (smem_layout(...).total): the rows' RoPE tables, then their cache metadata
// and the completed-heads word, written before griddepcontrol.wait (positions, inv_freq and the row metadata are
// inputs of the pass no kernel writes) and read only by the tail.
constexpr int kQkvTailHalf = fused::kQuadHeadDim / 2;  // RoPE pairs of a head
constexpr int64_t kQkvTailTableBytes = int64_t{kQkvTailMaxRows} * kQkvTailHalf * 8;  // float2 per pair
static_assert(kQkvTailScratchBytes >= kQkvTailTableBytes + (3 * kQkvTailMaxRows + 1) * 4,
              "the tables, three ints of metadata per row and the completed-heads word");

template <>
struct QkvTail<true> {
  using Args = QkvTailArgs;

  // Before griddepcontrol.wait, by all nthreads threads: the RoPE tables and metadata of the M rows.
  template <int kThreadsCta>
  static __device__ __forceinline__ void prepare(const QkvTailArgs& a, unsigned char* scratch, int tid) {
    float2* cs = reinterpret_cast<float2*>(scratch);
    int* meta = reinterpret_cast<int*>(scratch + kQkvTailTableBytes);
    const int rows = a.M;
    for (int i = tid; i < rows * kQkvTailHalf; i += kThreadsCta) {
      const int r = i / kQkvTailHalf, p = i % kQkvTailHalf;
      cs[i] = ops::rope_cos_sin(static_cast<double>(a.q.positions[r]), a.q.inv_freq[p]);
    }
    if (tid < rows) {
      meta[3 * tid] = a.q.row_page[tid];
      meta[3 * tid + 1] = a.q.row_slot[tid];
      meta[3 * tid + 2] = a.hadamard ? a.q.row_anchor[tid] : -1;
    }
  }

  // After the storing warps' stores, by every thread of the CTA (no thread may have returned).
  template <int kThreadsCta>
  static __device__ __forceinline__ void finish(const QkvTailArgs& a, unsigned char* scratch, int tid) {
    constexpr int kHd = fused::kQuadHeadDim;
    const float2* cs = reinterpret_cast<const float2*>(scratch);
    const int* meta = reinterpret_cast<const int*>(scratch + kQkvTailTableBytes);
    unsigned* done_word = reinterpret_cast<unsigned*>(scratch + kQkvTailTableBytes + 3 * kQkvTailMaxRows * 4);
    const int cols = kBlockN * a.tiling.warps_n;  // the launcher: cols divides kHd or kHd divides cols
    const int64_t c0 = static_cast<int64_t>(blockIdx.x) * cols;
    const int h0 = static_cast<int>(c0 / kHd);
    const int heads = cols >= kHd ? cols / kHd : 1;  // heads this CTA's columns touch (<= kQkvTailMaxHeadsPerCta)
    const unsigned per_head = cols >= kHd ? 1u : static_cast<unsigned>(kHd / cols);
    __syncthreads();  // every BF16 store of the CTA is issued
    // The dependent (the decode attention) launches once every CTA got here: its CTAs then take the SMs this grid
    // frees instead of crowding onto the few it left free at its start (the kernel does not release it earlier).
    ptx::griddepcontrol_launch_dependents();
    if (tid == 0) {
      unsigned done = 0;  // 1: this CTA runs the items of all `heads` heads it touches
      if (per_head == 1) {
        done = 1u;
      } else {
        __threadfence();  // the CTA's stores before the count (cumulative over the barrier above)
        const unsigned old = atomicAdd(a.head_counters + h0, 1u);
        if (old == per_head - 1) {
          a.head_counters[h0] = 0u;
          __threadfence();  // the other CTAs' stores before this CTA's reads
          done = 1u;
        }
      }
      *done_word = done;
    }
    __syncthreads();
    const unsigned done = *done_word;
    if (done == 0) return;

    const int lane = tid & 31, warp = tid >> 5;
    const int rows = a.M;
    const int items = heads * rows;
    for (int i = warp; i < items; i += kThreadsCta / 32) {
      const int j = i / rows, r = i % rows;
      const int item = h0 + j;
      const bool is_v = item >= a.q.n_heads + a.q.n_kv_heads;
      __nv_bfloat16* head = a.q.qkv + static_cast<int64_t>(r) * a.q.row_width + static_cast<int64_t>(item) * kHd;
      const uint2 w = __ldcg(reinterpret_cast<const uint2*>(head) + lane);
      uint32_t raw[2] = {w.x, w.y};
      float x[fused::HeadLanes<32>::kPerLane];
      fused::widen_bf16_words<2>(raw, x);
      if (!is_v) {
        fused::rope_lanes<32>(x, cs + r * kQkvTailHalf, lane, 0xffffffffu, raw);  // raw: the RoPE'd bits
        fused::store_head_lanes<32>(head, lane, raw);
      }
      const fused::QkvRowMeta m{meta[3 * r], meta[3 * r + 1], meta[3 * r + 2]};
      if (a.hadamard) {
        fused::finish_item_lanes<formats::KvFormat::INT4_HADAMARD, 32>(a.q, x, r, item, m, lane, 0xffffffffu);
      } else {
        fused::finish_item_lanes<formats::KvFormat::INT4, 32>(a.q, x, r, item, m, lane, 0xffffffffu);
      }
    }
  }
};

}  // namespace futransformer::cuda::w4a16
