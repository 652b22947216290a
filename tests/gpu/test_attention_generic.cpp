// GPU tests of the generic paged decode attention (BF16 / INT4 / INT4-Hadamard caches, any head_dim and GQA
// ratio) against its CPU twin ref::paged_decode_attention on the same pages, plus host-only checks of the shape
// contract (tolerances and their derivation: tests/attention_generic_check.h). Device tests report SKIPPED
// without an sm_90 device (the kernel merges its splits through a thread-block cluster).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_generic_check.h"
#include "futransformer/cuda/attention_generic.h"
#include "futransformer/dtype.h"
#include "gpu_test_util.h"
#include "paged_kv_case.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;
using test::PagedKvCase;

struct Uploaded {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<int32_t> block_table, seq_lens;
  DeviceBuffer<uint16_t> q;
  explicit Uploaded(const PagedKvCase& c)
      : pool(c.pool), block_table(c.block_table), seq_lens(c.seq_lens), q(c.q_bf16) {}
};

cudaError_t launch(const PagedKvCase& c, const Uploaded& u, const int32_t* seq_lens, uint16_t* out,
                   cudaStream_t stream = nullptr) {
  return cuda::attention_decode_generic(c.format, reinterpret_cast<const __nv_bfloat16*>(u.q.p), u.pool.p,
                                        u.block_table.p, seq_lens, reinterpret_cast<__nv_bfloat16*>(out), c.batch,
                                        c.n_heads, c.n_kv_heads, c.head_dim, c.max_pages, stream);
}

// Runs the kernel into a NaN-poisoned output (optionally with other seq_lens than the case's); returns its bits.
std::vector<uint16_t> run(const PagedKvCase& c, const std::vector<int32_t>* seq_lens = nullptr) {
  const Uploaded u(c);
  const DeviceBuffer<int32_t> lens(seq_lens ? *seq_lens : c.seq_lens);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(c.batch) * c.n_heads * c.head_dim);
  EXPECT_EQ(out.poison(), cudaSuccess);
  const cudaError_t e = launch(c, u, lens.p, out.p);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_generic_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.download();
}

void check_against_twin(KvFormat format, int head_dim, int n_heads, int n_kv, const std::vector<int32_t>& lens,
                        uint32_t seed) {
  const PagedKvCase c = test::make_paged_kv_case(format, head_dim, n_heads, n_kv, lens, seed);
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " head_dim " << head_dim << " heads " << n_heads
                                  << "/" << n_kv << " batch " << c.batch << " max_pages " << c.max_pages << " seed "
                                  << seed);
  std::vector<float> abs_ref;
  const std::vector<float> ref = ref::paged_decode_attention(c.cache(), c.seq_lens, c.q, n_heads, &abs_ref);
  test::expect_close_to_twin(c, run(c), ref, abs_ref);
}

// Every call carries all the awkward lengths at once: empty, one token, a page minus one, exactly one page, a
// page plus one, and a long one that the cluster splits.
const std::vector<int32_t> kLens = {0, 1, 63, 64, 65, 1000};

TEST(AttentionGenericGpu, Bf16EveryHeadDimGqaAndLength) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 1000;
  for (int head_dim : {8, 16, 32, 64, 96, 128, 256}) {
    for (int gqa : {1, 2, 3, 8, 16}) check_against_twin(KvFormat::BF16, head_dim, 2 * gqa, 2, kLens, ++seed);
  }
}

TEST(AttentionGenericGpu, Int4EveryHeadDimGqaAndLength) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 2000;
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    for (int head_dim : {32, 64, 96, 128, 256}) {
      for (int gqa : {1, 2, 3, 8, 16}) check_against_twin(f, head_dim, 2 * gqa, 2, kLens, ++seed);
    }
  }
}

