// Launcher and host checks of the W4A16 chain (w4a16_chain.h).
#include "cuda/w4a16_chain.cuh"

#include <cuda_runtime.h>

#include <string>

#include "cuda/launch_status.h"

namespace futransformer::cuda::w4a16 {

namespace {

std::string stage_name(size_t s) { return "w4a16_chain: stage " + std::to_string(s); }

}  // namespace

cudaError_t w4a16_chain_can_implement(std::span<const ChainStage> stages, int M, std::string* why) {
  if (M < 1 || M > kChainMaxRows)
    return reject(why, "w4a16_chain: M = " + std::to_string(M) + ", expected 1.." + std::to_string(kChainMaxRows));
  if (stages.empty() || stages.size() > static_cast<size_t>(kChainMaxStages))
    return reject(why, "w4a16_chain: " + std::to_string(stages.size()) + " stages, expected 1.." +
                           std::to_string(kChainMaxStages));
  for (size_t s = 0; s < stages.size(); ++s) {
    const ChainStage& st = stages[s];
    const std::string at = stage_name(s);
    if (st.N <= 0 || st.N % kBlockN != 0 || st.N > (1 << 20))
      return reject(why, at + ": N = " + std::to_string(st.N) + ", expected a positive multiple of 32 up to 2^20");
    if (st.K <= 0 || st.K % kChainSlotK != 0 || st.K > (1 << 18))
      return reject(why, at + ": K = " + std::to_string(st.K) + ", expected a positive multiple of " +
                             std::to_string(kChainSlotK) + " up to 2^18");
    if (st.group != 32 && st.group != 64 && st.group != 128)
      return reject(why, at + ": group = " + std::to_string(st.group) + ", expected 32, 64 or 128");
    if (static_cast<int64_t>(M) * st.K > kChainMaxXElems)
      return reject(why, at + ": M * K = " + std::to_string(static_cast<int64_t>(M) * st.K) +
                             " activations, more than the " + std::to_string(kChainMaxXElems) + " staged per CTA");
    if (st.w == nullptr || st.scales == nullptr || st.y == nullptr)
      return reject(why, at + ": a null weight, scale or output pointer");
    if (!aligned(st.w, 16) || !aligned(st.scales, 16) || !aligned(st.y, 16))
      return reject(why, at + ": weights, scales and output must be 16-byte aligned");
    if (st.delay_ns < 0) return reject(why, at + ": delay_ns = " + std::to_string(st.delay_ns) + ", expected >= 0");
    if (s == 0) {
      if (st.input != ChainInput::first) return reject(why, at + ": the first stage must read the chain's input");
      continue;
    }
    const int prev_n = stages[s - 1].N;
    const int64_t need = static_cast<int64_t>(st.input_offset) +
                         (st.input == ChainInput::swiglu ? 2 * static_cast<int64_t>(st.K) : st.K);
    if (st.input != ChainInput::previous && st.input != ChainInput::swiglu)
      return reject(why, at + ": input must be previous or swiglu after the first stage");
    if (st.input_offset < 0 || st.input_offset % 8 != 0 || need > prev_n)
      return reject(why, at + ": reads previous columns [" + std::to_string(st.input_offset) + ", " +
                             std::to_string(need) + "), expected an offset that is a multiple of 8 within the " +
                             "previous stage's N = " + std::to_string(prev_n));
  }
  return cudaSuccess;
}

size_t w4a16_chain_workspace_bytes(int n_stages) {
  if (n_stages <= 0) return 0;
  const size_t table = (static_cast<size_t>(n_stages) * sizeof(ChainStage) + 15) / 16 * 16;
  return table + static_cast<size_t>(n_stages) * sizeof(uint32_t);
}

cudaError_t w4a16_chain(std::span<const ChainStage> stages, const __nv_bfloat16* x0, int M,
                        formats::ScaleType scale_type, void* workspace, size_t workspace_bytes, bool upload, int ctas,
                        int stages_ahead, cudaStream_t stream, std::string* why, ChainCopies copies) {
  if (const cudaError_t e = w4a16_chain_can_implement(stages, M, why); e != cudaSuccess) return e;
  if (x0 == nullptr || !aligned(x0, 16)) return reject(why, "w4a16_chain: x0 must be a 16-byte aligned pointer");
  if (stages_ahead < 0)
    return reject(why, "w4a16_chain: stages_ahead = " + std::to_string(stages_ahead) + ", expected >= 0");
  if (copies != ChainCopies::bulk && copies != ChainCopies::warp)
    return reject(why, "w4a16_chain: copies must be bulk or warp");
  if (copies == ChainCopies::warp && stages_ahead != kChainAnyStagesAhead)
    return reject(why, "w4a16_chain: warp copies run ahead as far as the ring allows; stages_ahead must be "
                       "kChainAnyStagesAhead");
  const int n = static_cast<int>(stages.size());
  if (const cudaError_t e = check_workspace("w4a16_chain", static_cast<int64_t>(w4a16_chain_workspace_bytes(n)),
                                            workspace, workspace_bytes, why);
      e != cudaSuccess)
    return e;
  auto* table = static_cast<ChainStage*>(workspace);
  auto* counters = reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(workspace) +
                                               w4a16_chain_workspace_bytes(n) - n * sizeof(uint32_t));
  const bool f16 = scale_type == formats::ScaleType::F16;
  using Kernel = void (*)(const ChainStage*, int, const __nv_bfloat16*, int, uint32_t*, int);
  const bool warp_copies = copies == ChainCopies::warp;
  const Kernel kfn = f16 ? (warp_copies ? &w4a16_chain_kernel<true, true> : &w4a16_chain_kernel<true, false>)
                         : (warp_copies ? &w4a16_chain_kernel<false, true> : &w4a16_chain_kernel<false, false>);
  const void* kernel = reinterpret_cast<const void*>(kfn);
  int dev = 0, sms = 0, coop = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess)
    return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev); e != cudaSuccess)
    return e;
  if (!coop) return reject(why, "w4a16_chain: the device does not support cooperative launch");
  if (const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kChainSmemBytes);
      e != cudaSuccess)
    return e;
  int per_sm = 0;
  if (const cudaError_t e =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kChainThreads, kChainSmemBytes);
      e != cudaSuccess)
    return e;
  if (ctas <= 0) ctas = sms;
  if (ctas > per_sm * sms)
    return reject(why, "w4a16_chain: " + std::to_string(ctas) + " CTAs cannot all be resident (" +
                           std::to_string(per_sm) + " per SM x " + std::to_string(sms) + " SMs)");
  if (upload) {
    if (const cudaError_t e = cudaMemcpyAsync(table, stages.data(), stages.size() * sizeof(ChainStage),
                                              cudaMemcpyHostToDevice, stream);
        e != cudaSuccess)
      return e;
  }
  if (const cudaError_t e = cudaMemsetAsync(counters, 0, n * sizeof(uint32_t), stream); e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(kChainThreads);
  cfg.dynamicSmemBytes = kChainSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  const ChainStage* table_c = table;
  return cudaLaunchKernelEx(&cfg, kfn, table_c, n, x0, M, counters, stages_ahead);
}

}  // namespace futransformer::cuda::w4a16
