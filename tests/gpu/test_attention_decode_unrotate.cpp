// attention_decode_int4_unrotated (include/futransformer/cuda/attention_decode.h): the decode attention over an
// int4-hadamard cache with the output's un-rotation in the kernel that finishes each head (the combine kernel of a
// split plan, the decode kernel itself of an unsplit one). Bit for bit against two oracles on the
// same inputs: attention_decode_int4 followed by the in-place rotate_heads_bf16 (what the engine ran before), and
// the CPU twin of the un-rotation applied to attention_decode_int4's output (each head widened to fp32,
// formats::hadamard_blocks, rounded once to BF16: single IEEE operations, so exact). Split and unsplit plans must
// both report *unrotated = true. Whether the plan splits (and how many warps its CTAs have) comes from the heuristics
// with this device's limits, and each case list asserts the branch it is meant to cover. Outputs are NaN-poisoned before every launch; caches and queries
// are fresh seeded random values (tests/paged_kv_case.h). Host-only: the rejections of bad blocks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_decode_plan_knobs.h"
#include "cuda/attention_decode_heuristics.h"
#include "cuda/engine/engine_kernels.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/hadamard.h"
#include "gpu_test_util.h"
#include "paged_kv_case.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;
using test::PagedKvCase;
namespace attn = futransformer::cuda::attn;

struct Uploaded {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<int32_t> block_table, seq_lens;
  DeviceBuffer<uint16_t> q, out;
  size_t ws_bytes;  // 0 for unsplit plans
  DeviceBuffer<unsigned char> ws;
  explicit Uploaded(const PagedKvCase& c)
      : pool(c.pool),
        block_table(c.block_table),
        seq_lens(c.seq_lens),
        q(c.q_bf16),
        out(static_cast<size_t>(c.batch) * c.n_heads * c.head_dim),
        ws_bytes(cuda::attention_decode_workspace_bytes(c.format, c.batch, c.n_heads, c.n_kv_heads, c.head_dim,
                                                        c.max_pages, c.max_seq_len)),
        ws(ws_bytes) {}
  const __nv_bfloat16* q_bf() const { return reinterpret_cast<const __nv_bfloat16*>(q.p); }
  __nv_bfloat16* out_bf() const { return reinterpret_cast<__nv_bfloat16*>(out.p); }
};

// attention_decode_int4 into the poisoned output, then (rotate_block > 1) rotate_heads_bf16 in place.
std::vector<uint16_t> run_separate(const PagedKvCase& c, Uploaded& u, int rotate_block) {
  EXPECT_EQ(u.out.poison(), cudaSuccess);
  const cudaError_t e =
      cuda::attention_decode_int4(u.q_bf(), u.pool.p, u.block_table.p, u.seq_lens.p, u.out_bf(), c.batch, c.n_heads,
                                  c.n_kv_heads, c.head_dim, c.max_pages, c.max_seq_len, u.ws.p, u.ws_bytes, nullptr);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_decode_last_error();
  if (rotate_block > 1) {
    EXPECT_EQ(cuda::rotate_heads_bf16(u.out_bf(), c.n_heads * c.head_dim, u.out_bf(), c.batch, c.n_heads, c.head_dim,
                                      rotate_block, nullptr),
              cudaSuccess);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return u.out.download();
}

// attention_decode_int4_unrotated into the poisoned output.
std::vector<uint16_t> run_fused(const PagedKvCase& c, Uploaded& u, int block, bool* unrotated) {
  EXPECT_EQ(u.out.poison(), cudaSuccess);
  *unrotated = false;
  const cudaError_t e = cuda::attention_decode_int4_unrotated(
      u.q_bf(), u.pool.p, u.block_table.p, u.seq_lens.p, u.out_bf(), c.batch, c.n_heads, c.n_kv_heads, c.head_dim,
      c.max_pages, c.max_seq_len, block, u.ws.p, u.ws_bytes, nullptr, unrotated);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_decode_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return u.out.download();
}

// The CPU twin of the un-rotation: bf16(H_block · float(head)) for every head.
std::vector<uint16_t> twin_unrotate(const std::vector<uint16_t>& out, int head_dim, int block) {
  std::vector<uint16_t> r(out.size());
  std::vector<float> v(static_cast<size_t>(head_dim));
  for (size_t h = 0; h < out.size() / static_cast<size_t>(head_dim); ++h) {
    for (int j = 0; j < head_dim; ++j) v[static_cast<size_t>(j)] = bf16_to_f32(out[h * head_dim + j]);
    formats::hadamard_blocks(v.data(), head_dim, block);
    for (int j = 0; j < head_dim; ++j) r[h * head_dim + j] = f32_to_bf16(v[static_cast<size_t>(j)]);
  }
  return r;
}

// Index of the first element where a and b differ (a.size() if none).
size_t first_difference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  size_t i = 0;
  while (i < a.size() && a[i] == b[i]) ++i;
  return i;
}

