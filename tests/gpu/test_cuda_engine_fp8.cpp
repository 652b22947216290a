// FP8 prefill in the CUDA engine (docs/design.md "FP8 prefill"): an INT4 decode model plus an FP8 copy of the same
// checkpoint's projections that every prompt chunk (more than one token) runs through gemm_fp8, checked against
// make_prefill_decode_reference_engine with prefill activations act-fp8-bf16 (the GPU's exact roundings: per-token
// FP8 GEMM inputs, BF16 GEMM outputs and q/k, o_proj's input the FP8 of the BF16 attention output) and decode
// activations act-bf16. The model is a random tiny Llama whose projection groups all qualify for the FP8 GEMM
// (hidden 256, intermediate 512, heads 4/2 of 64: K % 16 == 0, N % 8 == 0); its tensors are rounded to BF16 first
// (what the GPU stores). Two layers keep it well conditioned, so the literal bounds apply (no noise floor):
// prompt logits rel L2 <= 2e-2 and greedy tokens equal for 32 steps.
// The shape checks at the end need no device: make_cuda_engine refuses before touching the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "futransformer/cuda_engine.h"
#include "futransformer/dtype.h"
#include "futransformer/engine.h"
#include "futransformer/error.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/reference_engine.h"
#include "futransformer/tokenizer.h"
#include "gpu_test_util.h"
#include "test_paths.h"
#include "tiny_llama.h"

namespace {

using namespace futransformer;
using test::quantise;
using test::argmax;

// The bounds for FP8 prefill + INT4 decode against its reference twin: prompt logits rel L2 <= 2e-2 and
// greedy tokens equal for 32 steps. They hold only where the twin's own noise floor allows. What separates the GPU
// from the twin is the tensor cores' FP8 accumulation (about 14 significant bits per 128-product block, then fp32)
// and the order of fp32 sums: each moves a GEMM output by a fraction of a BF16 ulp, which now and then flips its BF16
// rounding and — through the next per-token FP8 quantisation, whose step is 2^-3 relative — an FP8 code. FP8
// re-quantisation amplifies any small perturbation that way (a flip is a whole E4M3 step), so the floor is measured,
// not assumed: floor = the twin's distance from the same recipe without the BF16 rounding points (act-fp8 prompts,
// fp32 decode), a perturbation of BF16-rounding size at every exchange point, larger than the GPU's. On this tiny
// random model the floor is ~8e-2 (more than the literal bound), so:
//   GPU vs twin <= max(2e-2, kFloorFactor · floor), where kFloorFactor = sqrt(2) (two independent perturbations
//   of the floor's size are sqrt(2) apart) · 1.1 margin;
//   greedy: when kFloorFactor · floor <= 2e-2 the literal rule (tokens equal for 32 steps); otherwise teacher-forced
//   (every engine fed the twin's tokens), top-1 agreement >= p - 2·sqrt(p·(1 - p) / 32) with p = min(0.9, twin vs
//   floor agreement): two standard errors of a 32-step agreement rate (one step is 1/32 = 0.03 of it).
// Batches with many chunks are judged pooled: mean error over the chunks against the mean floor.
constexpr double kMaxPromptLogitsRelL2 = 2e-2;
constexpr double kFloorFactor = 1.41421356 * 1.1;
constexpr int kGreedySteps = 32;
// Routing check: the INT4-everywhere reference is a different computation (INT4 g64 vs FP8 weights, ~10 % vs ~3 %
// per-weight error); the GPU's prompt logits must be closer to the FP8-prefill twin than to it by this factor.
constexpr double kRoutingMargin = 2.0;

constexpr const char* kDecodeRecipe = "int4-rtn-g64";
constexpr const char* kPrefillRecipe = "fp8+act-fp8";

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The FP8-qualifying tiny model, every tensor rounded through BF16.
Model fp8_tiny_model(uint32_t seed) {
  test::TinyLlama s;
  s.hidden = 256;
  s.inter = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.layers = 2;
  s.vocab = 500;
  return test::bf16_model(test::make_tiny_llama(s, seed));
}

// The GPU engine's twin: prompts as act-fp8-bf16 over the FP8 model, steps as act-bf16 over the INT4 model.
// With `block`: CudaEngineOptions::fp8_block_swiglu's recipe, act-fp8-block-bf16 (the down input per 128 channels).
std::unique_ptr<Engine> reference_twin(const quant::QuantizedModel& pre, const quant::QuantizedModel& dec,
                                       formats::KvFormat kv, bool block = false) {
  ReferenceOptions p, d;
  p.activations = block ? ActivationFormat::Fp8BlockOverBf16 : ActivationFormat::Fp8OverBf16;
  d.activations = ActivationFormat::Bf16;
  p.kv = d.kv = kv;
  return make_prefill_decode_reference_engine(pre.model, p, dec.model, d);
}

// The floor's other end: the same recipes with fp32 exchanges (act-fp8 prompts, fp32 decode steps).
std::unique_ptr<Engine> floor_twin(const quant::QuantizedModel& pre, const quant::QuantizedModel& dec,
                                   formats::KvFormat kv) {
  ReferenceOptions p, d;
  p.activations = ActivationFormat::Fp8PerToken;
  d.activations = ActivationFormat::Fp32;
  p.kv = d.kv = kv;
  return make_prefill_decode_reference_engine(pre.model, p, dec.model, d);
}

// Two engines' logits bit for bit: the first differing logit, with both values (one failure, not one per logit).
void expect_same_logit_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                            const char* got_name, const char* want_name) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << "logit " << i << ": " << got_name << " " << got[i] << ", " << want_name << " " << want[i];
  }
}

