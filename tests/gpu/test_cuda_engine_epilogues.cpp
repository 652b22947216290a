// The CUDA engine with and without the W4A16 GEMM's fused epilogues (CudaEngineOptions::fused_epilogues): the o and
// down GEMMs adding into the residual stream and the gate|up GEMM applying SwiGLU give exactly the values of the
// unfused chain (BF16 GEMM outputs, then residual + RMSNorm and SwiGLU kernels), so two engines differing only in the
// flag must return identical logits and tokens — over prompts (several sequences in one pass, W4A16 launches of 64
// rows and a remainder), decode steps replayed as CUDA graphs, greedy ids chosen on the GPU, INT4 caches, FP8
// prefill passes, and a real checkpoint. The op profile shows which kernels ran. A wide tiny model (K = 2048) makes the
// qkv GEMM split K at 41..64 rows, so its passes of that size run the attention prologue in the split-K reduce.
// CudaEngineOptions::fused_norm_prologue (the RMSNorms inside the qkv and gate|up GEMMs at <= 8 rows) and
// fused_norm_partials (the same with the row sums from the residual GEMMs) are compared with the default the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/attention_prefill_internal.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/cuda_engine.h"
#include "futransformer/engine.h"
#include "futransformer/error.h"
#include "futransformer/model.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/tokenizer.h"
#include "gpu_test_util.h"
#include "test_paths.h"
#include "tiny_llama.h"

namespace {

using namespace futransformer;
using test::quantise;
using test::argmax;
using test::bf16_model;

// Both engines run the same batches: three prompts in one pass (122 rows: W4A16 launches of 64 + 58 rows), every
// position's logits; then decode steps (graphs captured on the second and replayed) fed the fused engine's greedy
// tokens; then forward_greedy. Everything must be identical bit for bit.
void expect_identical(CudaEngine& fused, CudaEngine& unfused, int64_t vocab, uint32_t seed, int steps) {
  std::mt19937 rng(seed);
  std::vector<SequenceChunk> batch = {{0, test::random_token_ids(100, vocab, rng)},
                                      {1, test::random_token_ids(17, vocab, rng)},
                                      {2, test::random_token_ids(5, vocab, rng)}};
  const std::vector<std::vector<float>> pf = fused.forward(batch, true), pu = unfused.forward(batch, true);
  ASSERT_EQ(pf.size(), batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    ASSERT_EQ(pf[i].size(), batch[i].tokens.size() * static_cast<size_t>(vocab));
    EXPECT_EQ(pf[i], pu[i]) << "prompt logits of sequence " << batch[i].seq_id;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::vector<float> last(pf[i].end() - vocab, pf[i].end());
    batch[i].tokens = {argmax(last)};
  }
  for (int s = 0; s < steps; ++s) {
    const std::vector<std::vector<float>> lf = fused.forward(batch), lu = unfused.forward(batch);
    for (size_t i = 0; i < batch.size(); ++i) {
      ASSERT_EQ(lf[i], lu[i]) << "decode step " << s << ", sequence " << batch[i].seq_id;
      batch[i].tokens = {argmax(lf[i])};
    }
  }
  EXPECT_EQ(fused.forward_greedy(batch), unfused.forward_greedy(batch));
}

class CudaEngineEpilogues : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEngineEpilogues, TinyInt4FusedEqualsUnfused) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 41)), GetParam());
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  co.max_sequences = 4;
  EXPECT_TRUE(co.fused_epilogues) << "fused epilogues are the default";
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(q, co);
  co.fused_epilogues = false;
  std::unique_ptr<CudaEngine> unfused = make_cuda_engine(q, co);
  EXPECT_NE(fused->description().find("GEMM epilogues fused"), std::string::npos) << fused->description();
  EXPECT_NE(unfused->description().find("GEMM epilogues separate"), std::string::npos) << unfused->description();
  expect_identical(*fused, *unfused, s.vocab, 5, 12);
}

