// v4 W4A16 GEMM instances for CTAs of 24 warps with 8 ring slots per thread (see gemm_w4a16_v4_dispatch.cuh): 24
// warps in one CTA (about the register file's limit at the M <= 8 path's ~72 registers) with 6 blocks each in
// flight (72 KB per CTA), so a layer whose N / 32 column blocks give about one CTA per SM (N = 4096 at warps_n = 1:
// 128 CTAs) still runs 24 warps per SM instead of 8 or 16, each on a third of the blocks.
#include "cuda/gemm_w4a16_v4_dispatch.cuh"

namespace futransformer::cuda::w4a16 {

template KernelFn v4_kernel<24, 8>(const Tiling&, bool, bool);
template NormKernelFn v4_norm_kernel<24, 8>(bool);

}  // namespace futransformer::cuda::w4a16