double bound_for(double floor) { return std::max(kMaxPromptLogitsRelL2, kFloorFactor * floor); }

// One prompt (all positions' logits: every prompt row went through the FP8 GEMMs), then kGreedySteps decode steps,
// judged as the header says. `ref_int4`, when given, is the routing check's INT4-everywhere reference.
void expect_fp8_prefill_matches(Engine& gpu, Engine& twin, Engine& floor, Engine* ref_int4,
                                const std::vector<int32_t>& prompt_ids, const std::string& what) {
  const SequenceChunk prompt{0, prompt_ids};
  const std::vector<float> lg = gpu.forward(std::span(&prompt, 1), true)[0];
  const std::vector<float> lr = twin.forward(std::span(&prompt, 1), true)[0];
  const std::vector<float> lf = floor.forward(std::span(&prompt, 1), true)[0];
  ASSERT_EQ(lg.size(), lr.size());
  const double err = rel_l2(lg, lr), prompt_floor = rel_l2(lf, lr);
  std::printf("%s: prompt logits (%zu positions) rel L2 vs FP8-prefill twin %.5f (floor %.5f, bound %.5f)\n",
              what.c_str(), prompt_ids.size(), err, prompt_floor, bound_for(prompt_floor));
  EXPECT_LE(err, bound_for(prompt_floor)) << what;
  if (ref_int4) {
    const double err_int4 = rel_l2(lg, ref_int4->forward(std::span(&prompt, 1), true)[0]);
    std::printf("%s: vs INT4-everywhere reference %.5f\n", what.c_str(), err_int4);
    EXPECT_GE(err_int4, kRoutingMargin * err) << what << ": prompt rows did not run the FP8 weights";
  }
  const size_t vocab = lg.size() / prompt_ids.size();
  auto last = [vocab](const std::vector<float>& v) { return std::vector<float>(v.end() - static_cast<std::ptrdiff_t>(vocab), v.end()); };
  std::vector<float> g = last(lg), r = last(lr), f = last(lf);
  const bool literal = kFloorFactor * prompt_floor <= kMaxPromptLogitsRelL2;
  double err_sum = 0, floor_sum = 0, max_err = 0;
  int agree = 0, floor_agree = 0;
  for (int s = 0; s < kGreedySteps; ++s) {
    const int32_t tr = argmax(r);
    agree += argmax(g) == tr;
    floor_agree += argmax(f) == tr;
    if (literal) ASSERT_EQ(argmax(g), tr) << what << ": greedy tokens diverge at step " << s;
    const SequenceChunk next{0, {tr}};
    g = gpu.forward(std::span(&next, 1))[0];
    r = twin.forward(std::span(&next, 1))[0];
    f = floor.forward(std::span(&next, 1))[0];
    const double e = rel_l2(g, r);
    err_sum += e;
    floor_sum += rel_l2(f, r);
    max_err = std::max(max_err, e);
  }
  const double mean_err = err_sum / kGreedySteps, mean_floor = floor_sum / kGreedySteps;
  const double agreement = static_cast<double>(agree) / kGreedySteps;
  const double floor_agreement = static_cast<double>(floor_agree) / kGreedySteps;
  std::printf("%s: %d INT4 decode steps after the FP8 prompt: logits rel L2 mean %.5f (max %.5f), top-1 agreement "
              "%.3f | floor %.5f, agreement %.3f | %s rule\n",
              what.c_str(), kGreedySteps, mean_err, max_err, agreement, mean_floor, floor_agreement,
              literal ? "literal" : "noise-floor");
  EXPECT_LE(mean_err, bound_for(mean_floor)) << what;
  const double p = std::min(0.9, floor_agreement);
  if (!literal) EXPECT_GE(agreement, p - 2.0 * std::sqrt(p * (1.0 - p) / kGreedySteps)) << what;
  EXPECT_EQ(gpu.sequence_length(0), static_cast<int64_t>(prompt_ids.size()) + kGreedySteps);
}