// CudaEngineOptions::fused_norm_prologue: the attention RMSNorm (layers after the first) and the MLP RMSNorm run
// inside the qkv and gate|up GEMMs in passes of at most 8 rows, bit for bit the separate norm kernels. Against the
// default engine: prompts of 100 / 17 / 5 rows in one pass (122 rows: no prologue), decode steps at batch 3, then a new
// sequence's 5-row prompt pass (for int4-hadamard a pass with a new sequence: the qkv GEMM's plain store path) and
// decode steps at batch 1, forward_greedy at both batches.
TEST_P(CudaEngineEpilogues, NormPrologueEqualsSeparateNorms) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 61)), GetParam());
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  co.max_sequences = 4;
  EXPECT_FALSE(co.fused_norm_prologue) << "off by default until its GPU tests pass";
  EXPECT_FALSE(co.fused_norm_partials) << "off by default until measured faster";
  std::unique_ptr<CudaEngine> plain = make_cuda_engine(q, co);
  EXPECT_EQ(plain->description().find("RMSNorm in the qkv"), std::string::npos) << plain->description();
  // fused_norm_prologue (each GEMM sums its rows), then fused_norm_partials (the residual GEMMs' partials).
  for (const bool partials : {false, true}) {
    SCOPED_TRACE(partials ? "fused_norm_partials" : "fused_norm_prologue");
    CudaEngineOptions nco = co;
    nco.fused_norm_prologue = !partials;
    nco.fused_norm_partials = partials;
    std::unique_ptr<CudaEngine> norm = make_cuda_engine(q, nco);
    // A fresh baseline per round: both engines see the same sequence of passes.
    std::unique_ptr<CudaEngine> base = make_cuda_engine(q, co);
    EXPECT_NE(norm->description().find("RMSNorm in the qkv / gate|up GEMMs"), std::string::npos)
        << norm->description();
    EXPECT_EQ(norm->description().find("row sums from the residual GEMMs") != std::string::npos, partials)
        << norm->description();
    expect_identical(*norm, *base, s.vocab, 11, 8);

    std::mt19937 rng(13);
    std::vector<SequenceChunk> one = {{3, test::random_token_ids(5, s.vocab, rng)}};
    const std::vector<std::vector<float>> pn = norm->forward(one, true), pp = base->forward(one, true);
    ASSERT_EQ(pn.size(), 1u);
    EXPECT_EQ(pn[0], pp[0]) << "5-row prompt pass";
    one[0].tokens = {argmax(std::vector<float>(pn[0].end() - s.vocab, pn[0].end()))};
    for (int k = 0; k < 8; ++k) {
      const std::vector<std::vector<float>> ln = norm->forward(one), lp = base->forward(one);
      ASSERT_EQ(ln[0], lp[0]) << "batch-1 decode step " << k;
      one[0].tokens = {argmax(ln[0])};
    }
    EXPECT_EQ(norm->forward_greedy(one), base->forward_greedy(one));
  }
}

// CudaEngineOptions::fused_residual_norm: the MLP and attention RMSNorms after the o / down GEMMs through
// gemm_w4a16_residual_rmsnorm (inside the split-K reduce where K is split) — the same logits bit for bit over
// prompts, eager and graph-replayed decode steps, with the profile's labels naming the fused op.
TEST_P(CudaEngineEpilogues, ResidualNormEqualsSeparateNorms) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 73)), GetParam());
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  co.max_sequences = 4;
  EXPECT_TRUE(co.fused_residual_norm) << "on by default";
  EXPECT_EQ(co.fused_residual_norm_max_rows, 8);
  co.fused_residual_norm = false;
  CudaEngineOptions rco = co;
  rco.fused_residual_norm = true;
  rco.fused_residual_norm_max_rows = 1 << 20;  // every pass whose GEMM splits, the 122-row prompt included
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(q, rco);
  std::unique_ptr<CudaEngine> base = make_cuda_engine(q, co);
  expect_identical(*fused, *base, s.vocab, 19, 8);
}

// CudaEngineOptions::l2_prefetch_gate_up / _o / _down: the weights' L2 prefetch on a side branch of each decode step (a
// hint; forked after every layer's qkv GEMM, joined after the last layer) changes no logit, in eager steps and in
// captured graphs (the branch must rejoin for the capture to end), at every fraction; out-of-range fractions are
// rejected at construction with the option's name.
TEST_P(CudaEngineEpilogues, L2PrefetchOfGateUpChangesNothing) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 71)), GetParam());
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  co.max_sequences = 4;
  EXPECT_EQ(co.l2_prefetch_gate_up, 0.0) << "off by default";
  EXPECT_EQ(co.l2_prefetch_o, 0.0) << "off by default";
  for (const double f : {0.25, 1.0}) {
    SCOPED_TRACE("l2_prefetch_gate_up, l2_prefetch_o, l2_prefetch_down " + std::to_string(f));
    CudaEngineOptions pco = co;
    pco.l2_prefetch_gate_up = f;
    pco.l2_prefetch_o = f;
    pco.l2_prefetch_down = 1.0 - f;
    pco.l2_prefetch_after_attention = f < 0.5;  // both fork points
    pco.l2_prefetch_ctas = f < 0.5 ? 3 : 0;
    pco.l2_prefetch_threads = f < 0.5 ? 32 : 0;
    pco.l2_prefetch_max_rows = f < 0.5 ? 0 : 2;  // at 2: the batch-3 decode steps skip the branch
    std::unique_ptr<CudaEngine> prefetch = make_cuda_engine(q, pco);
    std::unique_ptr<CudaEngine> base = make_cuda_engine(q, co);
    expect_identical(*prefetch, *base, s.vocab, 17, 8);
  }
  for (const double bad : {-0.5, 1.5}) {
    CudaEngineOptions bco = co;
    bco.l2_prefetch_gate_up = bad;
    try {
      make_cuda_engine(q, bco);
      ADD_FAILURE() << "l2_prefetch_gate_up " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("l2_prefetch_gate_up must be a fraction in [0, 1]"), std::string::npos)
          << e.what();
    }
    bco = co;
    bco.l2_prefetch_o = bad;
    try {
      make_cuda_engine(q, bco);
      ADD_FAILURE() << "l2_prefetch_o " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("l2_prefetch_o must be a fraction in [0, 1]"), std::string::npos)
          << e.what();
    }
  }
}

