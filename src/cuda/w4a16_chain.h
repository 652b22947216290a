// A chain of dependent W4A16 GEMMs (decode, M <= 8) in one persistent kernel whose weight stream never waits on the
// chain's data: the experiment behind issue 4's last structural lever (docs/notes/decode-batch1-fixed-cost.md, "A
// weight stream that runs ahead"; measured slower than the engine's separate GEMMs, so not an engine path). Stage s
// computes y_s = x_s · dequant(W_s)ᵀ with x_s taken from y_{s-1}; one CTA per SM (cooperative launch) holds a producer
// warp, which bulk-copies every weight slot this CTA will ever need, stage after stage, into a shared-memory ring,
// limited only by the ring's free slots (or each consumer warp copies its own, ChainCopies::warp); and consumer warps,
// which wait for the previous stage to complete on every CTA (a release / acquire counter per stage), stage x_s, and
// consume the ring. So the DRAM stream of stage s + 1 runs during stage s's tail, the dependency wait and whatever
// latency sits between the GEMMs (delay_ns stands in for the attention chain). docs/kernels.md, "W4A16 chain", draws
// it; bench_w4a16_chain times it against the same GEMMs as separate kernels.
//
// Same packed weights and scales as gemm_w4a16 (formats::repack_int4_for_mma / repack_int4_scales_for_mma): a ring
// slot is kChainSlotBlocks consecutive packed blocks of one 32-column block (contiguous) plus the scales of its groups.
// Includable from plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "cuda/w4a16_chain_layout.h"
#include "futransformer/formats/int4.h"

struct __nv_bfloat16;

namespace futransformer::cuda::w4a16 {

// Where a stage's activations come from.
enum class ChainInput : int32_t {
  first = 0,     // the chain's input x0 (stage 0, and only stage 0)
  previous = 1,  // columns [input_offset, input_offset + K) of the previous stage's y
  swiglu = 2,    // bf16(silu_mul(g, u)) (decoder_ops' swiglu_bf16 rule) with g = previous y column input_offset + k
                 // and u = column input_offset + K + k
};

struct ChainStage {
  const void* w = nullptr;       // packed weights, 16-byte aligned
  const void* scales = nullptr;  // packed scales, 16-byte aligned
  __nv_bfloat16* y = nullptr;    // BF16 [M][N] row-major, written by this stage only
  int32_t N = 0, K = 0, group = 0;
  ChainInput input = ChainInput::previous;
  int32_t input_offset = 0;  // a multiple of 8
  // The stage's activations are staged this long after the previous stage completed on every CTA (measured by each
  // CTA from when it saw the completion, on %globaltimer): a stand-in for the latency-bound ops (attention, norms)
  // that sit between a decode layer's GEMMs, during which the weight stream keeps running.
  int32_t delay_ns = 0;
};

// How the weight slots reach shared memory.
enum class ChainCopies : int32_t {
  bulk = 0,  // the producer warp's cp.async.bulk into the ring, mbarrier full / empty per slot (stages_ahead applies)
  warp = 1,  // each consumer warp cp.async's its own slots kChainSlotsPerWarp - 1 ahead of its consumption, across
             // stages (stages_ahead must be kChainAnyStagesAhead)
};

// cudaSuccess when the chain can run with M rows; otherwise cudaErrorInvalidValue and a sentence naming the stage and
// the field. Checks shapes (N a multiple of 32, K of 256, group 32 / 64 / 128, M * K <= kChainMaxXElems), pointers
// (present, 16-byte aligned) and inputs (stage 0 first, later stages previous / swiglu within the previous N).
// Needs no device.
cudaError_t w4a16_chain_can_implement(std::span<const ChainStage> stages, int M, std::string* why);

// Device bytes w4a16_chain needs: the stage table and one completion counter per stage.
size_t w4a16_chain_workspace_bytes(int n_stages);

// Runs the chain on `stream`: x0 BF16 [M][stages[0].K], 16-byte aligned. With upload, copies the stage table into
// the workspace first (cudaMemcpyAsync from pageable memory); without, the workspace must hold this very table from
// an earlier call. Zeroes the counters, then one cooperative launch of `ctas` CTAs (0: one per SM). stages_ahead
// limits how far each CTA's producer runs ahead: it starts copying stage s only once its consumers have passed stage
// s - stages_ahead's dependency (0: a GEMM's weights wait for its data, as without programmatic launch; 1: one stage
// ahead, about what a programmatic launch's ring fill gives; kChainAnyStagesAhead: only the ring limits it). Refuses what
// w4a16_chain_can_implement refuses, a short or misaligned workspace, and a device that cannot hold the CTAs at once.
cudaError_t w4a16_chain(std::span<const ChainStage> stages, const __nv_bfloat16* x0, int M,
                        formats::ScaleType scale_type, void* workspace, size_t workspace_bytes, bool upload, int ctas,
                        int stages_ahead, cudaStream_t stream, std::string* why,
                        ChainCopies copies = ChainCopies::bulk);

}  // namespace futransformer::cuda::w4a16