struct Fp8Fixture {
  Model model = fp8_tiny_model(91);
  quant::QuantizedModel dec = quantise(model, kDecodeRecipe);
  quant::QuantizedModel pre = quantise(model, kPrefillRecipe);
};

class CudaEngineFp8Prefill : public ::testing::TestWithParam<formats::KvFormat> {};

// One prompt, then decode steps (the header's rules).
TEST_P(CudaEngineFp8Prefill, PromptLogitsAndGreedyMatchTheTwin) {
  FT_REQUIRE_HOPPER();
  const formats::KvFormat kv = GetParam();
  const Fp8Fixture f;
  CudaEngineOptions co;
  co.kv = kv;
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(f.dec, f.pre, co);
  std::unique_ptr<Engine> ref = reference_twin(f.pre, f.dec, kv);
  std::unique_ptr<Engine> ref_floor = floor_twin(f.pre, f.dec, kv);
  ReferenceOptions int4_only;
  int4_only.activations = ActivationFormat::Bf16;
  int4_only.kv = kv;
  std::unique_ptr<Engine> ref_int4 = make_reference_engine(f.dec.model, int4_only);
  EXPECT_NE(gpu->description().find("FP8 prefill"), std::string::npos) << gpu->description();
  std::mt19937 rng(5);
  expect_fp8_prefill_matches(*gpu, *ref, *ref_floor, ref_int4.get(),
                             test::random_token_ids(61, f.model.config.vocab_size, rng),
                             std::string("tiny ") + formats::kv_format_name(kv));
}

INSTANTIATE_TEST_SUITE_P(Kv, CudaEngineFp8Prefill,
                         ::testing::Values(formats::KvFormat::BF16, formats::KvFormat::INT4,
                                           formats::KvFormat::INT4_HADAMARD),
                         test::kv_param_name);

// SmolLM2-135M (hidden 576, intermediate 1536: K tails of the FP8 GEMM) with every tensor rounded to BF16: an FP8
// prompt of ~60 tokens, then INT4 (RTN g64) decode steps, for each cache format the GPU reads.
// The SmolLM2 tests' prompt (BOS when the tokenizer adds one), about 45 tokens.
std::vector<int32_t> smollm2_prompt(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  for (int32_t t : tok.encode("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, "
                              "France. It is named after the engineer Gustave Eiffel, whose company designed and "
                              "built the tower. The capital of France is", true))
    ids.push_back(t);
  return ids;
}

class SmolLM2Fp8Prefill : public ::testing::TestWithParam<formats::KvFormat> {};

TEST_P(SmolLM2Fp8Prefill, PromptLogitsAndStepsWithinTheTwinsFloor) {
  FT_REQUIRE_HOPPER();
  const std::string path = test::smollm2_gguf_path();
  FT_REQUIRE_FILE(path);
  const Model model = test::bf16_model(load_model(path));
  const std::unique_ptr<Tokenizer> tok = load_tokenizer_for_model(model, "");
  const quant::QuantizedModel dec = quantise(model, kDecodeRecipe), pre = quantise(model, kPrefillRecipe);
  const formats::KvFormat kv = GetParam();
  CudaEngineOptions co;
  co.kv = kv;
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(dec, pre, co);
  std::unique_ptr<Engine> twin = reference_twin(pre, dec, kv), floor = floor_twin(pre, dec, kv);
  const std::vector<int32_t> ids = smollm2_prompt(*tok);
  expect_fp8_prefill_matches(*gpu, *twin, *floor, nullptr, ids, std::string("SmolLM2 ") + formats::kv_format_name(kv));
}

// The same with CudaEngineOptions::fp8_block_swiglu (intermediate 1536: twelve FP8 blocks per row) against the
// act-fp8-block-bf16 twin, on the cache the decode path favours.
TEST(SmolLM2Fp8BlockSwiglu, PromptLogitsAndStepsWithinTheBlockTwinsFloor) {
  FT_REQUIRE_HOPPER();
  const std::string path = test::smollm2_gguf_path();
  FT_REQUIRE_FILE(path);
  const Model model = test::bf16_model(load_model(path));
  const std::unique_ptr<Tokenizer> tok = load_tokenizer_for_model(model, "");
  const quant::QuantizedModel dec = quantise(model, kDecodeRecipe), pre = quantise(model, kPrefillRecipe);
  const formats::KvFormat kv = formats::KvFormat::INT4_HADAMARD;
  CudaEngineOptions co;
  co.kv = kv;
  co.fp8_block_swiglu = true;
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(dec, pre, co);
  std::unique_ptr<Engine> twin = reference_twin(pre, dec, kv, true), floor = floor_twin(pre, dec, kv);
  const std::vector<int32_t> ids = smollm2_prompt(*tok);
  expect_fp8_prefill_matches(*gpu, *twin, *floor, nullptr, ids, "SmolLM2, FP8 down input per 128 channels");
}

