// What accelerator this process can use.
#pragma once

#include <string>

namespace futransformer {

struct DeviceInfo {
  bool cuda_built = false;     // the library was compiled with the CUDA kernels
  int device_count = 0;        // CUDA devices visible (0 without a driver or GPU)
  bool hopper = false;         // device 0 is compute capability 9.0 (H100/H200), which the kernels target
  std::string name;            // device 0's name, or why there is none
  int sm_count = 0;
  double memory_gib = 0;
};

DeviceInfo query_device();

}  // namespace futransformer
