// v4 W4A16 GEMM instances for CTAs of 28 warps with 8 ring slots per thread (see gemm_w4a16_v4_dispatch.cuh): 896
// threads, which at the M <= 8 path's 71 registers (72 allowed) fill the register file, so one CTA of them is the most
// warps an SM can stream with. With warps_n = 7 or 14 it lays the gate|up layers (N / 32 = 7 · 128 or 7 · 256 column
// blocks) out as 128 CTAs, one per SM.
#include "cuda/gemm_w4a16_v4_dispatch.cuh"

namespace futransformer::cuda::w4a16 {

template KernelFn v4_kernel<28, 8>(const Tiling&, bool, bool);
template NormKernelFn v4_norm_kernel<28, 8>(bool);

}  // namespace futransformer::cuda::w4a16
