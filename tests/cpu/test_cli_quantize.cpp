// `futransformer quantize`, and `generate`/`info` on its output, as a user runs them on stories260K.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "futransformer/device.h"
#include "test_paths.h"
#include "tiny_llama.h"

namespace futransformer {
namespace {

using Result = test::CliResult;
using test::quote;
using test::run_cli;
using test::slurp;

class CliQuantize : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::shared_path("models/stories260K/");
    if (!test::file_exists(dir_ + "stories260K.bin") || !test::file_exists(dir_ + "tok512.bin"))
      GTEST_SKIP() << "missing test file: " << dir_ << "stories260K.bin / tok512.bin";
    // A small English calibration text of our own, so the test does not depend on the fetched default.
    calibration_ = test::scratch_dir("calib") + "/calibration.txt";
    std::ofstream out(calibration_);
    for (int i = 0; i < 40; ++i)
      out << "Once there was a little dog named Max. He liked to run in the park with his friend Sue. " << i
          << " One day they found a big red ball under a tree, and they played until the sun went down.\n";
  }
  std::string model() const { return quote(dir_ + "stories260K.bin") + " --tokenizer " + quote(dir_ + "tok512.bin"); }
  std::string dir_, calibration_;
};

TEST_F(CliQuantize, GroupThatDoesNotDivideNamesTheTensor) {
  const std::string out = test::scratch_dir("q260k");
  const Result r = run_cli("quantize --model " + model() + " --out " + out + " --weights int4-rtn --group-size 32");
  EXPECT_EQ(r.exit_code, 1);
  for (const char* want : {"model.layers.0.mlp.down_proj.weight", "172", "group size 32", "per-channel"})
    EXPECT_NE(r.err.find(want), std::string::npos) << want << " not in: " << r.err;
  EXPECT_FALSE(test::file_exists(out + "/quantization.json"));
}

TEST_F(CliQuantize, GptqPerChannelThenGenerateAndInfo) {
  const std::string out = test::scratch_dir("q260k");
  const Result q = run_cli("quantize --model " + model() + " --out " + out + " --group-size ch --calibration " +
                           quote(calibration_) + " --samples 4 --sample-tokens 128");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  // The gptq stage's bar, completed (ProgressBar's 30-column bar).
  EXPECT_NE(q.err.find("[gptq] [" + std::string(30, '#') + "] 100% 35/35"), std::string::npos) << q.err;
  EXPECT_NE(q.out.find("int4-gptq-gch"), std::string::npos) << q.out;
  for (const char* f : {"config.json", "model.safetensors", "quantization.json", "tokenizer.model"})
    EXPECT_TRUE(test::file_exists(out + "/" + f)) << f;
  EXPECT_NE(slurp(out + "/quantization.json").find(calibration_), std::string::npos);
  // --device auto: GPTQ ran on the GPU exactly when this build has CUDA and a Hopper GPU is present.
  const DeviceInfo dev = query_device();
  const std::string want_device = dev.cuda_built && dev.hopper ? "cuda" : "cpu";
  EXPECT_EQ(nlohmann::json::parse(slurp(out + "/quantization.json")).at("gptq").at("device"), want_device);
  EXPECT_EQ(nlohmann::json::parse(slurp(out + "/quantization.json")).at("gptq").at("calibration_forward"),
            want_device);
  EXPECT_NE(q.err.find("times (s): load "), std::string::npos) << q.err;
  EXPECT_NE(q.err.find("GPTQ on " + want_device), std::string::npos) << q.err;

  const Result info = run_cli("info --model " + out);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("recipe:                   int4-gptq-gch"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("format:                   quantized"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("tokenizer:                512 tokens"), std::string::npos) << info.out;

  const Result g = run_cli("generate --device cpu --model " + out + " --prompt 'Once upon a time' --temperature 0 -n 30");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("Once upon a time", 0), 0u) << g.out;
  EXPECT_GT(g.out.size(), 40u) << g.out;
  EXPECT_NE(g.err.find("int4-gptq-gch"), std::string::npos) << g.err;

  const Result twice = run_cli("generate --device cpu --model " + out + " --prompt hi --recipe fp8");
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_NE(twice.err.find("already quantised"), std::string::npos) << twice.err;
}

TEST_F(CliQuantize, GenerateWithRecipeQuantisesInMemory) {
  const Result r = run_cli("generate --device cpu --model " + model() +
                           " --prompt 'Once upon a time' --temperature 0 -n 20 --recipe fp8+act-fp8+kv-bf16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("fp8+act-fp8+kv-bf16"), std::string::npos) << r.err;

  const struct {
    std::string args, message;
  } errors[] = {
      {"--recipe kv-int4", "head_dim 8"},
      {"--recipe int4-gptq-g48", "g32, g64, g128 or gch"},
      {"--recipe int4-rtn-g32+int4-rtn-g64", "two weight formats"},
  };
  for (const auto& e : errors) {
    const Result bad = run_cli("generate --device cpu --model " + model() + " --prompt hi " + e.args);
    EXPECT_EQ(bad.exit_code, 1) << e.args;
    EXPECT_NE(bad.err.find(e.message), std::string::npos) << e.args << ": " << bad.err;
  }
}

TEST_F(CliQuantize, Fp8AndArgumentErrors) {
  const std::string out = test::scratch_dir("q260k");
  const Result r = run_cli("quantize -q --model " + model() + " --out " + out + " --weights fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // -q: no progress line
  const Result g = run_cli("generate --device cpu --model " + out + " --prompt 'Once upon a time' --temperature 0 -n 10");
  EXPECT_EQ(g.exit_code, 0) << g.err;

  const Result both = run_cli("quantize --model " + model() + " --out " + out + " --recipe fp8 --weights int4-rtn");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("--recipe"), std::string::npos) << both.err;
  const Result group_fp8 = run_cli("quantize --model " + model() + " --out " + out + " --weights fp8 --group-size 32");
  EXPECT_EQ(group_fp8.exit_code, 1);
  EXPECT_NE(group_fp8.err.find("--group-size"), std::string::npos) << group_fp8.err;
  const Result bad_group = run_cli("quantize --model " + model() + " --out " + out + " --group-size 48");
  EXPECT_NE(bad_group.exit_code, 0);
  EXPECT_NE(bad_group.err.find("group-size"), std::string::npos) << bad_group.err;
  const Result bad_device = run_cli("quantize --model " + model() + " --out " + out + " --device gpu");
  EXPECT_NE(bad_device.exit_code, 0);
  EXPECT_NE(bad_device.err.find("--device"), std::string::npos) << bad_device.err;
  const Result no_calib = run_cli("quantize --model " + model() + " --out " + out +
                                  " --group-size ch --calibration /nonexistent/calib.txt");
  EXPECT_EQ(no_calib.exit_code, 1);
  EXPECT_NE(no_calib.err.find("/nonexistent/calib.txt"), std::string::npos) << no_calib.err;
}

}  // namespace
}  // namespace futransformer
