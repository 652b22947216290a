// Builds without nvcc: the GPU calibration forward exists and says why it cannot run.
#include "futransformer/error.h"
#include "quant/calibration_forward.h"

namespace futransformer::quant {
namespace {
[[noreturn]] void no_cuda() { fail("GPTQ calibration forward on the GPU: this futransformer was built without CUDA"); }
}  // namespace

struct CudaCalibrationForward::Impl {};

CudaCalibrationForward::CudaCalibrationForward(const Model&, std::vector<int64_t>, const CalibrationForwardOptions&) {
  no_cuda();
}
CudaCalibrationForward::~CudaCalibrationForward() = default;
int64_t CudaCalibrationForward::rows() const { no_cuda(); }
int64_t CudaCalibrationForward::num_layers() const { no_cuda(); }
void CudaCalibrationForward::embed(std::span<const std::vector<int32_t>>) { no_cuda(); }
void CudaCalibrationForward::set_activations(std::span<const float>) { no_cuda(); }
std::vector<float> CudaCalibrationForward::activations() const { no_cuda(); }
void CudaCalibrationForward::run_layer(int64_t, const DeviceLayerHook&) { no_cuda(); }
std::span<const float> CudaCalibrationForward::projection(int64_t, ref::Projection) const { no_cuda(); }
void CudaCalibrationForward::set_projection_weights(int64_t, ref::Projection, std::vector<float>) { no_cuda(); }
double CudaCalibrationForward::forward_seconds() const { no_cuda(); }
double CudaCalibrationForward::upload_seconds() const { no_cuda(); }

}  // namespace futransformer::quant
