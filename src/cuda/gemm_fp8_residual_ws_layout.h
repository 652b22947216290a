// The warp-specialised residual epilogue of the FP8 GEMM (gemm_fp8_residual_ws.cuh): its constants and shared-memory
// layout, in plain C++ so the CPU tests check them (tests/cpu/test_gemm_fp8_epilogue_layouts.cpp).
#pragma once

#include <cstdint>

#include "cuda/gemm_fp8_layout.h"

namespace futransformer::cuda::fp8rw {

constexpr int kBlockN = 128;
constexpr int kStages = 5;
constexpr int kConsumerWarpgroups = fp8::kConsumerWarpgroups;  // rows 0..63 and 64..127 of the tile
constexpr int kEpilogueWarpgroup = 1 + kConsumerWarpgroups;
constexpr int kThreads = 128 * (2 + kConsumerWarpgroups);
constexpr int kStagingFullArrivals = 128 * kConsumerWarpgroups;
constexpr int kStagingEmptyArrivals = 128;
// setmaxnreg for 512 threads (128 registers each at launch): 128 x 40 + 256 x 168 + 128 x 128 = 64512 of 65536.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 168;
// The overlapped instance (two accumulators: 3 x 64 registers of fp32 state per consumer thread) moves registers
// from the epilogue warpgroup to the consumers: 128 x 40 + 256 x 208 + 128 x 56 = 65536.
constexpr int kConsumerRegsOverlap = 208;
constexpr int kEpilogueRegsOverlap = 56;
constexpr int kRowsPerBatchOverlap = 4;  // residual rows in flight per epilogue warp with 56 registers
// BF16 staging [128 rows][136]: 272-byte rows (68 words), so a consumer warp's eight rows start 4 banks apart.
constexpr int kStagingPitch = 136;
constexpr int kRowsPerBatch = 8;  // residual rows in flight per epilogue warp (16-byte loads per lane)

struct SmemLayout {
  uint32_t a_stage_bytes, b_stage_bytes, a_offset, b_offset;
  uint32_t staging_offset;  // element (row, col) at staging_offset + 2 (row · kStagingPitch + col)
  uint32_t scale_offset;    // a scales (kBlockM), then b scales (kBlockN)
  uint32_t bar_offset;      // full[s], empty[s], scale_full, scale_empty, staging_full, staging_empty
  uint32_t bytes, alloc_bytes;
};
FT_HD constexpr SmemLayout smem_layout() {
  SmemLayout l{};
  l.a_stage_bytes = fp8::kBlockM * fp8::kBlockK;
  l.b_stage_bytes = kBlockN * fp8::kBlockK;
  l.a_offset = 0;
  l.b_offset = kStages * l.a_stage_bytes;
  l.staging_offset = l.b_offset + kStages * l.b_stage_bytes;
  l.scale_offset = l.staging_offset + 2u * fp8::kBlockM * kStagingPitch;
  l.bar_offset = l.scale_offset + 4u * (fp8::kBlockM + kBlockN);
  l.bytes = l.bar_offset + 2u * kStages * 8u + 32u;
  l.alloc_bytes = l.bytes + fp8::kSwizzleAtom;
  return l;
}

}  // namespace futransformer::cuda::fp8rw
