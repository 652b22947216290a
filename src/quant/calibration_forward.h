// GPTQ's calibration forward on the GPU: ref::RefModel's embed / run_layer(i, hook) / projection /
// set_projection_weights for the fp32 model (no activation quantiser, fp32 cache), with activations and one layer's
// weights in device memory. quantize_model.cpp sees only this header (no CUDA header); builds without CUDA link
// stubs that throw an Error saying so.
//
// Same math and order as src/ref/ref_model.cpp: RMSNorm (fp64 sum of squares, y = w·(scale·x)), q/k/v, o,
// gate/up, down as fp32 GEMMs (cuBLAS, CUBLAS_COMPUTE_32F, no TF32), RoPE with ref::rope_inv_freq's frequencies and
// fp64 angles at positions 0 … n−1 of each window, causal GQA attention per window (scores Q·Kᵀ/√d by fp32 GEMM, a
// max-subtracted softmax with an fp64 sum, then P·V), SwiGLU, residual adds. Results differ from the CPU's only by
// summation order inside the GEMMs and fp64 sums and by the GPU's expf/cos/sin (tests/gpu/test_calibration_forward.cpp
// bounds the difference).
//
// Memory: the activations ([rows, hidden], [rows, q width], 2 × [rows, intermediate] fp32), one attention score
// block (bounded by CalibrationForwardOptions::attention_scores_bytes) and the weights of the layer being run, which
// run_layer uploads from the host Model when it starts and frees when it returns. Work runs on the default stream,
// so it is ordered with CudaHessianAccumulator::add_device and gptq_quantize_detailed_cuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "futransformer/model.h"
#include "ref/ref_model.h"

namespace futransformer::quant {

struct CalibrationForwardOptions {
  // Bytes of the attention score block (all query heads × a block of queries × the keys they see, fp32): the query
  // block shrinks so that long windows stay within it. 256 MiB holds 32 heads × 512 queries × 4096 keys.
  size_t attention_scores_bytes = size_t{256} << 20;
};

// x_device: [rows, cols] fp32 in device memory, the exact input the group's projections are about to multiply;
// valid for the duration of the call.
using DeviceLayerHook =
    std::function<void(int64_t layer, ref::ProjectionInput input, const float* x_device, int64_t rows, int64_t cols)>;

class CudaCalibrationForward {
 public:
  // The calibration windows' token ids (each non-empty, ids in [0, vocab), at most max_position_embeddings long);
  // their rows are concatenated in order, each window a sequence starting at position 0. `model` must outlive this
  // object: its layers' weights are read from it (converted to fp32) when each layer runs. Throws Error on bad
  // windows, in a build without CUDA, or without a CUDA device.
  CudaCalibrationForward(const Model& model, std::vector<int64_t> window_lengths,
                         const CalibrationForwardOptions& options = {});
  ~CudaCalibrationForward();
  CudaCalibrationForward(const CudaCalibrationForward&) = delete;
  CudaCalibrationForward& operator=(const CudaCalibrationForward&) = delete;

  int64_t rows() const;
  int64_t num_layers() const;
  // x = the embedding rows of the windows' tokens (sizes as given to the constructor).
  void embed(std::span<const std::vector<int32_t>> windows);
  // x replaced by host values [rows, hidden] / downloaded.
  void set_activations(std::span<const float> x);
  std::vector<float> activations() const;

  // One decoder layer in place on x; the hook sees each projection group's input before its projections run.
  void run_layer(int64_t layer, const DeviceLayerHook& hook = {});
  // The fp32 weights [out, in] of a projection of the layer being run (host memory), as swapped in so far. Only
  // while run_layer(layer) is running (from the hook); an Error otherwise.
  std::span<const float> projection(int64_t layer, ref::Projection p) const;
  // Replaces a projection's weights (same shape) in the running layer, host and device copies; the group's GEMMs
  // that follow use them. Only from the hook of run_layer(layer), for a projection whose group has not run yet.
  void set_projection_weights(int64_t layer, ref::Projection p, std::vector<float> weights);

  // Seconds spent so far in run_layer outside the hook (GPU work synchronised before each hook call) and in
  // uploading layers' weights (host fp32 conversion included).
  double forward_seconds() const;
  double upload_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace futransformer::quant
