// The CUDA engine's choice, per pass, between the W4A16 GEMM and dequantise-to-BF16 + cuBLAS for INT4 projections
// (CudaEngineOptions::int4_dequant_min_rows, FT_INT4_DEQUANT_MIN_ROWS; accuracy against the reference engine is in
// test_cuda_engine.cpp, Int4DequantPrefillMatchesReference and SmolLM2Int4DequantPrefillWithinNoiseFloor):
//  - a pass takes the new path exactly when its rows reach the threshold (op profile labels per pass; a prompt cut into
//    passes of 128 and 100 rows, thresholds 100 / 101 / 129 / 0); an engine whose threshold no pass reaches returns
//    the logits of the disabled one bit for bit (the W4A16 path is unchanged), one that takes the path does not;
//  - memory: the scratch is the largest INT4 projection's N·K BF16 values, counted in memory().workspace and in the
//    report's estimate, and absent when the threshold is 0, above max_batch_tokens, or the projections are BF16;
//  - the environment variable applies when the option is -1, an explicit option wins, a malformed value is an Error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "futransformer/cuda_engine.h"
#include "futransformer/engine.h"
#include "futransformer/error.h"
#include "futransformer/eval/report.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "gpu_test_util.h"
#include "tiny_llama.h"

namespace {

using namespace futransformer;
using test::quantise;
using test::bf16_model;

// tiny_llama_w4a16_shape's gate|up, 1536 x 256, is its largest projection: this many bytes of BF16 scratch.
constexpr int64_t kTinyScratchBytes = 2 * 1536 * 256;

// Sets an environment variable for a scope and restores the previous state.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_)
      setenv(name_, saved_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

int64_t calls(const std::vector<CudaEngine::OpTime>& ops, const std::string& op) {
  for (const CudaEngine::OpTime& t : ops)
    if (t.op == op) return t.calls;
  return 0;
}

int64_t calls_containing(const std::vector<CudaEngine::OpTime>& ops, const std::string& part) {
  int64_t n = 0;
  for (const CudaEngine::OpTime& t : ops)
    if (t.op.find(part) != std::string::npos) n += t.calls;
  return n;
}

// A 228-token prompt in passes of 128 and 100 rows, then one decode step; every pass's choice shows in the op labels.
TEST(CudaEngineInt4Dequant, PassesReachingTheThresholdTakeThePathAndOthersAreUnchanged) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 51)), "int4-rtn-g64+kv-bf16");
  std::mt19937 rng(3);
  const SequenceChunk prompt{0, test::random_token_ids(228, s.vocab, rng)};
  const SequenceChunk step{0, {11}};
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused epilogues" : "separate epilogues");
    struct Run {
      int64_t threshold, dequant_passes;
      std::vector<float> prompt_logits, step_logits;
    };
    std::vector<Run> runs = {{0, 0, {}, {}}, {100, 2, {}, {}}, {101, 1, {}, {}}, {129, 0, {}, {}}};
    for (Run& r : runs) {
      SCOPED_TRACE(testing::Message() << "threshold " << r.threshold);
      CudaEngineOptions co = cuda_engine_options(q.recipe);
      co.max_batch_tokens = 128;
      co.fused_epilogues = fused;
      co.profile_ops = true;
      co.int4_dequant_min_rows = r.threshold;
      std::unique_ptr<CudaEngine> e = make_cuda_engine(q, co);
      r.prompt_logits = e->forward(std::span(&prompt, 1), true)[0];
      r.step_logits = e->forward(std::span(&step, 1))[0];
      const std::vector<CudaEngine::OpTime> ops = e->op_profile();
      const int64_t L = s.layers, dq = r.dequant_passes, w4 = 3 - dq;  // 3 passes: 128 rows, 100 rows, the step
      EXPECT_EQ(calls(ops, "qkv GEMM (dequant + cuBLAS)"), L * dq);
      EXPECT_EQ(calls(ops, "qkv GEMM"), L * w4);
      EXPECT_EQ(calls(ops, "o GEMM (dequant + cuBLAS)"), L * dq);
      EXPECT_EQ(calls(ops, "down GEMM (dequant + cuBLAS)"), L * dq);
      EXPECT_EQ(calls_containing(ops, "(dequant + cuBLAS)"), 4 * L * dq);
      if (fused) {
        // The large passes keep no fused epilogue: o and down write BF16 and the residual add joins the RMSNorm.
        EXPECT_EQ(calls(ops, "gate|up GEMM (dequant + cuBLAS) + SwiGLU"), L * dq);
        EXPECT_EQ(calls(ops, "gate|up GEMM + SwiGLU"), L * w4);
        EXPECT_EQ(calls(ops, "o GEMM + residual") + calls(ops, "o GEMM + residual + MLP RMSNorm") +
                      calls(ops, "o GEMM (dequant + cuBLAS)"),
                  L * 3);
        EXPECT_EQ(calls(ops, "residual + MLP RMSNorm"), L * dq);
      } else {
        EXPECT_EQ(calls(ops, "gate|up GEMM (dequant + cuBLAS)"), L * dq);
        EXPECT_EQ(calls(ops, "SwiGLU"), L * 3);
      }
    }
    // Thresholds no pass reaches leave the W4A16 path as it was, bit for bit; reaching one changes the prompt's logits.
    EXPECT_EQ(runs[3].prompt_logits, runs[0].prompt_logits);
    EXPECT_EQ(runs[3].step_logits, runs[0].step_logits);
    EXPECT_NE(runs[1].prompt_logits, runs[0].prompt_logits);
    EXPECT_NE(runs[2].prompt_logits, runs[0].prompt_logits);
  }
}