// hidden 2048 (qkv 2048 -> 3072: 32 / 8 heads of 64): on an H200 the W4A16 heuristic splits the qkv GEMM's K at
// M >= 41 for groups 64 and 128 (M >= 40 for 32), and not below (w4a16::choose_tiling, replayed on the CPU).
test::TinyLlama wide_shape() {
  test::TinyLlama s = test::tiny_llama_w4a16_shape();
  s.hidden = 2048;
  s.inter = 256;
  s.heads = 32;
  s.kv_heads = 8;
  return s;
}

// CudaEngineOptions::fused_qkv_tail: decode passes of 3..5 rows (the default range) whose qkv GEMM does not split K run the attention
// prologue in the GEMM's own tail (INT4 caches at head_dim 128). wide_shape with 128-channel heads (16 / 4) against
// the same engine without the tail: prompts, decode steps at batch 3 (graphs), forward_greedy, all identical; then two
// profiled engines (no graphs) over the same passes, whose op counts differ by exactly the decode steps' layers: one
// "qkv GEMM + RoPE + KV append + q rotation" instead of "qkv GEMM" + "RoPE + KV append + q rotation" (INT4 caches;
// the BF16 cache keeps the kernel after the GEMM).
TEST_P(CudaEngineEpilogues, QkvTailEqualsKernelAfterGemm) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s = wide_shape();  // with heads of 128 channels: 16 / 4 of them
  s.heads = 16;
  s.kv_heads = 4;
  s.head_dim = 128;
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 67)), GetParam());
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  co.max_sequences = 4;
  EXPECT_TRUE(co.fused_qkv_tail) << "on by default for the rows where it was measured faster";
  EXPECT_EQ(co.fused_qkv_tail_min_rows, 3);
  EXPECT_EQ(co.fused_qkv_tail_max_rows, 5);
  const bool int4 = co.kv == formats::KvFormat::INT4 || co.kv == formats::KvFormat::INT4_HADAMARD;
  const int K = static_cast<int>(s.hidden), group = static_cast<int>(q.recipe.int4.group_size);
  EXPECT_EQ(cuda::gemm_w4a16_qkv_prologue_in_tail(3, K, group, q.recipe.int4.scale_type, co.kv,
                                                  static_cast<int>(s.heads), static_cast<int>(s.kv_heads), 128),
            int4)
      << "the premise: batch-3 decode steps take the tail exactly on INT4 caches";
  for (const auto& [lo, hi] : {std::pair{0, 5}, std::pair{6, 5}}) {  // not a range of rows >= 1
    CudaEngineOptions bco = co;
    bco.fused_qkv_tail_min_rows = lo;
    bco.fused_qkv_tail_max_rows = hi;
    try {
      make_cuda_engine(q, bco);
      ADD_FAILURE() << "fused_qkv_tail rows " << lo << ".." << hi << " were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fused_qkv_tail_min_rows..fused_qkv_tail_max_rows must be a range"),
                std::string::npos)
          << e.what();
    }
  }
  co.fused_qkv_tail = false;
  std::unique_ptr<CudaEngine> base = make_cuda_engine(q, co);
  co.fused_qkv_tail = true;
  std::unique_ptr<CudaEngine> tail = make_cuda_engine(q, co);
  const std::string named = "qkv prologue in the GEMM's tail at 3..5 rows";
  EXPECT_EQ(tail->description().find(named) != std::string::npos, int4) << tail->description();
  EXPECT_EQ(base->description().find(named), std::string::npos) << base->description();
  expect_identical(*tail, *base, s.vocab, 23, 10);

  constexpr int kSteps = 4;
  std::map<std::string, int64_t> calls[2];
  for (const bool on : {false, true}) {
    CudaEngineOptions pco = co;
    pco.fused_qkv_tail = on;
    pco.profile_ops = true;
    std::unique_ptr<CudaEngine> e = make_cuda_engine(q, pco);
    std::mt19937 rng(29);
    std::vector<SequenceChunk> batch = {{0, test::random_token_ids(12, s.vocab, rng)},
                                        {1, test::random_token_ids(7, s.vocab, rng)},
                                        {2, test::random_token_ids(3, s.vocab, rng)}};
    e->forward(batch);
    for (int k = 0; k < kSteps; ++k) {
      for (size_t i = 0; i < batch.size(); ++i) batch[i].tokens = {static_cast<int32_t>(5 + k + i)};
      e->forward(batch);
    }
    for (const CudaEngine::OpTime& t : e->op_profile()) calls[on][t.op] += t.calls;
  }
  const int64_t moved = int4 ? s.layers * kSteps : 0;
  const std::string fused_op = "qkv GEMM + RoPE + KV append + q rotation", after_op = "RoPE + KV append + q rotation";
  EXPECT_EQ(calls[1][fused_op] - calls[0][fused_op], moved);
  EXPECT_EQ(calls[0][after_op] - calls[1][after_op], moved);
  EXPECT_EQ(calls[0]["qkv GEMM"] - calls[1]["qkv GEMM"], moved);
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaEngineEpilogues,
                         ::testing::Values("int4-rtn-g32+kv-bf16", "int4-rtn-g64-bf16+kv-int4-hadamard",
                                           "int4-rtn-g128+kv-int4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The op profile names what ran: fused engines launch no SwiGLU or residual-add kernel, one "+ SwiGLU" and two
// "+ residual" GEMMs per layer and pass; unfused engines the reverse. Profiling (no graphs) changes no logit.
TEST(CudaEngineEpiloguesProfile, OpLabelsFollowTheFlag) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 43)), "int4-rtn-g64+kv-bf16");
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    CudaEngineOptions co = cuda_engine_options(q.recipe);
    co.fused_epilogues = fused;
    std::unique_ptr<CudaEngine> plain = make_cuda_engine(q, co);
    co.profile_ops = true;
    std::unique_ptr<CudaEngine> profiled = make_cuda_engine(q, co);
    std::mt19937 rng(9);
    const SequenceChunk prompt{0, test::random_token_ids(30, s.vocab, rng)};
    EXPECT_EQ(plain->forward(std::span(&prompt, 1), true), profiled->forward(std::span(&prompt, 1), true));
    const SequenceChunk step{0, {7}};
    EXPECT_EQ(plain->forward(std::span(&step, 1)), profiled->forward(std::span(&step, 1)));
    int64_t swiglu_gemm = 0, residual_gemm = 0, swiglu = 0, residual_norm = 0, mlp_norm = 0;
    for (const CudaEngine::OpTime& t : profiled->op_profile()) {
      if (t.op == "gate|up GEMM + SwiGLU") swiglu_gemm += t.calls;
      // fused_residual_norm (on by default for passes of <= 8 rows whose GEMM splits K) names the norm with the GEMM.
      if (t.op == "o GEMM + residual" || t.op == "down GEMM + residual" || t.op == "o GEMM + residual + MLP RMSNorm" ||
          t.op == "down GEMM + residual + attention RMSNorm")
        residual_gemm += t.calls;
      if (t.op == "o GEMM + residual + MLP RMSNorm") mlp_norm += t.calls;
      if (t.op == "SwiGLU") swiglu += t.calls;
      if (t.op == "residual + MLP RMSNorm" || t.op == "residual + attention RMSNorm" || t.op == "residual")
        residual_norm += t.calls;
      if (t.op == "MLP RMSNorm") mlp_norm += t.calls;
    }
    const int64_t per_pass = s.layers * 2;  // prompt + step
    EXPECT_EQ(swiglu_gemm, fused ? per_pass : 0);
    EXPECT_EQ(residual_gemm, fused ? 2 * per_pass : 0);
    EXPECT_EQ(mlp_norm, fused ? per_pass : 0);
    EXPECT_EQ(swiglu, fused ? 0 : per_pass);
    EXPECT_EQ(residual_norm, fused ? 0 : 2 * per_pass);
  }
}