TEST(AttentionGenericGpu, LargestHeadDim) {
  FT_REQUIRE_HOPPER();
  for (KvFormat f : {KvFormat::BF16, KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    check_against_twin(f, cuda::kAttentionGenericMaxHeadDim, 4, 2, {1, 65, 1000}, 3001);
  }
}

// stories260K: head_dim 8, 8 query heads on 4 KV heads, contexts up to 512.
TEST(AttentionGenericGpu, Stories260kShape) {
  FT_REQUIRE_HOPPER();
  check_against_twin(KvFormat::BF16, 8, 8, 4, {512, 1, 300, 64}, 4001);
}

// batch · n_heads >= 256: one CTA per (sequence, head), no cluster split.
TEST(AttentionGenericGpu, LargeBatchWithoutSplits) {
  FT_REQUIRE_HOPPER();
  std::vector<int32_t> lens(16);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = kLens[i % kLens.size()] + static_cast<int32_t>(i);
  check_against_twin(KvFormat::BF16, 64, 16, 2, lens, 5001);
  check_against_twin(KvFormat::INT4, 64, 16, 4, lens, 5002);
}

TEST(AttentionGenericGpu, LongSequencesSplitAcrossTheCluster) {
  FT_REQUIRE_HOPPER();
  check_against_twin(KvFormat::BF16, 128, 32, 8, {32768}, 6001);
  check_against_twin(KvFormat::INT4, 128, 32, 8, {32768}, 6002);
  check_against_twin(KvFormat::INT4_HADAMARD, 64, 6, 2, {4097, 5, 32768}, 6003);
}

// seq_lens beyond max_pages_per_seq · 64 are clamped: the same bits as the exact length.
TEST(AttentionGenericGpu, LengthsBeyondTheBlockTableAreClamped) {
  FT_REQUIRE_HOPPER();
  for (KvFormat f : {KvFormat::BF16, KvFormat::INT4}) {
    const PagedKvCase c = test::make_paged_kv_case(f, 64, 4, 2, {192, 192}, 7001);
    const std::vector<int32_t> longer = {100000, 193};
    EXPECT_EQ(run(c), run(c, &longer)) << formats::kv_format_name(f);
  }
}

// The same inputs give the same bits, launched directly or replayed from a captured CUDA graph.
TEST(AttentionGenericGpu, DeterministicAndGraphCapturable) {
  FT_REQUIRE_HOPPER();
  for (KvFormat f : {KvFormat::BF16, KvFormat::INT4_HADAMARD}) {
    const PagedKvCase c = test::make_paged_kv_case(f, 96, 12, 4, {1000, 17, 4097}, 8001);
    const std::vector<uint16_t> direct = run(c);
    EXPECT_EQ(run(c), direct) << formats::kv_format_name(f);

    const Uploaded u(c);
    DeviceBuffer<uint16_t> out(direct.size());
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const cudaError_t e = launch(c, u, u.seq_lens.p, out.p, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(e, cudaSuccess) << cuda::attention_generic_last_error();
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 2; ++replay) {
      ASSERT_EQ(out.poison(), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(out.download(), direct) << formats::kv_format_name(f) << " graph replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// Not a benchmark: a guard against pathological slowness (a sequence streamed through one SM, serialised loads).
// One 32k-token sequence of a Llama-3-8B-shaped layer must take well under a millisecond-scale budget.
TEST(AttentionGenericGpu, LongContextTakesMilliseconds) {
  FT_REQUIRE_HOPPER();
  constexpr double kBudgetMs = 5.0;
  for (KvFormat f : {KvFormat::BF16, KvFormat::INT4}) {
    const PagedKvCase c = test::make_paged_kv_case(f, 128, 32, 8, {32768}, 9001);
    const Uploaded u(c);
    DeviceBuffer<uint16_t> out(static_cast<size_t>(c.n_heads) * c.head_dim);
    ASSERT_EQ(launch(c, u, u.seq_lens.p, out.p), cudaSuccess) << cuda::attention_generic_last_error();  // warm-up
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaEvent_t start = nullptr, stop = nullptr;
    ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
    std::vector<float> ms;
    for (int i = 0; i < 11; ++i) {
      ASSERT_EQ(cudaEventRecord(start), cudaSuccess);
      ASSERT_EQ(launch(c, u, u.seq_lens.p, out.p), cudaSuccess);
      ASSERT_EQ(cudaEventRecord(stop), cudaSuccess);
      ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
      float t = 0.0f;
      ASSERT_EQ(cudaEventElapsedTime(&t, start, stop), cudaSuccess);
      ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    std::printf("attention_generic %s, 32768 tokens, 32/8 heads of 128: median %.3f ms\n", formats::kv_format_name(f),
                ms[ms.size() / 2]);
    EXPECT_LT(ms[ms.size() / 2], kBudgetMs) << formats::kv_format_name(f);
  }
}

TEST(AttentionGenericGpu, RejectedCallsLeaveTheOutputUntouched) {
  FT_REQUIRE_HOPPER();
  const PagedKvCase c = test::make_paged_kv_case(KvFormat::BF16, 64, 4, 2, {100}, 10001);
  const Uploaded u(c);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(c.n_heads) * c.head_dim);
  ASSERT_EQ(out.poison(), cudaSuccess);
  auto* q = reinterpret_cast<const __nv_bfloat16*>(u.q.p);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out.p);
  EXPECT_EQ(cuda::attention_decode_generic(KvFormat::BF16, q, u.pool.p + 8, u.block_table.p, u.seq_lens.p, o, 1, 4, 2,
                                           64, c.max_pages, nullptr),
            cudaErrorInvalidValue);  // kv_pool not 16-byte aligned
  EXPECT_NE(std::string(cuda::attention_generic_last_error()).find("aligned"), std::string::npos);
  EXPECT_EQ(cuda::attention_decode_generic(KvFormat::BF16, q, u.pool.p, u.block_table.p, u.seq_lens.p, o, 1, 5, 2, 64,
                                           c.max_pages, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_generic_last_error()).find("n_heads = 5"), std::string::npos);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : out.download()) ASSERT_EQ(v, 0xFFFF);
  // A successful call clears the message.
  ASSERT_EQ(cuda::attention_decode_generic(KvFormat::BF16, q, u.pool.p, u.block_table.p, u.seq_lens.p, o, 1, 4, 2, 64,
                                           c.max_pages, nullptr),
            cudaSuccess);
  EXPECT_STREQ(cuda::attention_generic_last_error(), "");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// --- Host-only: the shape contract (no device needed). ---

TEST(AttentionGenericHost, CanImplementAcceptsWhatTheFastKernelRejects) {
  std::string why = "stale";
  for (int hd : {8, 16, 24, 64, 96, 200, 256, 512}) {
    EXPECT_EQ(cuda::attention_generic_can_implement(KvFormat::BF16, 1, 8, 4, hd, 8, &why), cudaSuccess) << why;
    EXPECT_EQ(why, "");
  }
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    for (int hd : {32, 64, 96, 160, 256, 512}) {
      EXPECT_EQ(cuda::attention_generic_can_implement(f, 3, 64, 4, hd, 512, &why), cudaSuccess) << why;
    }
  }
  EXPECT_EQ(cuda::attention_generic_can_implement(KvFormat::BF16, 65535, 65535, 65535, 128, 1 << 24, &why), cudaSuccess)
      << why;
  EXPECT_EQ(cuda::attention_generic_can_implement(KvFormat::BF16, 1, 64, 1, 128, 1, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::attention_generic_can_implement(KvFormat::BF16, 1, 8, 4, 128, 1, nullptr), cudaSuccess);
}

TEST(AttentionGenericHost, CanImplementNamesTheProblem) {
  struct Bad {
    KvFormat f;
    int batch, n_heads, n_kv, hd, max_pages;
    const char* needle;
  };
  for (const Bad& b :
       {Bad{KvFormat::FP8, 1, 8, 4, 128, 4, "fp8"}, Bad{KvFormat::BF16, 1, 8, 4, 12, 4, "head_dim = 12"},
        Bad{KvFormat::BF16, 1, 8, 4, 0, 4, "head_dim = 0"}, Bad{KvFormat::BF16, 1, 8, 4, 520, 4, "head_dim = 520"},
        Bad{KvFormat::INT4, 1, 8, 4, 16, 4, "head_dim = 16"},
        Bad{KvFormat::INT4_HADAMARD, 1, 8, 4, 80, 4, "head_dim = 80"},
        Bad{KvFormat::INT4, 1, 8, 4, 544, 4, "head_dim = 544"}, Bad{KvFormat::BF16, 0, 8, 4, 64, 4, "batch = 0"},
        Bad{KvFormat::BF16, 65536, 8, 4, 64, 4, "batch = 65536"}, Bad{KvFormat::BF16, 1, 8, 0, 64, 4, "n_kv_heads = 0"},
        Bad{KvFormat::BF16, 1, 8, -2, 64, 4, "n_kv_heads = -2"}, Bad{KvFormat::BF16, 1, 0, 4, 64, 4, "n_heads = 0"},
        Bad{KvFormat::BF16, 1, 6, 4, 64, 4, "n_heads = 6"}, Bad{KvFormat::BF16, 1, 65536, 1, 64, 4, "n_heads = 65536"},
        Bad{KvFormat::INT4, 1, 8, 4, 64, 0, "max_pages_per_seq = 0"},
        Bad{KvFormat::INT4, 1, 8, 4, 64, (1 << 24) + 1, "max_pages_per_seq = 16777217"}}) {
    std::string why;
    EXPECT_EQ(cuda::attention_generic_can_implement(b.f, b.batch, b.n_heads, b.n_kv, b.hd, b.max_pages, &why),
              cudaErrorInvalidValue)
        << b.needle;
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' lacks '" << b.needle << "'";
    // The launcher refuses before touching the device (null pointers are never dereferenced).
    EXPECT_EQ(cuda::attention_decode_generic(b.f, nullptr, nullptr, nullptr, nullptr, nullptr, b.batch, b.n_heads,
                                             b.n_kv, b.hd, b.max_pages, nullptr),
              cudaErrorInvalidValue);
    EXPECT_NE(std::string(cuda::attention_generic_last_error()).find(b.needle), std::string::npos)
        << cuda::attention_generic_last_error();
  }
  // Valid shapes with null pointers: refused, naming the pointers.
  EXPECT_EQ(cuda::attention_decode_generic(KvFormat::BF16, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 4, 8, 1,
                                           nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_generic_last_error()).find("non-null"), std::string::npos);
}

}  // namespace