TEST(CudaEngineInt4Dequant, ScratchIsTheLargestProjectionAndCountedInTheWorkspace) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const Model model = bf16_model(test::make_tiny_llama(s, 52));
  const quant::QuantizedModel q = quantise(model, "int4-rtn-g32+kv-bf16");
  auto engine = [&](int64_t threshold, int64_t batch_tokens) {
    CudaEngineOptions co = cuda_engine_options(q.recipe);
    co.int4_dequant_min_rows = threshold;
    co.max_batch_tokens = batch_tokens;
    return make_cuda_engine(q, co);
  };
  const std::unique_ptr<CudaEngine> on = engine(64, 256), off = engine(0, 256), unreached = engine(257, 256);
  EXPECT_EQ(on->memory().int4_dequant_scratch, kTinyScratchBytes);
  EXPECT_EQ(off->memory().int4_dequant_scratch, 0);
  EXPECT_EQ(on->memory().workspace - off->memory().workspace, kTinyScratchBytes);
  EXPECT_EQ(on->memory().total() - off->memory().total(), kTinyScratchBytes);
  EXPECT_EQ(unreached->memory().int4_dequant_scratch, 0);
  EXPECT_NE(unreached->description().find("W4A16 GEMM at every pass"), std::string::npos) << unreached->description();
  EXPECT_NE(engine(256, 256)->description().find(">= 256 rows"), std::string::npos);
  // BF16 projections have nothing to dequantise.
  CudaEngineOptions full;
  full.kv = formats::KvFormat::BF16;
  full.int4_dequant_min_rows = 64;
  EXPECT_EQ(make_cuda_engine(model, full)->memory().int4_dequant_scratch, 0);
  // The report's estimate makes the same choice (default threshold: the variable, else 192).
  for (const int64_t batch_tokens : {int64_t{96}, int64_t{1024}}) {
    const std::unique_ptr<CudaEngine> e = engine(-1, batch_tokens);
    const eval::GpuMemoryEstimate est = eval::estimate_gpu_memory(model.config, q.recipe, 32, 256, batch_tokens);
    EXPECT_EQ(est.int4_dequant_scratch, e->memory().int4_dequant_scratch) << batch_tokens << " batch tokens";
  }
}

TEST(CudaEngineInt4Dequant, EnvironmentVariableAppliesUnlessTheOptionIsSet) {
  FT_REQUIRE_HOPPER();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(test::tiny_llama_w4a16_shape(), 53)), "int4-rtn-g64");
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  {
    const ScopedEnv env("FT_INT4_DEQUANT_MIN_ROWS", "48");
    EXPECT_NE(make_cuda_engine(q, co)->description().find(">= 48 rows"), std::string::npos);
    co.int4_dequant_min_rows = 0;
    EXPECT_NE(make_cuda_engine(q, co)->description().find("W4A16 GEMM at every pass"), std::string::npos);
    co.int4_dequant_min_rows = -1;
  }
  {
    const ScopedEnv env("FT_INT4_DEQUANT_MIN_ROWS", nullptr);
    EXPECT_NE(make_cuda_engine(q, co)->description().find(">= 192 rows"), std::string::npos);
  }
  {
    const ScopedEnv env("FT_INT4_DEQUANT_MIN_ROWS", "many");
    try {
      make_cuda_engine(q, co);
      ADD_FAILURE() << "accepted FT_INT4_DEQUANT_MIN_ROWS=many";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FT_INT4_DEQUANT_MIN_ROWS"), std::string::npos) << e.what();
    }
  }
  co.int4_dequant_min_rows = -2;
  EXPECT_THROW(make_cuda_engine(q, co), Error);
}

}  // namespace
