// head-int4 in the CUDA engine: the LM head's own INT4 copy (RTN, symmetric, BF16 scales) runs the W4A16 GEMM, which
// writes BF16 logits that widen_rows_bf16_to_f32 turns into the fp32 logits the argmax, sampler and host read. The
// twin is the reference engine with the recipe's options and act-bf16 (the GPU's roundings, including BF16 logits
// from the INT4 head). Models: random tiny Llamas (vocab 61: the head's rows are padded to the GEMM's 32; tied and
// untied), stories260K (hidden 64: group 64; BF16 projections beside the INT4 head), and the FP8-prefill tiny model
// (vocab 500, hidden 256: group 128) with FP8 prompt passes. Bounds as the other engine tests: greedy tokens equal
// for 64 steps, logits rel L2 <= 1e-2 (two layers of fp32 sums in another order; the head's own GEMM differs from
// the reference's dot products only in summation order, then both round to BF16).
// The widening kernel is checked bit for bit (every BF16 value is an fp32 value) and its refusals need no device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/engine/engine_kernels.h"
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

constexpr double kMaxLogitsRelL2 = 1e-2;
constexpr int kGreedySteps = 64;
// Two BF16 steps (2^-8 relative each): the GPU's logit and the reference's may each sit one rounding away.
constexpr double kBf16TieRel = 0x1p-7;
// With FP8 prefill, test_cuda_engine_fp8.cpp's bound: an occasional FP8 code flipped by a differently rounded BF16
// input (one E4M3 step is 2^-3 relative) moves the prompt's cache and logits more than reassociation alone.
constexpr double kFp8MaxLogitsRelL2 = 2e-2;
// FP8 prompts are judged against the twin's measured noise floor: sqrt(2) (two independent perturbations of the
// floor's size) · 1.1 margin, as in test_cuda_engine_fp8.cpp.
constexpr double kFp8FloorFactor = 1.41421356 * 1.1;

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

using test::bf16_model;

// The reference running `q` with the GPU's activation rounding and cache (the head format comes from the recipe).
std::unique_ptr<Engine> reference_like_gpu(const quant::QuantizedModel& q) {
  PrecisionRecipe r = q.recipe;
  r.activations = ActivationFormat::Bf16;
  if (!r.kv) r.kv = formats::KvFormat::BF16;
  return make_reference_engine(q.model, quant::reference_options(r));
}

bool all_bf16_values(const std::vector<float>& v) {
  for (float x : v)
    if (bf16_to_f32(f32_to_bf16(x)) != x) return false;
  return true;
}

// A prompt, then greedy steps, each engine fed its own choice: tokens equal, logits within max_rel_l2.
void expect_same_greedy(Engine& gpu, Engine& ref, const std::vector<int32_t>& prompt, int steps, int32_t seq = 0,
                        double max_rel_l2 = kMaxLogitsRelL2) {
  const SequenceChunk first{seq, prompt};
  std::vector<float> lg = gpu.forward(std::span(&first, 1))[0];
  std::vector<float> lr = ref.forward(std::span(&first, 1))[0];
  ASSERT_EQ(lg.size(), lr.size());
  EXPECT_TRUE(all_bf16_values(lg)) << "the INT4 head's logits are BF16 values widened to fp32";
  double max_err = rel_l2(lg, lr);
  for (int s = 0; s < steps; ++s) {
    const int32_t tg = argmax(lg), tr = argmax(lr);
    ASSERT_EQ(tg, tr) << "greedy tokens diverge at step " << s << " (logits rel L2 there " << rel_l2(lg, lr) << ")";
    const SequenceChunk next{seq, {tg}};
    lg = gpu.forward(std::span(&next, 1))[0];
    lr = ref.forward(std::span(&next, 1))[0];
    max_err = std::max(max_err, rel_l2(lg, lr));
  }
  std::printf("INT4 head: %zu-token prompt + %d greedy steps: max logits rel L2 vs reference %.5f\n", prompt.size(),
              steps, max_err);
  EXPECT_LE(max_err, max_rel_l2);
  EXPECT_EQ(gpu.sequence_length(seq), static_cast<int64_t>(prompt.size()) + steps);
}

// --- widen_rows_bf16_to_f32 ---

