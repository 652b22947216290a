// Warming L2 with bytes a later kernel will read: one small kernel whose threads issue cp.async.bulk.prefetch.L2
// for 4 KB pieces of up to kL2PrefetchMaxRanges device ranges, and exits. Nothing is written; the prefetches are
// hints the memory system may drop. The decode step launches it on a side branch of its CUDA graph so the next
// GEMMs' weights are fetched while attention and the small ops leave DRAM idle (CudaEngineOptions::l2_prefetch_*).
//
// A range may ask for a regular fraction of its pieces (`keep` of every `period`): a GEMM whose CTAs each stream
// their own slice of a weight then finds the same fraction of every slice in L2, whatever its tiling, instead of
// some CTAs finding all of theirs and the rest none (the GEMM lasts as long as its slowest CTA).
// Includable from plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace futransformer::cuda {

constexpr int kL2PrefetchMaxRanges = 4;
constexpr uint32_t kL2PrefetchPieceBytes = 4096;

struct L2PrefetchRange {
  const void* ptr = nullptr;  // device memory; its first and last partial 16-byte words are left out
  size_t bytes = 0;
  int period = 1;  // piece p of the range is prefetched when p % period < keep
  int keep = 1;
};

// cudaSuccess when the ranges can run, else cudaErrorInvalidValue with the reason in *why (when non-null): at most
// kL2PrefetchMaxRanges ranges, a non-null pointer wherever bytes > 0, 1 <= period and 0 <= keep <= period. Needs no
// device.
cudaError_t l2_prefetch_can_implement(std::span<const L2PrefetchRange> ranges, std::string* why);

// Enqueues the prefetch kernel on `stream` (nothing when no piece is kept; no allocation, graph-capturable).
// Returns cudaErrorInvalidValue (message in l2_prefetch_last_error()) for rejected ranges, else the launch status.
cudaError_t l2_prefetch(std::span<const L2PrefetchRange> ranges, cudaStream_t stream);

// Why the last l2_prefetch call on this thread returned cudaErrorInvalidValue ("" after an accepted call).
const char* l2_prefetch_last_error();

}  // namespace futransformer::cuda
