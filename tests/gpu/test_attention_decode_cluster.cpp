// The decode attention's cluster combine (attention_decode_kernel's kCl instances; attn::set_cluster_combine_splits):
// a split plan's CTAs merge their partials inside their thread-block cluster instead of through global memory and
// attention_decode_combine_kernel. It must give the combine kernel's bits, and those are checked against the CPU twin
// by test_attention_decode.cpp / test_attention_decode_unrotate.cpp; here each case runs both paths on the same fresh
// random cache and compares them bit for bit. The workspace (the combine kernel's partials) is NaN-poisoned before the
// cluster run and must come back untouched: proof that the cluster path ran, not the kernel one. Outputs are
// NaN-poisoned before every launch. Host-only: the knob's clamping and the plan's description.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_decode_plan_knobs.h"
#include "cuda/attention_decode_heuristics.h"
#include "cuda/attention_decode_layout.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/dtype.h"
#include "gpu_test_util.h"
#include "paged_kv_case.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;
using test::PagedKvCase;
using test::PlanKnobs;
namespace attn = futransformer::cuda::attn;

// Which public launcher a case goes through.
enum class Entry { kPlain, kUnrotated };

struct Result {
  std::vector<uint16_t> out;
  std::vector<uint32_t> ws;  // the workspace's words after the launch
  bool unrotated = false;
};

// One launch of the case with the cluster combine allowed up to `cluster_splits` splits (0: the combine kernel).
// The workspace is poisoned with NaN words before it.
Result run(const PagedKvCase& c, Entry entry, int unrotate_block, int cluster_splits) {
  attn::set_cluster_combine_splits(cluster_splits);
  DeviceBuffer<uint8_t> pool(c.pool);
  DeviceBuffer<int32_t> block_table(c.block_table), seq_lens(c.seq_lens);
  DeviceBuffer<uint16_t> q(c.q_bf16), out(static_cast<size_t>(c.batch) * c.n_heads * c.head_dim);
  const size_t ws_bytes = cuda::attention_decode_workspace_bytes(c.format, c.batch, c.n_heads, c.n_kv_heads, c.head_dim,
                                                                 c.max_pages, c.max_seq_len);
  EXPECT_GT(ws_bytes, 0u) << "every case here splits";
  DeviceBuffer<uint32_t> ws((ws_bytes + 3) / 4);
  EXPECT_EQ(out.poison(), cudaSuccess);
  EXPECT_EQ(ws.poison(), cudaSuccess);
  auto* qb = reinterpret_cast<const __nv_bfloat16*>(q.p);
  auto* ob = reinterpret_cast<__nv_bfloat16*>(out.p);
  Result r;
  cudaError_t e;
  if (entry == Entry::kUnrotated) {
    e = cuda::attention_decode_int4_unrotated(qb, pool.p, block_table.p, seq_lens.p, ob, c.batch, c.n_heads,
                                              c.n_kv_heads, c.head_dim, c.max_pages, c.max_seq_len, unrotate_block,
                                              ws.p, ws_bytes, nullptr, &r.unrotated);
  } else if (c.format == KvFormat::BF16) {
    e = cuda::attention_decode_bf16(qb, pool.p, block_table.p, seq_lens.p, ob, c.batch, c.n_heads, c.n_kv_heads,
                                    c.head_dim, c.max_pages, c.max_seq_len, ws.p, ws_bytes, nullptr);
  } else {
    e = cuda::attention_decode_int4(qb, pool.p, block_table.p, seq_lens.p, ob, c.batch, c.n_heads, c.n_kv_heads,
                                    c.head_dim, c.max_pages, c.max_seq_len, ws.p, ws_bytes, nullptr);
  }
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_decode_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  r.out = out.download();
  r.ws = ws.download();
  return r;
}

size_t first_difference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

bool all_poisoned(const std::vector<uint32_t>& words) {
  for (uint32_t w : words)
    if (w != 0xFFFFFFFFu) return false;
  return true;
}

// One case, forced to `splits` splits (and `warps` warps where the instance has a choice): the cluster path against
// the combine kernel, bit for bit.
void check_case(KvFormat format, Entry entry, int head_dim, int n_heads, int n_kv, const std::vector<int32_t>& lens,
                int splits, int warps, int unrotate_block, uint32_t seed) {
  const PlanKnobs restore;
  attn::set_forced_splits(splits);
  attn::set_forced_warps(warps);
  const PagedKvCase c = test::make_paged_kv_case(format, head_dim, n_heads, n_kv, lens, seed);
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " head_dim " << head_dim << " heads "
                                  << n_heads << "/" << n_kv << " batch " << c.batch << " max_seq_len "
                                  << c.max_seq_len << " splits " << splits << " warps " << warps << " unrotate_block "
                                  << unrotate_block << " seed " << seed);
  ASSERT_EQ(attn::choose_plan(format != KvFormat::BF16, head_dim, c.batch, n_kv, c.max_seq_len,
                              test::this_device_limits())
                .splits,
            splits)
      << "the forced split count did not apply";
  const Result kernel = run(c, entry, unrotate_block, 0);
  const Result cluster = run(c, entry, unrotate_block, attn::kMaxClusterCombineSplits);
  ASSERT_EQ(kernel.out.size(), cluster.out.size());
  for (size_t i = 0; i < kernel.out.size(); ++i)
    ASSERT_FALSE(std::isnan(bf16_to_f32(kernel.out[i]))) << "the combine kernel left output " << i << " unwritten";
  ASSERT_FALSE(all_poisoned(kernel.ws)) << "the combine-kernel run wrote no partials: the test is blind";
  EXPECT_TRUE(all_poisoned(cluster.ws)) << "the cluster run wrote partials to the workspace: it did not combine in "
                                           "the cluster";
  EXPECT_EQ(kernel.unrotated, cluster.unrotated);
  if (entry == Entry::kUnrotated) EXPECT_EQ(cluster.unrotated, unrotate_block > 1);
  const size_t i = first_difference(cluster.out, kernel.out);
  EXPECT_EQ(i, cluster.out.size()) << "output " << i << " (head " << i / head_dim << ", channel " << i % head_dim
                                   << "): cluster " << cluster.out[i] << ", combine kernel " << kernel.out[i];
}