INSTANTIATE_TEST_SUITE_P(Kv, SmolLM2Fp8Prefill,
                         ::testing::Values(formats::KvFormat::BF16, formats::KvFormat::INT4,
                                           formats::KvFormat::INT4_HADAMARD),
                         test::kv_param_name);

// Batches that mix prompt chunks, decode steps and one-token prompts (routed to the decode path, as the reference
// does), with a max_batch_tokens that splits prompts into several FP8 passes; every chunk's logits compared (pooled, see the header).
TEST(CudaEngineFp8, MixedBatchesMatchTheTwin) {
  FT_REQUIRE_HOPPER();
  const Fp8Fixture f;
  CudaEngineOptions co;
  co.kv = formats::KvFormat::BF16;
  co.max_batch_tokens = 24;
  co.max_sequences = 8;
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(f.dec, f.pre, co);
  std::unique_ptr<Engine> ref = reference_twin(f.pre, f.dec, formats::KvFormat::BF16);
  std::unique_ptr<Engine> ref_floor = floor_twin(f.pre, f.dec, formats::KvFormat::BF16);
  std::mt19937 rng(17);
  const int64_t vocab = f.model.config.vocab_size;
  auto toks = [&](size_t n) { return test::random_token_ids(n, vocab, rng); };
  const std::vector<std::vector<SequenceChunk>> script = {
      {{1, toks(40)}, {2, toks(7)}},               // two prompts: passes 24 + 23 rows, all FP8
      {{1, toks(1)}, {3, toks(30)}, {2, toks(1)}}, // step, prompt, step: three passes (decode, FP8, decode)
      {{4, toks(1)}, {3, toks(5)}},                // a one-token prompt (decode path) + a continuation chunk (FP8)
      {{1, toks(1)}, {2, toks(1)}, {3, toks(1)}, {4, toks(1)}},  // a pure decode step (CUDA graph)
      {{1, toks(1)}, {2, toks(1)}, {3, toks(1)}, {4, toks(1)}},
  };
  int n = 0, chunks = 0;
  double err_sum = 0, floor_sum = 0;
  for (const std::vector<SequenceChunk>& batch : script) {
    const std::vector<std::vector<float>> lg = gpu->forward(batch, true);
    const std::vector<std::vector<float>> lr = ref->forward(batch, true);
    const std::vector<std::vector<float>> lf = ref_floor->forward(batch, true);
    ASSERT_EQ(lg.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      ASSERT_EQ(lg[i].size(), lr[i].size());
      const double err = rel_l2(lg[i], lr[i]), floor = rel_l2(lf[i], lr[i]);
      std::printf("batch %d sequence %d (%zu tokens): rel L2 %.5f, floor %.5f\n", n, batch[i].seq_id,
                  batch[i].tokens.size(), err, floor);
      err_sum += err;
      floor_sum += floor;
      ++chunks;
      EXPECT_EQ(gpu->sequence_length(batch[i].seq_id), ref->sequence_length(batch[i].seq_id));
    }
    ++n;
  }
  const double mean_err = err_sum / chunks, mean_floor = floor_sum / chunks;
  std::printf("%d chunks: mean rel L2 %.5f, mean floor %.5f, bound %.5f\n", chunks, mean_err, mean_floor,
              bound_for(mean_floor));
  EXPECT_LE(mean_err, bound_for(mean_floor));
}

// Both weight copies are counted: the FP8 engine holds exactly the INT4 engine's bytes plus, per layer and group,
// N·K code bytes and 4·N scale bytes, and more activation scratch (codes + scales of max_batch_tokens rows).
TEST(CudaEngineFp8, MemoryCountsBothCopies) {
  FT_REQUIRE_HOPPER();
  const Fp8Fixture f;
  CudaEngineOptions co;
  co.kv = formats::KvFormat::BF16;
  const CudaEngineMemory with = make_cuda_engine(f.dec, f.pre, co)->memory();
  const CudaEngineMemory without = make_cuda_engine(f.dec, co)->memory();
  const ModelConfig& c = f.model.config;
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  const int64_t qw = c.num_attention_heads * c.head_dim;
  const int64_t per_layer = (qkv * h + 4 * qkv) + (h * qw + 4 * h) + (2 * inter * h + 8 * inter) + (h * inter + 4 * h);
  EXPECT_EQ(with.weights - without.weights, c.num_hidden_layers * per_layer);
  EXPECT_EQ(with.kv_cache, without.kv_cache);
  EXPECT_EQ(with.activations - without.activations,
            co.max_batch_tokens * std::max({h, qw, inter}) + 4 * co.max_batch_tokens);
}