// Every power-of-two block 2 .. head_dim on one case. expect_split: the case list's intent, checked against the
// plan so that both branches are known to be covered on this device; expect_warps (0: any) likewise for the CTA size.
void check_case(int head_dim, int n_heads, int n_kv, const std::vector<int32_t>& lens, bool expect_split,
                uint32_t seed, int expect_warps = 0) {
  const PagedKvCase c = test::make_paged_kv_case(KvFormat::INT4_HADAMARD, head_dim, n_heads, n_kv, lens, seed);
  const attn::Plan plan = attn::choose_plan(true, head_dim, c.batch, n_kv, c.max_seq_len, test::this_device_limits());
  SCOPED_TRACE(testing::Message() << "head_dim " << head_dim << " heads " << n_heads << "/" << n_kv << " batch "
                                  << c.batch << " max_seq_len " << c.max_seq_len << " splits " << plan.splits
                                  << " seed " << seed);
  ASSERT_EQ(plan.splits > 1, expect_split) << "the case no longer covers the branch it was chosen for";
  if (expect_warps > 0) ASSERT_EQ(plan.warps, expect_warps) << "the case no longer covers the CTA size it was chosen for";
  ASSERT_EQ(c.format, KvFormat::INT4_HADAMARD);
  Uploaded u(c);
  const std::vector<uint16_t> plain = run_separate(c, u, 1);
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_FALSE(std::isnan(bf16_to_f32(plain[i]))) << "attention_decode_int4 left output " << i << " unwritten";
  }
  for (int block = 2; block <= head_dim; block *= 2) {
    SCOPED_TRACE(testing::Message() << "unrotate_block " << block);
    bool unrotated = false;
    const std::vector<uint16_t> fused = run_fused(c, u, block, &unrotated);
    ASSERT_EQ(fused.size(), plain.size());
    EXPECT_TRUE(unrotated);
    const std::vector<uint16_t> separate = run_separate(c, u, block), twin = twin_unrotate(plain, head_dim, block);
    ASSERT_NE(first_difference(twin, plain), plain.size()) << "the un-rotation changed nothing: the test is blind";
    size_t i = first_difference(separate, twin);
    ASSERT_EQ(i, twin.size()) << "rotate_heads_bf16 disagrees with its CPU twin at " << i;
    i = first_difference(fused, separate);
    EXPECT_EQ(i, fused.size()) << "output " << i << " (head " << i / head_dim << ", channel " << i % head_dim
                               << "): fused " << fused[i] << ", separate " << separate[i];
  }
}

// Split plans: one long sequence, and a batch mixing long and short ones (splits without tokens in the short one).
const std::vector<std::vector<int32_t>> kSplitLens = {{1000}, {3000}, {1000, 40, 3000}};
// Unsplit plans: short contexts.
const std::vector<std::vector<int32_t>> kUnsplitLens = {{40}, {40, 17, 1}};