// With fused_norm_prologue the op profile shows the norm-prologue GEMMs on passes of <= 8 rows only: a 30-row prompt
// pass runs every norm kernel (one attention RMSNorm per layer, one MLP RMSNorm per layer), a 1-row decode step only
// the first layer's attention RMSNorm, layers - 1 "RMSNorm + qkv GEMM" and layers "RMSNorm + gate|up GEMM + SwiGLU".
// Logits equal the default engine's.
TEST(CudaEngineEpiloguesProfile, NormPrologueOpLabels) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 67)), "int4-rtn-g64+kv-bf16");
  for (const bool partials : {false, true}) {
    SCOPED_TRACE(partials ? "fused_norm_partials" : "fused_norm_prologue");
    CudaEngineOptions co = cuda_engine_options(q.recipe);
    std::unique_ptr<CudaEngine> plain = make_cuda_engine(q, co);
    co.fused_norm_prologue = !partials;
    co.fused_norm_partials = partials;
    co.profile_ops = true;
    std::unique_ptr<CudaEngine> profiled = make_cuda_engine(q, co);
    std::mt19937 rng(19);
    const SequenceChunk prompt{0, test::random_token_ids(30, s.vocab, rng)};
    EXPECT_EQ(plain->forward(std::span(&prompt, 1), true), profiled->forward(std::span(&prompt, 1), true));
    const SequenceChunk step{0, {7}};
    EXPECT_EQ(plain->forward(std::span(&step, 1)), profiled->forward(std::span(&step, 1)));
    int64_t attn_norm = 0, mlp_norm = 0, qkv_norm = 0, gate_up_norm = 0, gate_up_plain = 0;
    for (const CudaEngine::OpTime& t : profiled->op_profile()) {
      if (t.op == "attention RMSNorm") attn_norm += t.calls;
      if (t.op == "MLP RMSNorm") mlp_norm += t.calls;
      if (t.op == "RMSNorm + qkv GEMM" || t.op == "RMSNorm + qkv GEMM + RoPE + KV append + q rotation")
        qkv_norm += t.calls;
      if (t.op == "RMSNorm + gate|up GEMM + SwiGLU") gate_up_norm += t.calls;
      if (t.op == "gate|up GEMM + SwiGLU") gate_up_plain += t.calls;
    }
    const int64_t L = s.layers;
    EXPECT_EQ(attn_norm, L + 1);  // the prompt pass: every layer; the step: the first layer only
    EXPECT_EQ(mlp_norm, L);       // the prompt pass
    EXPECT_EQ(qkv_norm, L - 1);   // the step, layers 1 .. L - 1
    EXPECT_EQ(gate_up_norm, L);   // the step
    EXPECT_EQ(gate_up_plain, L);  // the prompt pass
  }
}