// CudaEngineOptions::fp8_block_swiglu: the down projection's input per token per 128 channels, from the gate|up
// GEMM's SwiGLU epilogue (fused_epilogues) or from swiglu_fp8_block. The two orders give the same logits bit for bit;
// both are judged against the act-fp8-block-bf16 twin by the header's rules; and the block recipe really is another
// computation than the per-token one (the down input's scales differ, so the prompt logits move).
class CudaEngineFp8BlockSwiglu : public ::testing::TestWithParam<formats::KvFormat> {};

TEST_P(CudaEngineFp8BlockSwiglu, FusedEqualsUnfusedAndMatchesTheBlockTwin) {
  FT_REQUIRE_HOPPER();
  const formats::KvFormat kv = GetParam();
  const Fp8Fixture f;
  CudaEngineOptions co;
  co.kv = kv;
  co.fp8_block_swiglu = true;
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(f.dec, f.pre, co);
  EXPECT_NE(fused->description().find("SwiGLU to FP8 per 128 channels in the gate|up GEMM"), std::string::npos)
      << fused->description();
  CudaEngineOptions uo = co;
  uo.fused_epilogues = false;
  std::unique_ptr<CudaEngine> unfused = make_cuda_engine(f.dec, f.pre, uo);
  CudaEngineOptions po;
  po.kv = kv;
  std::unique_ptr<CudaEngine> per_token = make_cuda_engine(f.dec, f.pre, po);
  std::mt19937 rng(8);
  const SequenceChunk prompt{0, test::random_token_ids(75, f.model.config.vocab_size, rng)};
  const std::vector<float> lf = fused->forward(std::span(&prompt, 1), true)[0];
  const std::vector<float> lu = unfused->forward(std::span(&prompt, 1), true)[0];
  const std::vector<float> lp = per_token->forward(std::span(&prompt, 1), true)[0];
  expect_same_logit_bits(lf, lu, "", "fused", "unfused");
  if (HasFatalFailure()) return;
  EXPECT_GT(rel_l2(lf, lp), 0.0) << "the block recipe must change the down projection's input";
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(f.dec, f.pre, co);
  std::unique_ptr<Engine> twin = reference_twin(f.pre, f.dec, kv, true), floor = floor_twin(f.pre, f.dec, kv);
  expect_fp8_prefill_matches(*gpu, *twin, *floor, nullptr, test::random_token_ids(61, f.model.config.vocab_size, rng),
                             std::string("tiny, FP8 down input per 128 channels, ") + formats::kv_format_name(kv));
}

INSTANTIATE_TEST_SUITE_P(Kv, CudaEngineFp8BlockSwiglu,
                         ::testing::Values(formats::KvFormat::BF16, formats::KvFormat::INT4_HADAMARD),
                         test::kv_param_name);

// CudaEngineOptions::fused_unrotate_fp8: the int4-hadamard attention output is un-rotated and quantised for the o GEMM
// by one kernel (unrotate_rows_fp8). Same codes and scales as rotate_heads_bf16 + quantize_rows_fp8, so the same
// logits bit for bit, prompt and a continuation chunk; the profile shows the fused op once per layer and pass, and
// no separate un-rotation.
TEST(CudaEngineFp8, UnrotateIntoFp8EqualsTheSeparateKernels) {
  FT_REQUIRE_HOPPER();
  const Fp8Fixture f;
  CudaEngineOptions co;
  co.kv = formats::KvFormat::INT4_HADAMARD;
  co.fused_epilogues = true;
  co.fused_prefill_unrotation = false;  // the attention kernel leaves its output rotated
  co.fused_unrotate_fp8 = true;
  co.profile_ops = true;
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(f.dec, f.pre, co);
  CudaEngineOptions uo = co;
  uo.fused_unrotate_fp8 = false;
  uo.profile_ops = false;
  std::unique_ptr<CudaEngine> plain = make_cuda_engine(f.dec, f.pre, uo);
  std::mt19937 rng(12);
  for (int64_t n : {75, 40}) {  // a prompt, then a chunk continuing the same sequence
    const SequenceChunk chunk{0, test::random_token_ids(n, f.model.config.vocab_size, rng)};
    const std::vector<float> lf = fused->forward(std::span(&chunk, 1), true)[0];
    const std::vector<float> lp = plain->forward(std::span(&chunk, 1), true)[0];
    expect_same_logit_bits(lf, lp, "chunk of " + std::to_string(n) + " tokens, ", "fused", "separate");
    if (HasFatalFailure()) return;
  }
  int64_t fused_calls = 0, separate_calls = 0;
  for (const CudaEngine::OpTime& t : fused->op_profile()) {
    if (t.op == "attention output un-rotation + FP8") fused_calls += t.calls;
    if (t.op == "attention output un-rotation") separate_calls += t.calls;
  }
  EXPECT_EQ(fused_calls, 2 * f.model.config.num_hidden_layers) << "two FP8 passes over every layer";
  EXPECT_EQ(separate_calls, 0);
}

