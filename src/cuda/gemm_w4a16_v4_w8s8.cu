// v4 W4A16 GEMM instances for CTAs of 8 warps with 8 ring slots per thread (see gemm_w4a16_v4_dispatch.cuh): a
// quarter of the default ring (32 KB per CTA), so three CTAs (24 warps) share an SM where the default's shared memory
// allows two: more warps to hide the dequant -> MMA latency chains with the same bytes in flight per SM.
#include "cuda/gemm_w4a16_v4_dispatch.cuh"

namespace futransformer::cuda::w4a16 {

template KernelFn v4_kernel<8, 8>(const Tiling&, bool, bool);
template NormKernelFn v4_norm_kernel<8, 8>(bool);

}  // namespace futransformer::cuda::w4a16
