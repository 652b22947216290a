// The GPTQ backend hook of quantize_model (quant/gptq_backend.h): the CPU backend is exactly HessianAccumulator +
// gptq_quantize_detailed, and the GPU backend is refused with a clear message where it cannot run. (The GPU backend
// itself is tested against the CPU in tests/gpu/test_gptq_cuda.cpp and tests/gpu/test_quantize_cuda.cpp.)
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "futransformer/device.h"
#include "futransformer/error.h"
#include "futransformer/quant/gptq.h"
#include "futransformer/quant/gptq_cuda.h"
#include "quant/gptq_backend.h"

namespace futransformer::quant {
namespace {

std::vector<float> normal_values(size_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

TEST(GptqBackend, CpuBackendIsTheCpuQuantiserBitForBit) {
  constexpr int64_t kRows = 24, kCols = 128, kTokens = 300;
  const auto x = normal_values(kTokens * kCols, 1.0f, 3);
  const auto w = normal_values(kRows * kCols, 0.05f, 4);
  const GptqOptions opt{formats::Int4Spec{32, false}, 0.01, 128, true};
  HessianAccumulator h(kCols, "h");
  h.add(x.data(), kTokens);
  const GptqResult want = gptq_quantize_detailed(w, kRows, kCols, h, opt, "w");
  const auto backend = make_gptq_backend(GptqDevice::Cpu);
  EXPECT_EQ(backend->device(), GptqDevice::Cpu);
  EXPECT_THROW(backend->quantize(w, kRows, kCols, opt, "w"), Error);  // no inputs yet
  backend->set_inputs(x.data(), kTokens, kCols, "h");
  const GptqResult got = backend->quantize(w, kRows, kCols, opt, "w");
  EXPECT_EQ(got.weight.qweight, want.weight.qweight);
  EXPECT_EQ(got.weight.scales, want.weight.scales);
  EXPECT_EQ(got.weight.zeros, want.weight.zeros);
  EXPECT_EQ(got.stats.loss, want.stats.loss);
  EXPECT_STREQ(gptq_device_name(GptqDevice::Cpu), "cpu");
  EXPECT_STREQ(gptq_device_name(GptqDevice::Cuda), "cuda");
}

// Without CUDA in the build, or without a device, asking for the GPU says which of the two is missing.
TEST(GptqBackend, CudaBackendIsRefusedClearlyWhereItCannotRun) {
  const DeviceInfo info = query_device();
  if (info.cuda_built && info.device_count > 0) GTEST_SKIP() << "a CUDA device is present (GPU tests cover it)";
  try {
    (void)make_gptq_backend(GptqDevice::Cuda);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GPTQ on the GPU"), std::string::npos) << msg;
    EXPECT_NE(msg.find(info.cuda_built ? "no CUDA device" : "built without CUDA"), std::string::npos) << msg;
  }
  EXPECT_THROW(CudaHessianAccumulator(16, "h"), Error);
}

}  // namespace
}  // namespace futransformer::quant
