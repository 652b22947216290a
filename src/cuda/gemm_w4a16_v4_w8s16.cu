// v4 W4A16 GEMM instances for CTAs of 8 warps with 16 ring slots per thread (see gemm_w4a16_v4_dispatch.cuh).
#include "cuda/gemm_w4a16_v4_dispatch.cuh"

namespace futransformer::cuda::w4a16 {

template KernelFn v4_kernel<8, 16>(const Tiling&, bool, bool);
template NormKernelFn v4_norm_kernel<8, 16>(bool);

}  // namespace futransformer::cuda::w4a16
