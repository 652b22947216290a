// Special-register reads.
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// mov.u32 %ctaid.x, volatile: read again where it is used instead of being kept from an earlier read, which frees a
// register across a long loop (a kernel at its register cap would otherwise spill the value kept live).
__device__ __forceinline__ uint32_t ctaid_x_reread() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(r));
  return r;
}

}  // namespace futransformer::cuda::ptx
