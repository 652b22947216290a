#include "cli/device_choice.h"

#include "futransformer/cuda_engine.h"
#include "futransformer/device.h"
#include "futransformer/error.h"
#include "futransformer/reference_engine.h"

namespace futransformer::cli {

Backend choose_backend(const std::string& device) {
  if (device == "cpu") return Backend::Cpu;
  check(device == "cuda" || device == "auto", "--device: expected cpu, cuda or auto, got '", device, "'");
  const DeviceInfo info = query_device();
  if (device == "auto") return info.cuda_built && info.hopper ? Backend::Cuda : Backend::Cpu;
  check(info.cuda_built, "--device cuda: this futransformer was built without CUDA (no nvcc at configure time)");
  check(info.device_count > 0, "--device cuda: no CUDA device is available (", info.name, ")");
  check(info.hopper, "--device cuda: the kernels need a Hopper GPU (sm_90: H100/H200); device 0 is ", info.name);
  return Backend::Cuda;
}

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu reference"; }

std::unique_ptr<Engine> make_engine(Backend b, const Model& model, const ReferenceOptions& options) {
  if (b == Backend::Cuda) {
    const ActivationFormat a = options.activations;
    check(a != ActivationFormat::Fp8PerToken && a != ActivationFormat::Fp8OverBf16 &&
              a != ActivationFormat::Fp8BlockOverBf16,
          "--device cuda: FP8 activations feed only FP8 GEMMs; the CUDA engine runs BF16 activations (act-bf16)");
    CudaEngineOptions o;
    if (options.kv) o.kv = *options.kv;
    o.max_sequence_length = options.max_sequence_length;
    return make_cuda_engine(model, o);
  }
  return make_reference_engine(model, options);
}

}  // namespace futransformer::cli