// Fused (also profiled: no graphs), and unfused engines run: a prompt pass of 60 + 44 + 20 rows (W4A16 launches of
// 64 and 60 rows, both split: the prologue in the reduce, except int4-hadamard, whose new sequences need their key
// anchors first), a continuation pass of 30 + 20 rows (one split launch: in the reduce for every cache format), then
// decode steps of 3 rows (no split: the two-kernel prologue). Logits identical bit for bit; the profile counts the
// fused op once per layer and qualifying pass.
TEST_P(CudaEngineEpilogues, WideQkvPrologueInSplitKReduceEqualsUnfused) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = wide_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 53)), GetParam());
  const int N = static_cast<int>((s.heads + 2 * s.kv_heads) * s.head_dim), K = static_cast<int>(s.hidden);
  const int group = static_cast<int>(q.recipe.int4.group_size);
  for (int M : {44, 50, 60, 64}) EXPECT_TRUE(cuda::gemm_w4a16_splits_k(M, N, K, group)) << "M " << M;
  EXPECT_FALSE(cuda::gemm_w4a16_splits_k(3, N, K, group));
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  ASSERT_TRUE(co.fused_qkv_prologue);  // the default
  co.max_sequences = 4;
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(q, co);
  co.profile_ops = true;
  std::unique_ptr<CudaEngine> profiled = make_cuda_engine(q, co);
  co.profile_ops = false;
  co.fused_epilogues = false;
  std::unique_ptr<CudaEngine> unfused = make_cuda_engine(q, co);
  // The profiled engine launches without graphs, and graph-replayed decode steps plan attention's split over the
  // context bucket (a power of two), plain ones over the real length: a different split order is different bits.
  // Its decode steps are therefore compared with an unfused engine that also runs without graphs.
  co.cuda_graphs = false;
  std::unique_ptr<CudaEngine> unfused_plain = make_cuda_engine(q, co);
  const bool hadamard = co.kv == formats::KvFormat::INT4_HADAMARD;

  std::mt19937 rng(17);
  const std::vector<SequenceChunk> prompt = {{0, test::random_token_ids(60, s.vocab, rng)},
                                             {1, test::random_token_ids(44, s.vocab, rng)},
                                             {2, test::random_token_ids(20, s.vocab, rng)}};
  const std::vector<SequenceChunk> more = {{0, test::random_token_ids(30, s.vocab, rng)},
                                           {2, test::random_token_ids(20, s.vocab, rng)}};
  for (const std::vector<SequenceChunk>* batch : {&prompt, &more}) {
    const auto lf = fused->forward(*batch, true), lp = profiled->forward(*batch, true);
    const auto lu = unfused->forward(*batch, true), lup = unfused_plain->forward(*batch, true);
    ASSERT_EQ(lf.size(), batch->size());
    for (size_t i = 0; i < batch->size(); ++i) {
      EXPECT_EQ(lf[i], lu[i]) << "pass of " << (batch == &prompt ? "prompts" : "continuations") << ", sequence "
                              << (*batch)[i].seq_id;
      EXPECT_EQ(lp[i], lu[i]) << "profiled engine, sequence " << (*batch)[i].seq_id;
      EXPECT_EQ(lup[i], lu[i]) << "unfused engine without graphs, sequence " << (*batch)[i].seq_id;
    }
  }
  std::vector<SequenceChunk> step = {{0, {5}}, {1, {6}}, {2, {7}}};
  for (int k = 0; k < 6; ++k) {
    const auto lf = fused->forward(step), lp = profiled->forward(step), lu = unfused->forward(step);
    const auto lup = unfused_plain->forward(step);
    for (size_t i = 0; i < step.size(); ++i) {
      ASSERT_EQ(lf[i], lu[i]) << "decode step " << k << ", sequence " << step[i].seq_id;
      ASSERT_EQ(lp[i], lup[i]) << "profiled, decode step " << k << ", sequence " << step[i].seq_id;
      step[i].tokens = {argmax(lf[i])};
    }
  }
  int64_t in_gemm = 0, one_kernel = 0;
  for (const CudaEngine::OpTime& t : profiled->op_profile()) {
    if (t.op == "qkv GEMM + RoPE + KV append + q rotation") in_gemm += t.calls;
    if (t.op == "RoPE + KV append + q rotation") one_kernel += t.calls;
  }
  const int64_t fused_passes = hadamard ? 1 : 2;
  EXPECT_EQ(in_gemm, s.layers * fused_passes);
  EXPECT_EQ(one_kernel, s.layers * 6);  // the decode steps
}

