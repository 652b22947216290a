// Host side of the L2 prefetch: argument checks and the launch (kernel in l2_prefetch.cuh).
#include "futransformer/cuda/l2_prefetch.h"

#include <algorithm>
#include <string>

#include "l2_prefetch.cuh"
#include "launch_status.h"

namespace futransformer::cuda {
namespace {

thread_local std::string g_last_error;

}  // namespace

cudaError_t l2_prefetch_can_implement(std::span<const L2PrefetchRange> ranges, std::string* why) {
  if (ranges.size() > static_cast<size_t>(kL2PrefetchMaxRanges))
    return reject(why, "l2_prefetch: at most " + std::to_string(kL2PrefetchMaxRanges) + " ranges, got " +
                           std::to_string(ranges.size()));
  for (size_t r = 0; r < ranges.size(); ++r) {
    const L2PrefetchRange& x = ranges[r];
    const std::string name = "l2_prefetch: range " + std::to_string(r);
    if (x.bytes > 0 && x.ptr == nullptr) return reject(why, name + " has " + std::to_string(x.bytes) + " bytes at null");
    if (x.period < 1 || x.keep < 0 || x.keep > x.period)
      return reject(why, name + ": need 1 <= period and 0 <= keep <= period, got period " + std::to_string(x.period) +
                             ", keep " + std::to_string(x.keep));
  }
  return cudaSuccess;
}

cudaError_t l2_prefetch(std::span<const L2PrefetchRange> ranges, cudaStream_t stream) {
  g_last_error.clear();
  if (const cudaError_t e = l2_prefetch_can_implement(ranges, &g_last_error); e != cudaSuccess) return e;
  const l2p::Args args = l2p::make_args(ranges);
  int64_t kept = 0;  // pieces the kernel will issue (a range of keep 0 costs nothing)
  for (int r = 0; r < args.n; ++r) {
    const int64_t n = args.first_piece[r + 1] - args.first_piece[r];
    kept += n / args.period[r] * args.keep[r] + std::min<int64_t>(n % args.period[r], args.keep[r]);
  }
  if (kept == 0) return cudaSuccess;
  const int64_t ctas = std::min<int64_t>((args.pieces() + l2p::kThreads - 1) / l2p::kThreads, l2p::kMaxCtas);
  l2p::l2_prefetch_kernel<<<static_cast<unsigned>(ctas), l2p::kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

const char* l2_prefetch_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
