// Where the GPU calibration forward (quant/calibration_forward.h) cannot run, it and quantize_model say why; the
// forward's device follows QuantizeOptions (recorded as gptq.calibration_forward). The forward itself is tested
// against the reference model in tests/gpu/test_calibration_forward.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "futransformer/device.h"
#include "futransformer/error.h"
#include "futransformer/quant/quantize_model.h"
#include "quant/calibration_forward.h"
#include "quant_test_util.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {
using test::random_calibration;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Without CUDA in the build, or without a device, the GPU forward and quantize_model's GPU path name what is missing.
TEST(CalibrationForward, RefusedClearlyWhereItCannotRun) {
  const DeviceInfo info = query_device();
  if (info.cuda_built && info.device_count > 0) GTEST_SKIP() << "a CUDA device is present (GPU tests cover it)";
  const Model m = test::make_tiny_llama({}, 1);
  const std::string direct = error_of([&] { quant::CudaCalibrationForward f(m, {4, 5}); });
  EXPECT_NE(direct.find("GPTQ calibration forward on the GPU"), std::string::npos) << direct;
  EXPECT_NE(direct.find(info.cuda_built ? "no CUDA device" : "built without CUDA"), std::string::npos) << direct;

  quant::QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse("int4-gptq-g32");
  o.gptq_device = quant::GptqDevice::Cuda;
  const quant::CalibrationSet calib = random_calibration(2, 16, m.config.vocab_size, 2);
  const std::string via_quantize = error_of([&] { (void)quant::quantize_model(m, calib, o); });
  EXPECT_NE(via_quantize.find("on the GPU"), std::string::npos) << via_quantize;
  EXPECT_NE(via_quantize.find(info.cuda_built ? "no CUDA device" : "built without CUDA"), std::string::npos)
      << via_quantize;
}

// The GPU forward feeds device activations to the Hessians, so it needs GPTQ on the GPU: refused before any work.
TEST(CalibrationForward, GpuForwardWithCpuGptqIsRefused) {
  const Model m = test::make_tiny_llama({}, 1);
  quant::QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse("int4-gptq-g32");
  o.calibration_device = quant::GptqDevice::Cuda;
  const std::string e = error_of([&] { (void)quant::quantize_model(m, random_calibration(2, 16, 61, 2), o); });
  EXPECT_NE(e.find("calibration forward on the GPU needs GPTQ on the GPU"), std::string::npos) << e;
}

// The CPU path records where its forward ran; an explicit Cpu forward is the default CPU run exactly.
TEST(CalibrationForward, CpuForwardIsRecordedAndIsTheDefault) {
  test::TinyLlama s;
  s.layers = 1;
  const Model m = test::make_tiny_llama(s, 4);
  const quant::CalibrationSet calib = random_calibration(2, 24, m.config.vocab_size, 3);
  quant::QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse("int4-gptq-g32");
  const quant::QuantizedModel a = quant::quantize_model(m, calib, o);
  o.calibration_device = quant::GptqDevice::Cpu;
  const quant::QuantizedModel b = quant::quantize_model(m, calib, o);
  EXPECT_EQ(a.recipe_json.at("gptq").at("calibration_forward"), "cpu");
  EXPECT_EQ(a.recipe_json, b.recipe_json);
  ASSERT_EQ(a.int4.size(), b.int4.size());
  for (const auto& [name, q] : a.int4) EXPECT_EQ(b.int4.at(name).qweight, q.qweight) << name;
  EXPECT_GT(a.timings.calibration_forward_s, 0.0);
  EXPECT_GT(a.timings.gptq_s, 0.0);
  EXPECT_GE(a.timings.total_s, a.timings.calibration_forward_s + a.timings.hessian_s + a.timings.gptq_s);
}

}  // namespace
}  // namespace futransformer
