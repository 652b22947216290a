// Global load wrappers (any sm).
#pragma once

#include <cuda_runtime.h>

namespace futransformer::cuda::ptx {

// ld.global.cg.v4.u32: 16 bytes into registers, cached in L2 only (streamed data that is read once).
__device__ __forceinline__ uint4 ld_global_cg_16(const void* p) {
  uint4 r;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

}  // namespace futransformer::cuda::ptx
