// CPU-only builds: no CUDA device can be used.
#include "futransformer/device.h"

namespace futransformer {

DeviceInfo query_device() {
  DeviceInfo info;
  info.name = "built without CUDA";
  return info;
}

}  // namespace futransformer
