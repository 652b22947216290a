// eval/device_quality.h against the host versions on the same CUDA engines: the logits are the same numbers either
// way (the engines are deterministic), so perplexity, KL and agreement may differ only by the order of fp64 sums
// inside a row (cuda/logit_stats.h) — far below these tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "futransformer/cuda_engine.h"
#include "futransformer/eval/device_quality.h"
#include "futransformer/eval/perplexity.h"
#include "futransformer/eval/report.h"
#include "futransformer/quant/quantize_model.h"
#include "gpu_test_util.h"
#include "tiny_llama.h"

namespace {

using namespace futransformer;
using test::quantise;

// fp64 sums of a few thousand terms in two orders: relative differences of order n · 2^-53; 1e-10 leaves room.
constexpr double kMeanRel = 1e-10;
constexpr double kKlAbs = 1e-12;

TEST(DeviceQuality, MatchesTheHostPassesOnTheSameEngines) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s;
  s.hidden = 128;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 64;
  s.vocab = 300;
  const Model model = test::make_tiny_llama(s, 41);
  CudaEngineOptions co;
  co.kv = formats::KvFormat::BF16;
  co.max_sequence_length = 64;
  std::unique_ptr<CudaEngine> full = make_cuda_engine(model, co);
  std::unique_ptr<CudaEngine> full2 = make_cuda_engine(model, co);  // a twin: the baseline compared with itself
  std::unique_ptr<CudaEngine> int4 = make_cuda_engine(quantise(model, "int4-rtn-g32"), co);
  std::mt19937 rng(9);
  const std::vector<int32_t> text = test::random_token_ids(3 * 64 + 17, s.vocab, rng);
  eval::PerplexityOptions o;
  o.ctx = 64;
  o.chunk = 24;  // 24 + 24 + 16: the last chunk's last row predicts nothing

  const eval::PerplexityResult host = eval::evaluate_perplexity(*full, text, o);
  const eval::PerplexityResult dev = eval::evaluate_perplexity_on_device(*full, text, o);
  EXPECT_EQ(dev.windows, 3);
  EXPECT_EQ(dev.predicted_tokens, host.predicted_tokens);
  EXPECT_NEAR(dev.mean_nll, host.mean_nll, kMeanRel * host.mean_nll);

  CudaEngine* others[2] = {int4.get(), full2.get()};
  Engine* host_others[2] = {int4.get(), full2.get()};
  const std::vector<eval::DistributionComparison> h = eval::compare_distributions(*full, host_others, text, o);
  const std::vector<eval::DistributionComparison> d = eval::compare_distributions_on_device(*full, others, text, o);
  ASSERT_EQ(d.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(d[k].predicted_tokens, h[k].predicted_tokens);
    EXPECT_NEAR(d[k].base.mean_nll, h[k].base.mean_nll, kMeanRel * h[k].base.mean_nll);
    EXPECT_NEAR(d[k].other.mean_nll, h[k].other.mean_nll, kMeanRel * h[k].other.mean_nll);
    EXPECT_NEAR(d[k].mean_kl, h[k].mean_kl, kKlAbs + kMeanRel * h[k].mean_kl);
    EXPECT_NEAR(d[k].max_kl, h[k].max_kl, kKlAbs + kMeanRel * h[k].max_kl);
    EXPECT_EQ(d[k].top1_agreement, h[k].top1_agreement);
  }
  EXPECT_GT(d[0].mean_kl, 0.0);  // INT4 differs from full
  EXPECT_EQ(d[1].mean_kl, 0.0);  // two identical engines: identical rows give exactly 0
  EXPECT_EQ(d[1].top1_agreement, 1.0);
}

}  // namespace
