// Host-side helpers shared by the GPU tests: device detection that skips (never silently passes) without a
// suitable device, and an owning device buffer with upload, download and NaN poisoning.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "futransformer/dtype.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"

namespace futransformer::test {

inline bool have_cuda_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error for later calls
    return false;
  }
  return n > 0;
}

// sm_90 exactly: the FP8 kernels use sm_90a-only instructions.
inline bool have_hopper() {
  if (!have_cuda_device()) return false;
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
}

// Statements, not expressions: GTEST_SKIP returns from the test body.
#define FT_REQUIRE_CUDA_DEVICE() \
  if (!::futransformer::test::have_cuda_device()) GTEST_SKIP() << "no CUDA device"
#define FT_REQUIRE_HOPPER() \
  if (!::futransformer::test::have_hopper()) GTEST_SKIP() << "no sm_90 (Hopper) CUDA device"

// Failures are reported through EXPECT_* so a broken allocation or copy fails the calling test.
template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> download() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  // All bytes 0xFF: a NaN in every BF16 (0xFFFF) or fp32 element, so an element the kernel never writes shows.
  cudaError_t poison() { return cudaMemset(p, 0xFF, n * sizeof(T)); }
};

// Every tensor rounded through BF16: what the CUDA engine stores, so that full-precision tensors are then exactly
// the reference's and the end-to-end tests compare like with like.
inline Model bf16_model(Model m) {
  for (auto& [name, t] : m.tensors) {
    std::vector<float> v = t.to_f32();
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    t = Tensor::from_f32(name, t.shape, std::move(v));
  }
  return m;
}

// gtest parameter names for KV formats ("int4-hadamard" → "int4_hadamard").
inline std::string kv_param_name(const ::testing::TestParamInfo<formats::KvFormat>& info) {
  std::string n = formats::kv_format_name(info.param);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// `model` quantised to `recipe` without calibration data: RTN, FP8 or full weights (GPTQ needs a calibration set).
inline quant::QuantizedModel quantise(const Model& model, const std::string& recipe) {
  quant::QuantizeOptions qo;
  qo.recipe = PrecisionRecipe::parse(recipe);
  return quant::quantize_model(model, quant::CalibrationSet{}, qo);
}

// Index of the largest value (the first on ties): a greedy token.
inline int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace futransformer::test
