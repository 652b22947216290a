// The futransformer tool as a user runs it: real processes, real files, exit codes and messages.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cli_runner.h"
#include "futransformer/device.h"
#include "test_paths.h"

namespace futransformer {
namespace {

using Result = test::CliResult;
using test::quote;
using test::run_cli;
using test::slurp;

TEST(Cli, GenerateStories260KReproducesGolden) {
  const std::string dir = test::shared_path("models/stories260K/");
  FT_REQUIRE_FILE(dir + "golden-once-upon-a-time.txt");
  // 200 run.c steps = the prompt's 4 tokens after BOS + 196 new tokens.
  const Result r = run_cli("generate --model " + quote(dir + "stories260K.bin") + " --tokenizer " +
                           quote(dir + "tok512.bin") + " --prompt 'Once upon a time' --temperature 0 -n 196 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, slurp(dir + "golden-once-upon-a-time.txt"));
  EXPECT_NE(r.err.find("tok/s"), std::string::npos);
}

TEST(Cli, InfoSmolLM2ShowsConfig) {
  FT_REQUIRE_FILE(test::smollm2_gguf_path());
  const Result r = run_cli("info --model " + quote(test::smollm2_gguf_path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"hidden_size:              576", "num_hidden_layers:        30",
                           "num_attention_heads:      9", "num_key_value_heads:      3", "head_dim:                 64",
                           "vocab_size:               49152", "tie_word_embeddings:      true", "format:                   gguf"})
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing '" << line << "' in:\n" << r.out;
  EXPECT_NE(r.out.find("model.layers.{i}.self_attn.q_proj.weight"), std::string::npos);
  // GPU memory per recipe, and the FP8 prefill copy (K = 576, 1536 are multiples of 16: the FP8 GEMM takes them).
  for (const char* line : {"CUDA engine GPU memory", "full+kv-bf16", "int4-gptq-g64+kv-int4-hadamard",
                           "+ FP8 prefill weight copy"})
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing '" << line << "' in:\n" << r.out;
}

TEST(Cli, SmolLM2GreedyAnswersInEnglish) {
  FT_REQUIRE_FILE(test::smollm2_gguf_path());
  const Result r = run_cli("generate --model " + quote(test::smollm2_gguf_path()) +
                           " --prompt 'The capital of France is' --temperature 0 -n 12 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("The capital of France is", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
}

TEST(Cli, BadInputsGiveOneClearError) {
  const struct {
    std::string args;
    std::string message;
  } cases[] = {
      {"generate --model /nonexistent/model.gguf --prompt hi", "/nonexistent/model.gguf"},
      {"generate --prompt hi", "--model is required"},
      {"generate --model x.gguf --prompt hi --temperature -1", "temperature"},
      {"generate --model x.gguf --prompt hi --device tpu", "device"},
      {"info --model /etc/hostname", "unknown model format"},
      {"make-model --config llama-9b --out /tmp/x", "config"},
      {"frobnicate", "frobnicate"},
  };
  for (const auto& c : cases) {
    const Result r = run_cli(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  }
}

// Without a Hopper GPU, --device cuda is one clear error before any model work (and auto falls back to the CPU).
TEST(Cli, DeviceCudaWithoutGpuSaysWhy) {
  const DeviceInfo info = query_device();
  if (info.hopper) GTEST_SKIP() << "a Hopper GPU is present: --device cuda runs (tests/gpu cover it)";
  const std::string dir = test::shared_path("models/stories260K/");
  FT_REQUIRE_FILE(dir + "stories260K.bin");
  const Result r = run_cli("generate --model " + quote(dir + "stories260K.bin") + " --tokenizer " +
                           quote(dir + "tok512.bin") + " --prompt 'Once' -n 2 --device cuda");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.find("no CUDA device") != std::string::npos || r.err.find("built without CUDA") != std::string::npos ||
              r.err.find("Hopper") != std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
  const Result a = run_cli("generate --model " + quote(dir + "stories260K.bin") + " --tokenizer " +
                           quote(dir + "tok512.bin") + " --prompt 'Once' -n 2 --temperature 0 --device auto");
  EXPECT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.err.find("cpu reference engine"), std::string::npos) << a.err;
  // ppl too: the same one error, before tokenising or quantising anything.
  const std::string tmp = test::make_temp_dir("ppl-cuda");
  {
    std::ofstream f(tmp + "/eval.txt");
    for (int i = 0; i < 40; ++i) f << "Once upon a time there was a little girl who liked to play in the park.\n";
  }
  const Result p = run_cli("ppl --model " + quote(dir + "stories260K.bin") + " --tokenizer " +
                           quote(dir + "tok512.bin") + " --data " + quote(tmp + "/eval.txt") + " --ctx 32 --device cuda");
  EXPECT_NE(p.exit_code, 0);
  EXPECT_NE(p.err.find("--device cuda"), std::string::npos) << p.err;
  EXPECT_EQ(p.out, "");
}

TEST(Cli, Llama2cWithoutTokenizerSaysWhatToPass) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  FT_REQUIRE_FILE(bin);
  // stories260K's tok512.bin sits beside it and is found; a copy alone in a folder is not.
  const std::string dir = test::make_temp_dir("l2c");
  ASSERT_EQ(std::system(("cp " + quote(bin) + " " + dir + "/model.bin").c_str()), 0);
  const Result r = run_cli("generate --model " + dir + "/model.bin --prompt hi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
  std::remove((dir + "/model.bin").c_str());
  std::remove(dir.c_str());
}

}  // namespace
}  // namespace futransformer