// A prefill model quantised with the recipe act-fp8-block-bf16 turns the option on by itself (what the CLI's
// --configs fp8+act-fp8-block-bf16 runs), and gives the option's logits bit for bit.
TEST(CudaEngineFp8, BlockRecipeTurnsTheOptionOn) {
  FT_REQUIRE_HOPPER();
  const Fp8Fixture f;
  const quant::QuantizedModel pre_block = quantise(f.model, "fp8+act-fp8-block-bf16");
  CudaEngineOptions co;
  co.kv = formats::KvFormat::INT4;
  std::unique_ptr<CudaEngine> by_recipe = make_cuda_engine(f.dec, pre_block, co);
  EXPECT_NE(by_recipe->description().find("SwiGLU to FP8 per 128 channels"), std::string::npos)
      << by_recipe->description();
  CudaEngineOptions bo = co;
  bo.fp8_block_swiglu = true;
  std::unique_ptr<CudaEngine> by_option = make_cuda_engine(f.dec, f.pre, bo);
  std::mt19937 rng(4);
  const SequenceChunk prompt{0, test::random_token_ids(40, f.model.config.vocab_size, rng)};
  const std::vector<float> a = by_recipe->forward(std::span(&prompt, 1), true)[0];
  const std::vector<float> b = by_option->forward(std::span(&prompt, 1), true)[0];
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(CudaEngineFp8, BlockSwigluRefusesAnIntermediateSizeNotAMultipleOf128) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s;
  s.hidden = 256;
  s.inter = 320;  // the FP8 GEMMs take it (multiples of 16), one FP8 block per 128 channels does not
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 300;
  const Model m = test::bf16_model(test::make_tiny_llama(s, 12));
  CudaEngineOptions co;
  co.fp8_block_swiglu = true;
  try {
    make_cuda_engine(quantise(m, kDecodeRecipe), quantise(m, kPrefillRecipe), co);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_block_swiglu"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("320"), std::string::npos) << e.what();
  }
}

// A synthetic engine with random FP8 prefill weights (the bench's): prompts run, outputs are finite.
TEST(CudaEngineFp8, SyntheticFp8PrefillRuns) {
  FT_REQUIRE_HOPPER();
  ModelConfig c = fp8_tiny_model(3).config;
  CudaEngineOptions co;
  co.synthetic_fp8_prefill = true;
  co.kv = formats::KvFormat::INT4;
  std::unique_ptr<CudaEngine> e = make_synthetic_cuda_engine(c, 64, co);
  EXPECT_NE(e->description().find("FP8 prefill"), std::string::npos) << e->description();
  std::mt19937 rng(2);
  const SequenceChunk prompt{0, test::random_token_ids(100, c.vocab_size, rng)};
  const std::vector<float> lg = e->forward(std::span(&prompt, 1))[0];
  ASSERT_EQ(lg.size(), static_cast<size_t>(c.vocab_size));
  for (float v : lg) ASSERT_TRUE(std::isfinite(v));
}

// A two-layer tiny Llama with head_dim 128 (a 128-column FP8 GEMM tile per head), 2 query heads over 1 KV head.
Model head_dim_128_model(uint32_t seed) {
  test::TinyLlama s;
  s.hidden = 256;
  s.inter = 512;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 128;
  s.layers = 2;
  s.vocab = 500;
  return test::bf16_model(test::make_tiny_llama(s, seed));
}

