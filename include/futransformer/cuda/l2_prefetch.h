// Warming L2 with part of a weight before the kernel that reads it: prefetch.global.L2::evict_last of a striped
// subset of a buffer's 128-byte lines, enqueued off the critical path (the decode step runs it on a side branch of
// its graph while the attention's small, latency-bound kernels leave DRAM idle; CudaEngineOptions::l2_prefetch_gate_up).
// A prefetch is a hint: it writes nothing and changes no result, only where the later loads find their bytes.
//
// Selection (the host twin is l2_prefetch_line_selected): line i = the 128 bytes at base + 128 i, i < ceil(bytes /
// 128), is prefetched when i % period < keep. A stripe (rather than a prefix) gives every reader of a contiguous
// range — each warp of the W4A16 GEMM walks its column blocks' 512-byte blocks in order — the same fraction of its
// bytes in L2, so no CTA is left with more DRAM traffic than the others.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace futransformer::cuda {

constexpr int kL2LineBytes = 128;
constexpr int kL2PrefetchMaxPeriod = 1 << 16;
constexpr int kL2PrefetchMaxBlocks = 264;  // two per SM on the H100 / H200: a small footprint beside the chain's kernels
constexpr int kL2PrefetchMaxThreads = 256;  // per CTA

// Whether line i is in the stripe (keep of every period lines, the first keep of each).
constexpr bool l2_prefetch_line_selected(int64_t line, int keep, int period) { return line % period < keep; }

// Enqueues one kernel (graph-capturable; no allocation, no synchronisation, no programmatic launch: it depends on
// the stream's previous work in full). base: 128-byte aligned device pointer; bytes >= 0 (0: nothing enqueued);
// 0 <= keep <= period, 1 <= period <= kL2PrefetchMaxPeriod (keep 0: nothing enqueued). mark (tests; null in use):
// when non-null, mark[i] = 1 for every prefetched line i (ceil(bytes / 128) bytes; other entries untouched).
// max_blocks: at most this many CTAs (grid-stride), 1..kL2PrefetchMaxBlocks; 0 = kL2PrefetchMaxBlocks. threads: per
// CTA, a multiple of 32 in 32..kL2PrefetchMaxThreads; 0 = kL2PrefetchMaxThreads. Fewer or smaller CTAs issue the prefetches from fewer SMs and hold fewer
// SM slots (a slower, gentler stream beside other kernels' loads and CTAs).
// cudaErrorInvalidValue with the reason in l2_prefetch_last_error() for a bad argument, else the launch status.
cudaError_t l2_prefetch_stripes(const void* base, int64_t bytes, int keep, int period, cudaStream_t stream,
                                uint8_t* mark = nullptr, int max_blocks = 0, int threads = 0);
const char* l2_prefetch_last_error();

}  // namespace futransformer::cuda
