#include "cli/device_choice.h"

#include "futransformer/device.h"
#include "futransformer/error.h"
#include "futransformer/reference_engine.h"

namespace futransformer::cli {

Backend choose_backend(const std::string& device) {
  if (device == "cpu") return Backend::Cpu;
  const DeviceInfo info = query_device();
  if (device == "auto") return Backend::Cpu;  // the CUDA engine is not built yet: see below
  check(device == "cuda", "--device: expected cpu, cuda or auto, got '", device, "'");
  check(info.cuda_built, "--device cuda: this futransformer was built without CUDA (no nvcc at configure time)");
  check(info.device_count > 0, "--device cuda: no CUDA device is available (", info.name, ")");
  check(info.hopper, "--device cuda: the kernels need a Hopper GPU (sm_90: H100/H200); device 0 is ", info.name);
  fail("--device cuda: the CUDA engine is not built yet in this version (the INT4 decode and FP8 prefill kernels ",
       "are in progress); use --device cpu");
}

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu reference"; }

std::unique_ptr<Engine> make_engine(Backend b, const Model& model, const ReferenceOptions& options) {
  check(b == Backend::Cpu, "internal: CUDA engine requested but not available");
  return make_reference_engine(model, options);
}

}  // namespace futransformer::cli