// int4-hadamard decode steps un-rotate the attention output inside the attention with fused epilogues — in its combine
// kernel when it splits the sequences (an 1100-token context), in the decode kernel itself when it does not (short
// contexts) — and in the separate rotate_heads_bf16 without. Logits identical bit for bit (graph-replayed steps
// compared with graph-replayed ones, profiled with unprofiled engines without graphs: the split follows the planned
// context, see WideQkvPrologueInSplitKReduceEqualsUnfused); the profile shows which kernel ran.
TEST(CudaEngineEpiloguesUnrotation, DecodeAttentionUnrotatesSplitOrNot) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  Model m = bf16_model(test::make_tiny_llama(s, 59));
  m.config.max_position_embeddings = 2048;
  const quant::QuantizedModel q = quantise(m, "int4-rtn-g64-bf16+kv-int4-hadamard");
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  ASSERT_EQ(co.kv, formats::KvFormat::INT4_HADAMARD);
  co.max_sequences = 4;
  co.max_sequence_length = 1536;
  co.int4_dequant_min_rows = 0;  // the 1024-row prompt passes on the W4A16 GEMM too, as in the other tests here
  co.fused_attention_unrotation = true;  // the default, set so the premise holds whatever the default becomes
  const int pages = 1536 / 64;
  // The premise, from the split heuristic on this device: batch 2 at 1100+ tokens splits (graph replays plan for the
  // power-of-two bucket, capped at the engine's 1536), at 30-odd tokens it does not. The op counts come from the
  // profiled engine, which runs without graphs and plans the real length; the graph-replayed engines plan short
  // steps for the 256 bucket, which the occupancy split rule splits in 2 (16 tiles, 2 a warp), so there fused and
  // unfused compare the combine's un-rotation with the separate kernel: same bits either way.
  const int nh = static_cast<int>(s.heads), nkv = static_cast<int>(s.kv_heads), hd = static_cast<int>(s.head_dim);
  for (int len : {1101, 1110, 1536})
    ASSERT_GT(cuda::attention_decode_workspace_bytes(co.kv, 2, nh, nkv, hd, pages, len), 0u) << len;
  for (int len : {31, 40})
    ASSERT_EQ(cuda::attention_decode_workspace_bytes(co.kv, 2, nh, nkv, hd, pages, len), 0u) << len;

  std::unique_ptr<CudaEngine> fused = make_cuda_engine(q, co);
  EXPECT_NE(fused->description().find("un-rotated by the attention"), std::string::npos) << fused->description();
  co.profile_ops = true;
  std::unique_ptr<CudaEngine> profiled = make_cuda_engine(q, co);
  co.profile_ops = false;
  co.fused_epilogues = false;
  std::unique_ptr<CudaEngine> unfused = make_cuda_engine(q, co);
  EXPECT_EQ(unfused->description().find("un-rotated by the attention"), std::string::npos) << unfused->description();
  co.cuda_graphs = false;
  std::unique_ptr<CudaEngine> unfused_plain = make_cuda_engine(q, co);

  std::mt19937 rng(23);
  // Prompts, then decode steps; returns the profiled engine's op counts of the steps only.
  auto run_phase = [&](std::vector<SequenceChunk> prompt, int steps, const char* what) {
    SCOPED_TRACE(what);
    const auto pf = fused->forward(prompt), pp = profiled->forward(prompt);
    const auto pu = unfused->forward(prompt), pup = unfused_plain->forward(prompt);
    for (size_t i = 0; i < prompt.size(); ++i) {
      EXPECT_EQ(pf[i], pu[i]) << "prompt, sequence " << prompt[i].seq_id;
      EXPECT_EQ(pp[i], pup[i]) << "prompt (no graphs), sequence " << prompt[i].seq_id;
    }
    profiled->clear_op_profile();
    std::vector<SequenceChunk> step;
    for (size_t i = 0; i < prompt.size(); ++i) step.push_back({prompt[i].seq_id, {argmax(pf[i])}});
    for (int k = 0; k < steps; ++k) {
      const auto lf = fused->forward(step), lp = profiled->forward(step);
      const auto lu = unfused->forward(step), lup = unfused_plain->forward(step);
      for (size_t i = 0; i < step.size(); ++i) {
        EXPECT_EQ(lf[i], lu[i]) << "decode step " << k << ", sequence " << step[i].seq_id;
        EXPECT_EQ(lp[i], lup[i]) << "decode step " << k << " (no graphs), sequence " << step[i].seq_id;
        step[i].tokens = {argmax(lf[i])};
      }
    }
    std::map<std::string, int64_t> calls;
    for (const CudaEngine::OpTime& t : profiled->op_profile()) calls[t.op] += t.calls;
    return calls;
  };
  const int steps = 5;
  std::map<std::string, int64_t> c = run_phase({{0, test::random_token_ids(1100, s.vocab, rng)},
                                                {1, test::random_token_ids(30, s.vocab, rng)}},
                                               steps, "long context: split attention");
  EXPECT_EQ(c["decode attention + un-rotation"], s.layers * steps);
  EXPECT_EQ(c["decode attention"], 0);
  EXPECT_EQ(c["attention output un-rotation"], 0);
  c = run_phase({{2, test::random_token_ids(30, s.vocab, rng)}, {3, test::random_token_ids(20, s.vocab, rng)}}, steps,
                "short context: unsplit attention");
  EXPECT_EQ(c["decode attention + un-rotation"], s.layers * steps);
  EXPECT_EQ(c["decode attention"], 0);
  EXPECT_EQ(c["attention output un-rotation"], 0);
}