TEST(AttentionDecodeUnrotateGpu, BitExactAgainstSeparateUnrotation) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 700;
  for (int head_dim : {64, 128}) {
    for (int G : {1, 4, 8}) {
      for (const std::vector<int32_t>& lens : kSplitLens) check_case(head_dim, 2 * G, 2, lens, true, ++seed);
      for (const std::vector<int32_t>& lens : kUnsplitLens) check_case(head_dim, 2 * G, 2, lens, false, ++seed);
    }
  }
}

TEST(AttentionDecodeUnrotateGpu, LlamaShapes) {
  FT_REQUIRE_CUDA_DEVICE();
  check_case(128, 32, 8, {1024}, true, 801);             // Llama-3.1-8B, batch 1: the decode-step bench's context
  check_case(128, 32, 8, {1024, 700, 1024, 1}, true, 802);  // batch 4
  check_case(128, 64, 8, {1000}, true, 803);             // 70B's 8 query heads per KV head
  // Unsplit 8-warp CTAs (two heads a round): the 8B step at batch 32 and context 1024, and 70B's 8 heads per KV head
  // (four rounds) at batch 32.
  check_case(128, 32, 8, std::vector<int32_t>(32, 1024), false, 804, 8);
  check_case(128, 64, 8, std::vector<int32_t>(32, 300), false, 805, 8);
}

// Blocks 0 and 1 mean no un-rotation: the plain output even when the plan splits.
TEST(AttentionDecodeUnrotateGpu, BlockOneLeavesTheOutput) {
  FT_REQUIRE_CUDA_DEVICE();
  const PagedKvCase c = test::make_paged_kv_case(KvFormat::INT4_HADAMARD, 128, 8, 2, {3000}, 901);
  Uploaded u(c);
  ASSERT_GT(u.ws_bytes, 0u) << "a 3000-token sequence on 2 KV heads should split";
  const std::vector<uint16_t> plain = run_separate(c, u, 1);
  for (int block : {0, 1}) {
    bool unrotated = true;
    EXPECT_EQ(run_fused(c, u, block, &unrotated), plain) << "block " << block;
    EXPECT_FALSE(unrotated) << "block " << block;
  }
}

// --- Host-only: bad blocks are refused before anything touches the device. ---

TEST(AttentionDecodeUnrotateHost, RejectsBadBlocks) {
  struct Bad {
    int head_dim, block;
    const char* needle;
  };
  for (const Bad& b : {Bad{128, 3, "unrotate_block = 3"}, Bad{128, 256, "unrotate_block = 256"},
                       Bad{64, 128, "unrotate_block = 128"}, Bad{128, 96, "unrotate_block = 96"},
                       Bad{128, -2, "unrotate_block = -2"}, Bad{96, 32, "head_dim = 96"}}) {
    bool unrotated = true;
    EXPECT_EQ(cuda::attention_decode_int4_unrotated(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 32, 8, b.head_dim,
                                                    4, 100, b.block, nullptr, 0, nullptr, &unrotated),
              cudaErrorInvalidValue);
    const std::string why = cuda::attention_decode_last_error();
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' lacks '" << b.needle << "'";
    EXPECT_FALSE(unrotated) << "block " << b.block;
  }
  // Good blocks pass the block check and meet the null pointers next.
  for (int block : {0, 1, 2, 32, 64, 128}) {
    bool unrotated = true;
    EXPECT_EQ(cuda::attention_decode_int4_unrotated(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 32, 8, 128, 4, 100,
                                                    block, nullptr, 0, nullptr, &unrotated),
              cudaErrorInvalidValue);
    const std::string why = cuda::attention_decode_last_error();
    EXPECT_EQ(why.find("unrotate_block"), std::string::npos) << why;
    EXPECT_NE(why.find("non-null"), std::string::npos) << why;
    EXPECT_FALSE(unrotated);
  }
  EXPECT_EQ(cuda::attention_decode_int4_unrotated(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 32, 8, 128, 4, 100,
                                                  128, nullptr, 0, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("unrotated must be non-null"), std::string::npos);
}

}  // namespace