// A prompt of 150 tokens (two 128-row tiles), a 70-token chunk continuing it, then `steps` greedy steps, on two
// engines with the same weights: the chunks' logits bit for bit, the steps' tokens equal (the steps read the cache
// the chunks wrote). Both engines must profile, so neither decodes through CUDA graphs (see
// QkvEpilogueEqualsTheSeparateKernels).
void expect_same_chunks_and_steps(CudaEngine& fused, CudaEngine& plain, int64_t vocab, uint32_t seed, int steps) {
  std::mt19937 rng(seed);
  for (int64_t n : {150, 70}) {
    const SequenceChunk chunk{0, test::random_token_ids(static_cast<size_t>(n), vocab, rng)};
    const std::vector<float> lf = fused.forward(std::span(&chunk, 1), true)[0];
    const std::vector<float> lp = plain.forward(std::span(&chunk, 1), true)[0];
    expect_same_logit_bits(lf, lp, "chunk of " + std::to_string(n) + " tokens, ", "fused", "separate");
    if (testing::Test::HasFatalFailure()) return;
  }
  int32_t token = 1;
  for (int step = 0; step < steps; ++step) {
    const SequenceChunk next{0, {token}};
    const std::vector<int32_t> tf = fused.forward_greedy(std::span(&next, 1));
    const std::vector<int32_t> tp = plain.forward_greedy(std::span(&next, 1));
    ASSERT_EQ(tf, tp) << "decode step " << step;
    token = tf[0];
  }
}

// CudaEngineOptions::fused_fp8_qkv: the qkv GEMM's epilogue runs RoPE, the q rotation and the INT4 cache placement
// (gemm_fp8_qkv) — bit for bit the GEMM + rope_qk_bf16 + kv_append_rotate_q, so the logits equal the separate
// kernels' bit for bit: a prompt (new sequences: keys via BF16, anchors, keys-only append) and a continuation chunk
// (keys straight into the cache), for both INT4 caches, on a model with head_dim 128 (a tile per head). The profile
// shows the fused ops once per layer and pass.
TEST(CudaEngineFp8, QkvEpilogueEqualsTheSeparateKernels) {
  FT_REQUIRE_HOPPER();
  const Model model = head_dim_128_model(41);
  const quant::QuantizedModel dec = quantise(model, kDecodeRecipe), pre = quantise(model, kPrefillRecipe);
  for (formats::KvFormat kv : {formats::KvFormat::INT4_HADAMARD, formats::KvFormat::INT4}) {
    SCOPED_TRACE(formats::kv_format_name(kv));
    CudaEngineOptions co;
    co.kv = kv;
    co.fused_fp8_qkv = true;
    co.profile_ops = true;
    std::unique_ptr<CudaEngine> fused = make_cuda_engine(dec, pre, co);
    EXPECT_NE(fused->description().find("qkv GEMM's epilogue"), std::string::npos) << fused->description();
    // Both engines profile, so both decode without CUDA graphs: a graph plans the attention split over the
    // context's power-of-two bucket, a plain launch over the real length, and a different split order is different
    // bits (the 256-token bucket splits in 2 under the occupancy rule, the 221..228-token contexts here do not).
    CudaEngineOptions uo = co;
    uo.fused_fp8_qkv = false;
    std::unique_ptr<CudaEngine> plain = make_cuda_engine(dec, pre, uo);
    EXPECT_EQ(plain->description().find("qkv GEMM's epilogue"), std::string::npos) << plain->description();
    // Greedy steps after the prompt read the cache the epilogue wrote.
    expect_same_chunks_and_steps(*fused, *plain, model.config.vocab_size, 14, 8);
    if (HasFatalFailure()) return;
    int64_t with_keys = 0, keys_later = 0, k_appends = 0, rope = 0;
    for (const CudaEngine::OpTime& t : fused->op_profile()) {
      if (t.op == "qkv GEMM (FP8) + RoPE + KV append + q rotation") with_keys += t.calls;
      if (t.op == "qkv GEMM (FP8) + RoPE + V append + q rotation") keys_later += t.calls;
      if (t.op == "K append") k_appends += t.calls;
      if (t.op == "RoPE") rope += t.calls;
    }
    const int64_t layers = model.config.num_hidden_layers;
    const bool hadamard = kv == formats::KvFormat::INT4_HADAMARD;
    // The prompt starts a sequence: with int4-hadamard its keys wait for the anchors; the continuation does not.
    EXPECT_EQ(keys_later, hadamard ? layers : 0);
    EXPECT_EQ(k_appends, hadamard ? layers : 0);
    EXPECT_EQ(with_keys, hadamard ? layers : 2 * layers);
    EXPECT_EQ(rope, 0);
  }
}

