// Device discovery for --device auto/cuda: the kernels are built for sm_90a only, so anything but compute
// capability 9.0 falls back to the CPU reference engine.
#include <cuda_runtime.h>

#include "futransformer/device.h"

namespace futransformer {

DeviceInfo query_device() {
  DeviceInfo info;
  info.cuda_built = true;
  const cudaError_t err = cudaGetDeviceCount(&info.device_count);
  if (err != cudaSuccess || info.device_count == 0) {
    info.device_count = 0;
    info.name = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    info.name = "cannot read device 0 properties";
    return info;
  }
  info.name = prop.name;
  info.hopper = prop.major == 9 && prop.minor == 0;
  info.sm_count = prop.multiProcessorCount;
  info.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return info;
}

}  // namespace futransformer