// Decode steps run the attention prologue inside the decode attention kernel with CudaEngineOptions::
// fused_attention_prologue and attention_prologue_unsplit (every step then qualifies, split K or not):
// RoPE, the q rotation and the new token's cache append by the CTA that reads it. An engine with the option off runs
// qkv_rope_kv_append and the attention as before; logits identical bit for bit over prompts and decode steps (graph
// replays against graph replays, profiled against unprofiled engines without graphs), for an int4-hadamard cache at
// a long context (split attention: the combine un-rotates) and a short one (unsplit: the decode kernel un-rotates), and
// for a plain INT4 cache. The model has head_dim 128 and 8 query heads on 2 KV heads (the quad path's shape: 12 head
// items per row). The profile shows which kernels ran.
TEST(CudaEngineEpiloguesAttentionPrologue, DecodeAttentionRunsThePrologue) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s = test::tiny_llama_w4a16_shape();
  s.heads = 8;
  s.kv_heads = 2;
  s.head_dim = 128;
  Model m = bf16_model(test::make_tiny_llama(s, 61));
  m.config.max_position_embeddings = 2048;
  for (const char* recipe : {"int4-rtn-g64-bf16+kv-int4-hadamard", "int4-rtn-g64-bf16+kv-int4"}) {
    SCOPED_TRACE(recipe);
    const quant::QuantizedModel q = quantise(m, recipe);
    const bool hadamard = q.recipe.kv == formats::KvFormat::INT4_HADAMARD;
    CudaEngineOptions co = cuda_engine_options(q.recipe);
    co.max_sequences = 4;
    co.max_sequence_length = 1536;
    co.int4_dequant_min_rows = 0;
    co.fused_attention_prologue = true;    // off by default
    co.attention_prologue_unsplit = true;  // also the steps whose qkv GEMM does not split K (all of them here)
    std::unique_ptr<CudaEngine> fused = make_cuda_engine(q, co);
    EXPECT_NE(fused->description().find("qkv prologue in decode attention)"), std::string::npos) << fused->description();
    co.profile_ops = true;
    std::unique_ptr<CudaEngine> profiled = make_cuda_engine(q, co);
    co.profile_ops = false;
    co.fused_attention_prologue = false;
    co.fused_qkv_prologue = false;  // the separate kernel on every step, whatever the GEMM does
    std::unique_ptr<CudaEngine> separate = make_cuda_engine(q, co);
    co.cuda_graphs = false;
    std::unique_ptr<CudaEngine> separate_plain = make_cuda_engine(q, co);

    std::mt19937 rng(29);
    auto run_phase = [&](std::vector<SequenceChunk> prompt, int steps, const char* what) {
      SCOPED_TRACE(what);
      const auto pf = fused->forward(prompt), pp = profiled->forward(prompt);
      const auto ps = separate->forward(prompt), psp = separate_plain->forward(prompt);
      for (size_t i = 0; i < prompt.size(); ++i) {
        EXPECT_EQ(pf[i], ps[i]) << "prompt, sequence " << prompt[i].seq_id;
        EXPECT_EQ(pp[i], psp[i]) << "prompt (no graphs), sequence " << prompt[i].seq_id;
      }
      profiled->clear_op_profile();
      std::vector<SequenceChunk> step;
      for (size_t i = 0; i < prompt.size(); ++i) step.push_back({prompt[i].seq_id, {argmax(pf[i])}});
      for (int k = 0; k < steps; ++k) {
        const auto lf = fused->forward(step), lp = profiled->forward(step);
        const auto ls = separate->forward(step), lsp = separate_plain->forward(step);
        for (size_t i = 0; i < step.size(); ++i) {
          EXPECT_EQ(lf[i], ls[i]) << "decode step " << k << ", sequence " << step[i].seq_id;
          EXPECT_EQ(lp[i], lsp[i]) << "decode step " << k << " (no graphs), sequence " << step[i].seq_id;
          step[i].tokens = {argmax(lf[i])};
        }
      }
      std::map<std::string, int64_t> calls;
      for (const CudaEngine::OpTime& t : profiled->op_profile()) calls[t.op] += t.calls;
      return calls;
    };
    const int steps = 5;
    const std::string in_attention = "RoPE + KV append + q rotation + decode attention";
    std::map<std::string, int64_t> c;
    if (hadamard) {
      c = run_phase({{0, test::random_token_ids(1100, s.vocab, rng)}, {1, test::random_token_ids(30, s.vocab, rng)}},
                    steps, "long context: split attention");
      EXPECT_EQ(c[in_attention + " + un-rotation"], s.layers * steps);
      EXPECT_EQ(c["RoPE + KV append + q rotation"], 0);
      EXPECT_EQ(c["attention output un-rotation"], 0);
    }
    c = run_phase({{2, test::random_token_ids(30, s.vocab, rng)}, {3, test::random_token_ids(20, s.vocab, rng)}},
                  steps, "short context: unsplit attention");
    EXPECT_EQ(c[hadamard ? in_attention + " + un-rotation" : in_attention], s.layers * steps);
    EXPECT_EQ(c["RoPE + KV append + q rotation"], 0);
    EXPECT_EQ(c["attention output un-rotation"], 0);
  }
}