TEST(AttentionDecodeClusterGpu, BitExactAgainstTheCombineKernel) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 1200;
  // Splits 2..8 (portable cluster sizes), 16 (non-portable) and an odd count; G = 1, 4, 8; a batch whose short
  // sequence leaves splits without tokens.
  const std::vector<std::vector<int32_t>> lens_list = {{1000}, {1000, 40, 3000}};
  for (KvFormat format : {KvFormat::INT4, KvFormat::BF16}) {
    for (int head_dim : {64, 128}) {
      for (int G : {1, 4, 8}) {
        for (int splits : {2, 3, 8, 16}) {
          for (const std::vector<int32_t>& lens : lens_list)
            check_case(format, Entry::kPlain, head_dim, 2 * G, 2, lens, splits, 0, 0, ++seed);
        }
      }
    }
  }
}

TEST(AttentionDecodeClusterGpu, EightWarpInstances) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 1300;
  for (int warps : {4, 8}) {
    for (int splits : {2, 4, 8, 16}) {
      check_case(KvFormat::INT4, Entry::kPlain, 128, 32, 8, {1024, 700, 1024, 1}, splits, warps, 0, ++seed);
      check_case(KvFormat::INT4_HADAMARD, Entry::kUnrotated, 128, 32, 8, {1024}, splits, warps, 128, ++seed);
    }
  }
}

TEST(AttentionDecodeClusterGpu, UnrotationInTheCluster) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 1400;
  for (int head_dim : {64, 128}) {
    for (int G : {1, 4, 8}) {
      for (int splits : {2, 5, 8}) {
        for (int block = 1; block <= head_dim; block *= 4)
          check_case(KvFormat::INT4_HADAMARD, Entry::kUnrotated, head_dim, 2 * G, 2, {3000}, splits, 0, block, ++seed);
        check_case(KvFormat::INT4_HADAMARD, Entry::kUnrotated, head_dim, 2 * G, 2, {3000}, splits, 0, head_dim,
                   ++seed);
      }
    }
  }
}

TEST(AttentionDecodeClusterGpu, LlamaShapes) {
  FT_REQUIRE_HOPPER();
  // The decode-step bench's context with the plan's own split count (batch 1 and 8), 70B's 8 heads per KV head.
  const PlanKnobs restore;
  for (const auto& lens : {std::vector<int32_t>{1024}, std::vector<int32_t>(8, 1024)}) {
    const PagedKvCase c = test::make_paged_kv_case(KvFormat::INT4_HADAMARD, 128, 32, 8, lens, 1501);
    const Result kernel = run(c, Entry::kUnrotated, 128, 0);
    const Result cluster = run(c, Entry::kUnrotated, 128, attn::kMaxClusterCombineSplits);
    EXPECT_EQ(first_difference(cluster.out, kernel.out), cluster.out.size()) << "batch " << lens.size();
    EXPECT_TRUE(all_poisoned(cluster.ws)) << "batch " << lens.size();
  }
  check_case(KvFormat::INT4_HADAMARD, Entry::kUnrotated, 128, 64, 8, {1000}, 8, 0, 128, 1502);
}

// --- Host-only ---

TEST(AttentionDecodeClusterHost, KnobClampsAndSelects) {
  const PlanKnobs restore;
  attn::set_cluster_combine_splits(8);
  EXPECT_EQ(attn::cluster_combine_splits(), 8);
  EXPECT_FALSE(attn::combines_in_cluster(1)) << "one split has nothing to combine";
  EXPECT_TRUE(attn::combines_in_cluster(2));
  EXPECT_TRUE(attn::combines_in_cluster(8));
  EXPECT_FALSE(attn::combines_in_cluster(9));
  attn::set_cluster_combine_splits(1000);
  EXPECT_EQ(attn::cluster_combine_splits(), attn::kMaxClusterCombineSplits);
  EXPECT_TRUE(attn::combines_in_cluster(attn::kMaxClusterCombineSplits));
  EXPECT_FALSE(attn::combines_in_cluster(attn::kMaxClusterCombineSplits + 1));
  attn::set_cluster_combine_splits(-3);
  EXPECT_EQ(attn::cluster_combine_splits(), 0);
  EXPECT_FALSE(attn::combines_in_cluster(2));
}

TEST(AttentionDecodeClusterHost, PlanDescriptionNamesTheCombine) {
  const PlanKnobs restore;
  const attn::DeviceLimits d;
  attn::set_forced_splits(4);
  const attn::Plan plan = attn::choose_plan(true, 128, 1, 8, 1024, d);
  ASSERT_EQ(plan.splits, 4);
  attn::set_cluster_combine_splits(8);
  EXPECT_NE(attn::describe_plan(plan, true, 128, 1, 32, 8, 1024, d).find("combine=cluster"), std::string::npos);
  attn::set_cluster_combine_splits(0);
  EXPECT_NE(attn::describe_plan(plan, true, 128, 1, 32, 8, 1024, d).find("combine=kernel"), std::string::npos);
  attn::set_forced_splits(1);
  const attn::Plan one = attn::choose_plan(true, 128, 1, 8, 1024, d);
  EXPECT_NE(attn::describe_plan(one, true, 128, 1, 32, 8, 1024, d).find("combine=none"), std::string::npos);
}

}  // namespace