TEST(WidenRowsBf16ToF32Host, RefusesBadArgumentsBeforeAnyLaunch) {
  auto* src = reinterpret_cast<const __nv_bfloat16*>(uintptr_t{256});
  auto* dst = reinterpret_cast<float*>(uintptr_t{512});
  EXPECT_EQ(cuda::widen_rows_bf16_to_f32(nullptr, 64, dst, 1, 61, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::widen_rows_bf16_to_f32(src, 64, nullptr, 1, 61, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::widen_rows_bf16_to_f32(src, 60, dst, 1, 61, nullptr), cudaErrorInvalidValue);  // stride < cols
  EXPECT_EQ(cuda::widen_rows_bf16_to_f32(src, 64, dst, -1, 61, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::widen_rows_bf16_to_f32(src, 64, dst, 65536, 61, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::widen_rows_bf16_to_f32(src, 64, dst, 1, 0, nullptr), cudaErrorInvalidValue);
}

TEST(WidenRowsBf16ToF32, BitExactOverStridedRows) {
  FT_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(17);
  // Awkward shapes: one row, a vocabulary that is not a tile multiple, one wider than the 128-block grid covers.
  const struct {
    int rows, cols, stride;
  } cases[] = {{1, 61, 64}, {5, 61, 64}, {17, 500, 512}, {3, 128256, 128256}, {2, 40000, 40032}};
  for (const auto& c : cases) {
    // Random BF16 bit patterns of every exponent (NaN / inf excluded: 0x7F80 exponent), both signs, subnormals.
    std::vector<uint16_t> src(static_cast<size_t>(c.rows) * c.stride);
    for (uint16_t& b : src) {
      do b = static_cast<uint16_t>(rng()); while ((b & 0x7F80) == 0x7F80);
    }
    const size_t n = static_cast<size_t>(c.rows) * c.cols, guard = 33;
    test::DeviceBuffer<uint16_t> d_src(src);
    test::DeviceBuffer<float> d_dst(n + guard);
    ASSERT_EQ(d_dst.poison(), cudaSuccess);
    ASSERT_EQ(cuda::widen_rows_bf16_to_f32(reinterpret_cast<const __nv_bfloat16*>(d_src.p), c.stride, d_dst.p, c.rows,
                                           c.cols, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = d_dst.download();
    int bad = 0;
    for (int r = 0; r < c.rows; ++r) {
      for (int k = 0; k < c.cols; ++k) {
        const float want = bf16_to_f32(src[static_cast<size_t>(r) * c.stride + k]);
        const float g = got[static_cast<size_t>(r) * c.cols + k];
        bad += std::memcmp(&want, &g, sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(bad, 0) << c.rows << " x " << c.cols << " stride " << c.stride;
    for (size_t i = n; i < n + guard; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &got[i], 4);
      ASSERT_EQ(bits, 0xFFFFFFFFu) << "wrote past the last row at " << i;
    }
  }
  EXPECT_EQ(cuda::widen_rows_bf16_to_f32(reinterpret_cast<const __nv_bfloat16*>(uintptr_t{256}), 64,
                                         reinterpret_cast<float*>(uintptr_t{512}), 0, 61, nullptr),
            cudaSuccess);  // no rows: nothing launched
}

// --- the engine ---

class CudaEngineInt4Head : public ::testing::TestWithParam<bool> {};

// Tiny Llama (vocab 61 → 64 padded rows): INT4 projections + INT4 head, tied or not.
TEST_P(CudaEngineInt4Head, TinyLlamaMatchesReference) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s;
  s.tied = GetParam();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 23)), "int4-rtn-g32+head-int4");
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  co.max_sequences = 4;
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(q, co);
  EXPECT_NE(gpu->description().find("LM head W4A16 INT4 g64"), std::string::npos) << gpu->description();
  std::unique_ptr<Engine> ref = reference_like_gpu(q);
  std::mt19937 rng(3);
  expect_same_greedy(*gpu, *ref, test::random_token_ids(12, s.vocab, rng), kGreedySteps);

  // All positions of a 40-token prompt: 40 head rows, more than the 16 rows one head GEMM takes (gathered passes).
  const SequenceChunk long_prompt{1, test::random_token_ids(40, s.vocab, rng)};
  const std::vector<float> lg = gpu->forward(std::span(&long_prompt, 1), true)[0];
  const std::vector<float> lr = ref->forward(std::span(&long_prompt, 1), true)[0];
  ASSERT_EQ(lg.size(), lr.size());
  EXPECT_LE(rel_l2(lg, lr), kMaxLogitsRelL2);
  EXPECT_TRUE(all_bf16_values(lg));

  // forward_greedy (argmax on the GPU, after a decode-step graph is captured on the second step) picks the reference's
  // argmax, up to BF16 ties: the INT4 head's logits are BF16, so two logits within one BF16 step (2^-8 relative) of
  // the top may swap places; the GPU's pick must score within kBf16TieRel of the reference's best.
  for (int step = 0; step < 3; ++step) {
    const SequenceChunk next{1, {static_cast<int32_t>(step + 5)}};
    const std::vector<int32_t> ids = gpu->forward_greedy(std::span(&next, 1));
    const std::vector<float> r = ref->forward(std::span(&next, 1))[0];
    ASSERT_EQ(ids.size(), 1u);
    ASSERT_GE(ids[0], 0);
    ASSERT_LT(ids[0], static_cast<int32_t>(r.size()));
    const float best = r[static_cast<size_t>(argmax(r))];
    EXPECT_GE(r[static_cast<size_t>(ids[0])], best - kBf16TieRel * std::fabs(best))
        << "step " << step << ": GPU picked " << ids[0] << ", reference " << argmax(r);
  }
}

// memory() counts the INT4 head instead of the BF16 one (a tied BF16 head borrows the embedding: 0 bytes).
TEST_P(CudaEngineInt4Head, MemoryCountsTheInt4Head) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s;
  s.tied = GetParam();
  const Model m = bf16_model(test::make_tiny_llama(s, 29));
  CudaEngineOptions co;
  co.kv = formats::KvFormat::BF16;
  const CudaEngineMemory with = make_cuda_engine(quantise(m, "int4-rtn-g32+head-int4"), co)->memory();
  const CudaEngineMemory without = make_cuda_engine(quantise(m, "int4-rtn-g32"), co)->memory();
  const int64_t rows = 64, h = 64, group = 64;  // vocab 61 padded to the GEMM's 32
  const int64_t int4_head = rows * h / 2 + rows * (h / group) * 2, bf16_head = s.tied ? 0 : 61 * h * 2;
  EXPECT_EQ(with.weights - without.weights, int4_head - bf16_head);
  EXPECT_EQ(with.activations - without.activations, 2 * 32 /* logit rows: max(max_sequences, 16) */ * rows);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, CudaEngineInt4Head, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

// stories260K: BF16 projections (its intermediate size 172 takes no W4A16 group) and an INT4 head of group 64.
TEST(CudaEngineInt4HeadModels, Stories260KMatchesReference) {
  FT_REQUIRE_HOPPER();
  const std::string dir = test::shared_path("models/stories260K/");
  FT_REQUIRE_FILE(dir + "stories260K.bin");
  const Model model = bf16_model(load_model(dir + "stories260K.bin"));
  const std::unique_ptr<Tokenizer> tok = load_tokenizer_for_model(model, dir + "tok512.bin");
  const quant::QuantizedModel q = quantise(model, "full+head-int4");
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(q, cuda_engine_options(q.recipe));
  EXPECT_NE(gpu->description().find("LM head W4A16 INT4 g64"), std::string::npos) << gpu->description();
  std::unique_ptr<Engine> ref = reference_like_gpu(q);
  std::vector<int32_t> prompt;
  if (tok->add_bos() && tok->bos_id() >= 0) prompt.push_back(tok->bos_id());
  for (int32_t id : tok->encode("Once upon a time", true)) prompt.push_back(id);
  expect_same_greedy(*gpu, *ref, prompt, kGreedySteps);
}

// FP8 prefill + INT4 decode + INT4 head (vocab 500 → 512 rows, group 128): prompt logits come from the INT4 head
// after FP8 passes; the twin is the prefill/decode reference with head-int4 on both sides.
TEST(CudaEngineInt4HeadModels, Fp8PrefillWithInt4HeadMatchesTheTwin) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s;
  s.hidden = 256;
  s.inter = 512;
  s.head_dim = 64;
  s.vocab = 500;
  const Model m = bf16_model(test::make_tiny_llama(s, 31));
  const quant::QuantizedModel dec = quantise(m, "int4-rtn-g64+head-int4");
  const quant::QuantizedModel pre = quantise(m, "fp8+head-int4+act-fp8");
  CudaEngineOptions co;
  co.kv = formats::KvFormat::BF16;
  std::unique_ptr<CudaEngine> gpu = make_cuda_engine(dec, pre, co);
  EXPECT_NE(gpu->description().find("LM head W4A16 INT4 g128"), std::string::npos) << gpu->description();
  ReferenceOptions p = quant::reference_options(pre.recipe), d = quant::reference_options(dec.recipe);
  p.activations = ActivationFormat::Fp8OverBf16;
  d.activations = ActivationFormat::Bf16;
  p.kv = d.kv = formats::KvFormat::BF16;
  std::unique_ptr<Engine> ref = make_prefill_decode_reference_engine(pre.model, p, dec.model, d);
  // The twin's noise floor (tests/gpu/test_cuda_engine_fp8.cpp explains it): the same recipes with fp32 exchanges.
  ReferenceOptions pf = p, df = d;
  pf.activations = ActivationFormat::Fp8PerToken;
  df.activations = ActivationFormat::Fp32;
  std::unique_ptr<Engine> floor = make_prefill_decode_reference_engine(pre.model, pf, dec.model, df);
  std::mt19937 rng(8);
  for (int32_t seq : {0, 1}) {
    const SequenceChunk prompt{seq, test::random_token_ids(seq == 0 ? 37 : 9, s.vocab, rng)};
    const std::vector<float> lg = gpu->forward(std::span(&prompt, 1), true)[0];
    const std::vector<float> lr = ref->forward(std::span(&prompt, 1), true)[0];
    const std::vector<float> lf = floor->forward(std::span(&prompt, 1), true)[0];
    const double err = rel_l2(lg, lr), fl = rel_l2(lf, lr);
    const double bound = std::max(kFp8MaxLogitsRelL2, kFp8FloorFactor * fl);
    std::printf("FP8 prefill + INT4 head: prompt logits (%zu positions) rel L2 vs twin %.5f (floor %.5f, bound %.5f)\n",
                prompt.tokens.size(), err, fl, bound);
    EXPECT_LE(err, bound);
    EXPECT_TRUE(all_bf16_values(lg));
  }
}

// A synthetic engine with a random INT4 head (the bench's rows): runs, holds exactly the INT4 head's bytes more than
// the tied BF16 head (which borrows the embedding), greedy ids inside the vocabulary.
TEST(CudaEngineInt4HeadModels, SyntheticInt4HeadRuns) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s;
  s.vocab = 1000;  // → 1024 rows
  const ModelConfig c = test::make_tiny_llama(s, 1).config;
  CudaEngineOptions co;
  co.kv = formats::KvFormat::INT4;
  co.max_sequences = 2;
  const CudaEngineMemory plain = make_synthetic_cuda_engine(c, 32, co)->memory();
  co.synthetic_int4_head = true;
  std::unique_ptr<CudaEngine> e = make_synthetic_cuda_engine(c, 32, co);
  EXPECT_NE(e->description().find("LM head W4A16 INT4 g64"), std::string::npos) << e->description();
  EXPECT_EQ(e->memory().weights - plain.weights, 1024 * 64 / 2 + 1024 * 1 * 2);
  std::mt19937 rng(2);
  std::vector<SequenceChunk> batch = {{0, test::random_token_ids(20, c.vocab_size, rng)}, {1, {3}}};
  const std::vector<std::vector<float>> lg = e->forward(batch, false);
  for (const auto& l : lg) {
    ASSERT_EQ(l.size(), static_cast<size_t>(c.vocab_size));
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
  }
  for (int step = 0; step < 3; ++step) {
    batch = {{0, {1}}, {1, {2}}};
    for (int32_t id : e->forward_greedy(batch)) EXPECT_TRUE(id >= 0 && id < c.vocab_size) << id;
  }
}

// No device needed: the head formats of an FP8-prefill engine's two recipes must agree (checked before GPU work).
TEST(CudaEngineInt4HeadHost, Fp8PrefillRecipesMustShareTheHeadFormat) {
  test::TinyLlama s;
  s.hidden = 256;
  s.inter = 512;
  s.head_dim = 64;
  const Model m = test::make_tiny_llama(s, 2);
  try {
    make_cuda_engine(quantise(m, "int4-rtn-g64+head-int4"), quantise(m, "fp8+act-fp8"));
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LM-head formats"), std::string::npos) << e.what();
  }
}

}  // namespace