// FP8 prefill passes keep their own FP8 weights and unfused ops; the INT4 decode passes around them use the fused
// epilogues (gate|up packed interleaved). Same values either way.
TEST(CudaEngineEpiloguesModels, Fp8PrefillFusedEqualsUnfused) {
  FT_REQUIRE_HOPPER();
  test::TinyLlama s = test::tiny_llama_w4a16_shape();
  s.inter = 512;  // the FP8 GEMM's K % 128
  const Model m = bf16_model(test::make_tiny_llama(s, 47));
  const quant::QuantizedModel dec = quantise(m, "int4-rtn-g64");
  const quant::QuantizedModel pre = quantise(m, "fp8+act-fp8");
  CudaEngineOptions co;
  co.kv = formats::KvFormat::BF16;
  co.max_sequences = 4;
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(dec, pre, co);
  co.fused_epilogues = false;
  std::unique_ptr<CudaEngine> unfused = make_cuda_engine(dec, pre, co);
  expect_identical(*fused, *unfused, s.vocab, 6, 8);
}

// SmolLM2-135M (hidden 576, intermediate 1536, 30 layers): the real shapes, INT4 cache.
TEST(CudaEngineEpiloguesModels, SmolLM2Int4FusedEqualsUnfused) {
  FT_REQUIRE_HOPPER();
  const std::string path = test::smollm2_gguf_path();
  FT_REQUIRE_FILE(path);
  const Model model = bf16_model(load_model(path));
  const quant::QuantizedModel q = quantise(model, "int4-rtn-g64+kv-int4-hadamard");
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  co.max_sequences = 4;
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(q, co);
  co.fused_epilogues = false;
  std::unique_ptr<CudaEngine> unfused = make_cuda_engine(q, co);
  expect_identical(*fused, *unfused, model.config.vocab_size, 7, 16);
}

// int4-hadamard prompt passes that attend with attention_prefill: with fused_prefill_unrotation the prefill kernel
// un-rotates its output in its store (attention_prefill_int4_unrotated), without it rotate_heads_bf16 follows; the
// logits of prompt and continuation passes and of the decode steps after them are identical bit for bit, and the
// profile shows which ran.
TEST(CudaEngineEpiloguesUnrotation, PrefillAttentionUnrotatesInItsStore) {
  FT_REQUIRE_HOPPER();
  const test::TinyLlama s = test::tiny_llama_w4a16_shape();
  const quant::QuantizedModel q = quantise(bf16_model(test::make_tiny_llama(s, 61)), "int4-rtn-g64-bf16+kv-int4-hadamard");
  CudaEngineOptions co = cuda_engine_options(q.recipe);
  ASSERT_EQ(co.kv, formats::KvFormat::INT4_HADAMARD);
  co.max_sequences = 4;
  co.max_sequence_length = 256;  // the tiny model's max_position_embeddings; 60 + 30 prompt tokens and 4 steps fit
  co.fused_prefill_unrotation = true;
  std::unique_ptr<CudaEngine> fused = make_cuda_engine(q, co);
  co.profile_ops = true;
  std::unique_ptr<CudaEngine> profiled = make_cuda_engine(q, co);
  co.profile_ops = false;
  co.fused_prefill_unrotation = false;
  std::unique_ptr<CudaEngine> unfused = make_cuda_engine(q, co);

  std::mt19937 rng(29);
  const std::vector<SequenceChunk> prompt = {{0, test::random_token_ids(60, s.vocab, rng)},
                                             {1, test::random_token_ids(44, s.vocab, rng)}};
  const std::vector<SequenceChunk> more = {{0, test::random_token_ids(30, s.vocab, rng)},
                                           {1, test::random_token_ids(20, s.vocab, rng)}};
  for (const std::vector<SequenceChunk>* batch : {&prompt, &more}) {
    const auto lf = fused->forward(*batch, true), lp = profiled->forward(*batch, true);
    const auto lu = unfused->forward(*batch, true);
    ASSERT_EQ(lf.size(), batch->size());
    for (size_t i = 0; i < batch->size(); ++i) {
      EXPECT_EQ(lf[i], lu[i]) << (batch == &prompt ? "prompts" : "continuations") << ", sequence "
                              << (*batch)[i].seq_id;
      EXPECT_EQ(lp[i], lu[i]) << "profiled engine, sequence " << (*batch)[i].seq_id;
    }
  }
  std::vector<SequenceChunk> step = {{0, {5}}, {1, {6}}};
  for (int k = 0; k < 4; ++k) {
    const auto lf = fused->forward(step), lu = unfused->forward(step);
    for (size_t i = 0; i < step.size(); ++i) {
      ASSERT_EQ(lf[i], lu[i]) << "decode step " << k << ", sequence " << step[i].seq_id;
      step[i].tokens = {argmax(lf[i])};
    }
  }
  std::map<std::string, int64_t> calls;
  for (const CudaEngine::OpTime& t : profiled->op_profile()) calls[t.op] += t.calls;
  const bool kernel_unrotates = cuda::attention_prefill_default_kernel() == cuda::AttentionPrefillKernel::kWgmma;
  EXPECT_EQ(calls["prefill attention + un-rotation"], kernel_unrotates ? s.layers * 2 : 0);
  EXPECT_EQ(calls["prefill attention"], kernel_unrotates ? 0 : s.layers * 2);
}

}  // namespace
