// The L2 prefetch kernel (futransformer/cuda/l2_prefetch.h): each thread takes pieces grid-stride and issues one
// bulk prefetch per kept piece. The bulk prefetch goes through the SM's copy engine, so a few CTAs on a few SMs keep
// many megabytes in flight without holding registers or shared memory while the bytes arrive.
#pragma once

#include "l2_prefetch_layout.h"
#include "ptx/cp_async.cuh"

namespace futransformer::cuda::l2p {

constexpr int kThreads = 128;
constexpr int kMaxCtas = 32;

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const Args args) {
  const int64_t n = args.pieces();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const Piece p = piece(args, i);
    if (p.bytes != 0) ptx::cp_async_bulk_prefetch_l2(reinterpret_cast<const void*>(p.addr), p.bytes);
  }
}

}  // namespace futransformer::cuda::l2p
