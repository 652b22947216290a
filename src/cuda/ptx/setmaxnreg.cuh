// Register reallocation between warpgroups (sm_90a). Legal only in a kernel compiled with a register cap at entry
// (__launch_bounds__(threads, 1)) and executed by all threads of a warpgroup; counts are multiples of 8 in 24..256.
#pragma once

namespace futransformer::cuda::ptx {

// setmaxnreg.dec.sync.aligned.u32: lowers this warpgroup's per-thread register budget to N, returning the rest
// to the SM's pool for other warpgroups.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// setmaxnreg.inc.sync.aligned.u32: raises this warpgroup's per-thread register budget to N (blocks until the
// pool has them).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace futransformer::cuda::ptx
