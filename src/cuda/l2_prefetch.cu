// l2_prefetch_stripes (futransformer/cuda/l2_prefetch.h): one thread per selected line, grid-stride.
#include "futransformer/cuda/l2_prefetch.h"

#include <algorithm>
#include <string>

#include "cuda/launch_status.h"

namespace futransformer::cuda {

namespace {

thread_local std::string g_last_error;


// Selected line j (0-based among the selected) is line (j / keep) * period + j % keep.
__global__ void __launch_bounds__(kL2PrefetchMaxThreads)
    l2_prefetch_kernel(const char* base, int64_t lines, int keep, int period, int64_t selected, uint8_t* mark) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < selected; j += stride) {
    const int64_t line = (j / keep) * period + j % keep;
    if (line >= lines) continue;
    const char* p = base + line * kL2LineBytes;
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
    if (mark != nullptr) mark[line] = 1;
  }
}

}  // namespace

cudaError_t l2_prefetch_stripes(const void* base, int64_t bytes, int keep, int period, cudaStream_t stream,
                                uint8_t* mark, int max_blocks, int threads) {
  g_last_error.clear();
  if (bytes < 0) return reject(&g_last_error, "l2_prefetch_stripes: bytes must be >= 0, got " + std::to_string(bytes));
  if (period < 1 || period > kL2PrefetchMaxPeriod)
    return reject(&g_last_error, "l2_prefetch_stripes: period must be in [1, " + std::to_string(kL2PrefetchMaxPeriod) +
                                     "], got " + std::to_string(period));
  if (keep < 0 || keep > period)
    return reject(&g_last_error, "l2_prefetch_stripes: keep must be in [0, period = " + std::to_string(period) +
                                     "], got " + std::to_string(keep));
  if (max_blocks < 0 || max_blocks > kL2PrefetchMaxBlocks)
    return reject(&g_last_error, "l2_prefetch_stripes: max_blocks must be in [0, " +
                                     std::to_string(kL2PrefetchMaxBlocks) + "], got " + std::to_string(max_blocks));
  if (threads < 0 || threads > kL2PrefetchMaxThreads || threads % 32 != 0)
    return reject(&g_last_error, "l2_prefetch_stripes: threads must be 0 or a multiple of 32 in [32, " +
                                     std::to_string(kL2PrefetchMaxThreads) + "], got " + std::to_string(threads));
  if (bytes == 0 || keep == 0) return cudaSuccess;
  if (base == nullptr || !aligned(base, kL2LineBytes))
    return reject(&g_last_error, "l2_prefetch_stripes: base must be a non-null, 128-byte aligned device pointer");
  const int64_t lines = (bytes + kL2LineBytes - 1) / kL2LineBytes;
  // Selected lines below `lines`: whole periods, then the last period's first min(keep, rest).
  const int64_t selected = (lines / period) * keep + std::min<int64_t>(keep, lines % period);
  const int per_block = threads > 0 ? threads : kL2PrefetchMaxThreads;
  const int64_t blocks =
      std::min<int64_t>((selected + per_block - 1) / per_block, max_blocks > 0 ? max_blocks : kL2PrefetchMaxBlocks);
  l2_prefetch_kernel<<<static_cast<unsigned>(blocks), per_block, 0, stream>>>(static_cast<const char*>(base), lines,
                                                                             keep, period, selected, mark);
  return cudaGetLastError();
}

const char* l2_prefetch_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