// CudaEngineOptions::fused_fp8_rope: where RoPE runs as its own kernel (a prompt that starts an int4-hadamard
// sequence: its keys wait for the anchors), the FP8 qkv GEMM applies it in its epilogue (gemm_fp8_rope) — bit for
// bit the GEMM + rope_qk_bf16, so the logits and the greedy steps equal the separate kernels'. The profile shows
// "qkv GEMM (FP8) + RoPE" once per layer (the prompt; the continuation takes the one-kernel prologue) and no "RoPE".
TEST(CudaEngineFp8, RopeInTheQkvGemmEqualsTheSeparateKernel) {
  FT_REQUIRE_HOPPER();
  const Model model = head_dim_128_model(43);
  const quant::QuantizedModel dec = quantise(model, kDecodeRecipe), pre = quantise(model, kPrefillRecipe);
  for (const bool fused_epilogues : {true, false}) {
    SCOPED_TRACE(fused_epilogues ? "fused epilogues" : "unfused epilogues");
    CudaEngineOptions co;
    co.kv = formats::KvFormat::INT4_HADAMARD;
    co.fused_epilogues = fused_epilogues;
    co.fused_fp8_rope = true;
    co.profile_ops = true;  // both engines without CUDA graphs (see QkvEpilogueEqualsTheSeparateKernels)
    std::unique_ptr<CudaEngine> fused = make_cuda_engine(dec, pre, co);
    EXPECT_NE(fused->description().find("RoPE in the qkv GEMM's epilogue"), std::string::npos) << fused->description();
    CudaEngineOptions uo = co;
    uo.fused_fp8_rope = false;
    std::unique_ptr<CudaEngine> plain = make_cuda_engine(dec, pre, uo);
    expect_same_chunks_and_steps(*fused, *plain, model.config.vocab_size, 15, 4);
    if (HasFatalFailure()) return;
    int64_t fused_rope = 0, rope = 0;
    for (const CudaEngine::OpTime& t : fused->op_profile()) {
      if (t.op == "qkv GEMM (FP8) + RoPE") fused_rope += t.calls;
      if (t.op == "RoPE") rope += t.calls;
    }
    EXPECT_EQ(fused_rope, model.config.num_hidden_layers);
    EXPECT_EQ(rope, 0);
  }
}

// No device needed from here on: the refusals come before any GPU work.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(CudaEngineFp8Host, ShapesTheFp8GemmCannotRunAreRefusedByName) {
  // Hidden 72: q|k|v's K = 72 is not a multiple of 16 (TMA's 16-byte row stride).
  test::TinyLlama s1;
  s1.hidden = 72;
  s1.heads = 2;
  s1.kv_heads = 1;
  s1.head_dim = 64;
  const Model m = test::make_tiny_llama(s1, 4);
  const quant::QuantizedModel dec = quantise(m, "full");
  const quant::QuantizedModel pre = quantise(m, kPrefillRecipe);
  expect_error([&] { make_cuda_engine(dec, pre); }, {"FP8 prefill", "q_proj", "K = 72", "multiple of 16"});
  // Only the down projection fails: intermediate 200 (K of down_proj) while hidden and heads qualify.
  test::TinyLlama s;
  s.hidden = 128;
  s.inter = 200;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 64;
  const Model m2 = test::make_tiny_llama(s, 5);
  expect_error([&] { make_cuda_engine(quantise(m2, "full"), quantise(m2, kPrefillRecipe)); },
               {"mlp.down_proj", "K = 200"});
  ModelConfig c = m2.config;
  CudaEngineOptions co;
  co.synthetic_fp8_prefill = true;
  expect_error([&] { make_synthetic_cuda_engine(c, 32, co); }, {"mlp.down_proj"});
}

TEST(CudaEngineFp8Host, RecipesAreChecked) {
  const Model m = fp8_tiny_model(6);
  const quant::QuantizedModel int4 = quantise(m, kDecodeRecipe);
  const quant::QuantizedModel fp8 = quantise(m, kPrefillRecipe);
  expect_error([&] { make_cuda_engine(int4, int4); }, {"no FP8 weights", "int4-rtn-g64"});
  expect_error([&] { make_cuda_engine(fp8, fp8); }, {"decode model", "FP8 weights"});
  expect_error([&] { make_cuda_engine(fp8); }, {"FP8 prefill path"});
  expect_error([&] { make_cuda_engine(int4, quantise(m, "fp8+act-fp8+kv-int4")); }, {"KV-cache formats"});
  test::TinyLlama s;
  s.hidden = 256;
  s.inter = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.layers = 3;  // a different model
  s.vocab = 500;
  expect_error([&] { make_cuda_engine(int4, quantise(test::make_tiny_llama(s, 6), kPrefillRecipe)); },
               {"different configs"});
}

}  // namespace
