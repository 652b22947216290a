// GPU tests of the paged decode attention (INT4 / INT4-Hadamard / BF16 caches) against its CPU twin
// (ref::paged_decode_attention on the decoded cache), plus host-only checks of the shape contract and the
// split heuristic. Device tests report SKIPPED without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention_decode_plan_knobs.h"
#include "cuda/attention_decode_heuristics.h"
#include "cuda/attention_decode_layout.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/dtype.h"
#include "paged_kv_case.h"
#include "gpu_test_util.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::PagedKvCase;
using test::PlanKnobs;
namespace attn = futransformer::cuda::attn;

using test::DeviceBuffer;

struct Uploaded {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<int32_t> block_table, seq_lens;
  DeviceBuffer<uint16_t> q;
  explicit Uploaded(const PagedKvCase& c)
      : pool(c.pool), block_table(c.block_table), seq_lens(c.seq_lens), q(c.q_bf16) {}
};

cudaError_t launch(const PagedKvCase& c, const Uploaded& u, uint16_t* out, void* ws, size_t ws_bytes) {
  auto* q = reinterpret_cast<const __nv_bfloat16*>(u.q.p);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  if (c.format == KvFormat::BF16) {
    return cuda::attention_decode_bf16(q, u.pool.p, u.block_table.p, u.seq_lens.p, o, c.batch, c.n_heads, c.n_kv_heads,
                                       c.head_dim, c.max_pages, c.max_seq_len, ws, ws_bytes, nullptr);
  }
  return cuda::attention_decode_int4(q, u.pool.p, u.block_table.p, u.seq_lens.p, o, c.batch, c.n_heads, c.n_kv_heads,
                                     c.head_dim, c.max_pages, c.max_seq_len, ws, ws_bytes, nullptr);
}

// Runs the kernel into a NaN-poisoned output; returns the output bits.
std::vector<uint16_t> run(const PagedKvCase& c) {
  const Uploaded u(c);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(c.batch) * c.n_heads * c.head_dim);
  EXPECT_EQ(out.poison(), cudaSuccess);
  const size_t ws_bytes = cuda::attention_decode_workspace_bytes(c.format, c.batch, c.n_heads, c.n_kv_heads, c.head_dim,
                                                                 c.max_pages, c.max_seq_len);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  const cudaError_t e = launch(c, u, out.p, ws.p, ws_bytes);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_decode_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.download();
}

void check_against_twin(KvFormat format, int head_dim, int n_heads, int n_kv, const std::vector<int32_t>& lens,
                        uint32_t seed) {
  const PagedKvCase c = test::make_paged_kv_case(format, head_dim, n_heads, n_kv, lens, seed);
  const attn::Plan plan = attn::choose_plan(format != KvFormat::BF16, head_dim, c.batch, n_kv, c.max_seq_len, {});
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " head_dim " << head_dim << " heads " << n_heads
                                  << "/" << n_kv << " batch " << c.batch << " max_seq_len " << c.max_seq_len
                                  << " splits (H200 plan) " << plan.splits << " seed " << seed);
  std::vector<float> abs_ref;
  const std::vector<float> ref = ref::paged_decode_attention(c.cache(), c.seq_lens, c.q, n_heads, &abs_ref);
  const std::vector<uint16_t> got = run(c);
  ASSERT_EQ(got.size(), ref.size());
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double v = bf16_to_f32(got[i]);
    const size_t seq = i / (static_cast<size_t>(n_heads) * head_dim);
    ASSERT_FALSE(std::isnan(v)) << "output " << i << " (sequence " << seq << ", head " << i / head_dim % n_heads
                                << ") not written";
    const double bound = test::kAttnOutputRel * std::fabs(ref[i]) + test::kAttnProbRel * abs_ref[i];
    ASSERT_LE(std::fabs(v - ref[i]), bound)
        << "sequence " << seq << " (length " << c.seq_lens[seq] << ") head " << i / head_dim % n_heads << " channel "
        << i % head_dim << ": got " << v << ", ref " << ref[i];
    err2 += (v - ref[i]) * (v - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), test::kAttnRelL2);
}

const std::vector<int32_t> kLens = {1, 17, 64, 1000, 4097, 32768};
// batch sequences with lengths cycling through kLens, starting at `offset`.
std::vector<int32_t> lens_for(int batch, int offset) {
  std::vector<int32_t> l(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) l[static_cast<size_t>(i)] = kLens[static_cast<size_t>(i + offset) % kLens.size()];
  return l;
}

TEST(AttentionDecodeGpu, Int4EveryBatchLengthGqaAndHeadDim) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 100;
  for (int head_dim : {128, 64}) {
    for (int G : {1, 4, 8}) {
      for (int batch : {1, 3, 8}) {
        for (int offset = 0; offset < static_cast<int>(kLens.size()); offset += batch) {
          check_against_twin(KvFormat::INT4, head_dim, 2 * G, 2, lens_for(batch, offset), ++seed);
        }
      }
    }
  }
}

TEST(AttentionDecodeGpu, Int4Batch32LlamaShape) {
  FT_REQUIRE_CUDA_DEVICE();
  check_against_twin(KvFormat::INT4, 128, 32, 8, lens_for(32, 0), 201);
}

TEST(AttentionDecodeGpu, Int4HadamardReadsTheSameBytes) {
  FT_REQUIRE_CUDA_DEVICE();
  check_against_twin(KvFormat::INT4_HADAMARD, 128, 32, 8, lens_for(8, 0), 301);
  check_against_twin(KvFormat::INT4_HADAMARD, 64, 8, 2, lens_for(3, 3), 302);
  check_against_twin(KvFormat::INT4_HADAMARD, 128, 4, 4, {32768}, 303);
}

TEST(AttentionDecodeGpu, Bf16CacheEveryBatchLengthGqaAndHeadDim) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 400;
  for (int head_dim : {128, 64}) {
    for (int G : {1, 4, 8}) {
      for (int batch : {1, 3, 8}) {
        for (int offset = 0; offset < static_cast<int>(kLens.size()); offset += 2 * batch) {
          check_against_twin(KvFormat::BF16, head_dim, 2 * G, 2, lens_for(batch, offset), ++seed);
        }
      }
    }
  }
  check_against_twin(KvFormat::BF16, 128, 32, 8, lens_for(32, 0), ++seed);
}

TEST(AttentionDecodeGpu, DeterministicAcrossRuns) {
  FT_REQUIRE_CUDA_DEVICE();
  for (KvFormat f : {KvFormat::INT4, KvFormat::BF16}) {
    for (const std::vector<int32_t>& lens : {std::vector<int32_t>{32768}, std::vector<int32_t>{1000, 17, 4097}}) {
      const PagedKvCase c = test::make_paged_kv_case(f, 128, 32, 8, lens, 501);
      EXPECT_EQ(run(c), run(c)) << formats::kv_format_name(f) << " batch " << lens.size();
    }
  }
}

// Every split count bench_attention_decode --sweep-splits may force computes the same attention, in the workspace
// attention_decode_workspace_bytes asks for under that count (check_against_twin sizes it so; a short one is
// refused by the launcher and fails the case).
TEST(AttentionDecodeGpu, ForcedSplitsMatchTheTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  const PlanKnobs knobs;
  uint32_t seed = 700;
  for (int forced : {1, 2, 3, 5, 7, 16, attn::kMaxSplits}) {
    attn::set_forced_splits(forced);
    SCOPED_TRACE(testing::Message() << "forced splits " << forced);
    check_against_twin(KvFormat::INT4, 128, 32, 8, {1000, 17, 4097}, ++seed);
    check_against_twin(KvFormat::BF16, 64, 8, 2, {4097, 1}, ++seed);
  }
}

// 8-warp CTAs (INT4 caches at head_dim 128): the same attention as the twin, under the split plans and forced counts
// (the merge then adds 8 warps' partial sums, so it is checked against the twin, not the 4-warp bits).
TEST(AttentionDecodeGpu, EightWarpCtasMatchTheTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  const PlanKnobs knobs;
  attn::set_forced_warps(8);
  uint32_t seed = 900;
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    check_against_twin(f, 128, 32, 8, lens_for(32, 0), ++seed);  // batch 32: the unsplit plan
    check_against_twin(f, 128, 32, 8, {1024}, ++seed);            // batch 1: a split plan
    check_against_twin(f, 128, 16, 2, lens_for(8, 1), ++seed);
    check_against_twin(f, 128, 8, 8, {1, 17, 64, 65, 3000}, ++seed);  // G = 1; fewer tiles than warps
  }
  for (int forced : {1, 3, 16}) {
    attn::set_forced_splits(forced);
    SCOPED_TRACE(testing::Message() << "forced splits " << forced);
    check_against_twin(KvFormat::INT4, 128, 64, 8, {1000, 17, 4097}, ++seed);  // G = 8
  }
}

// Formats and head_dims without 8-warp instances keep 4 whatever is forced; the plan's shared memory follows.
TEST(AttentionDecodeHost, EightWarpsOnlyWhereInstancesExist) {
  const PlanKnobs knobs;
  const attn::DeviceLimits h200;
  attn::set_forced_warps(8);
  EXPECT_EQ(attn::choose_plan(true, 128, 32, 8, 1024, h200).warps, 8);
  EXPECT_EQ(attn::choose_plan(true, 64, 32, 8, 1024, h200).warps, attn::kWarps);
  EXPECT_EQ(attn::choose_plan(false, 128, 32, 8, 1024, h200).warps, attn::kWarps);
  const attn::Plan p8 = attn::choose_plan(true, 128, 32, 8, 1024, h200);
  EXPECT_EQ(p8.smem_bytes, attn::smem_bytes_for(true, 128, 8));
  EXPECT_EQ(p8.ctas_per_sm, 2) << attn::describe_plan(p8, true, 128, 32, 32, 8, 1024, h200);
  attn::set_forced_warps(4);
  EXPECT_EQ(attn::choose_plan(true, 128, 32, 8, 1024, h200).warps, 4);
}

// A forced count larger than the model's: the workspace query follows it, and the model-sized workspace is refused.
TEST(AttentionDecodeGpu, ForcedSplitsWorkspaceAgreesWithTheLaunch) {
  FT_REQUIRE_CUDA_DEVICE();
  const PlanKnobs knobs;
  const PagedKvCase c = test::make_paged_kv_case(KvFormat::INT4, 128, 32, 8, {32768}, 801);
  const Uploaded u(c);
  attn::set_forced_splits(0);
  const size_t model_ws = cuda::attention_decode_workspace_bytes(KvFormat::INT4, 1, 32, 8, 128, c.max_pages, 32768);
  attn::set_forced_splits(attn::kMaxSplits);
  const size_t forced_ws = cuda::attention_decode_workspace_bytes(KvFormat::INT4, 1, 32, 8, 128, c.max_pages, 32768);
  EXPECT_EQ(forced_ws, size_t{32} * attn::kMaxSplits * (128 + 1) * 4);
  ASSERT_LT(model_ws, forced_ws) << "the model already picks " << attn::kMaxSplits << " splits here";
  DeviceBuffer<uint16_t> out(static_cast<size_t>(c.n_heads) * c.head_dim);
  DeviceBuffer<unsigned char> ws(forced_ws);
  EXPECT_EQ(launch(c, u, out.p, ws.p, model_ws), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("workspace"), std::string::npos);
  EXPECT_EQ(launch(c, u, out.p, ws.p, forced_ws), cudaSuccess) << cuda::attention_decode_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(AttentionDecodeGpu, RejectedCallsLeaveTheOutputUntouched) {
  FT_REQUIRE_CUDA_DEVICE();
  const PagedKvCase c = test::make_paged_kv_case(KvFormat::INT4, 128, 32, 8, {32768}, 601);
  const Uploaded u(c);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(c.n_heads) * c.head_dim);
  ASSERT_EQ(out.poison(), cudaSuccess);
  const size_t ws_bytes = cuda::attention_decode_workspace_bytes(KvFormat::INT4, 1, 32, 8, 128, c.max_pages, 32768);
  ASSERT_GT(ws_bytes, 0u) << "one 32k sequence should be split across the SMs";
  DeviceBuffer<unsigned char> ws(ws_bytes);
  auto* q = reinterpret_cast<const __nv_bfloat16*>(u.q.p);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out.p);
  auto call = [&](int n_heads, int n_kv, int hd, int max_len, size_t wsb) {
    return cuda::attention_decode_int4(q, u.pool.p, u.block_table.p, u.seq_lens.p, o, 1, n_heads, n_kv, hd, c.max_pages,
                                       max_len, ws.p, wsb, nullptr);
  };
  EXPECT_EQ(call(32, 8, 96, 32768, ws_bytes), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("head_dim = 96"), std::string::npos);
  EXPECT_EQ(call(72, 8, 128, 32768, ws_bytes), cudaErrorInvalidValue);  // 9 query heads per KV head
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("n_heads = 72"), std::string::npos);
  EXPECT_EQ(call(32, 8, 128, c.max_pages * 64 + 1, ws_bytes), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("max_seq_len"), std::string::npos);
  EXPECT_EQ(call(32, 8, 128, 32768, ws_bytes - 16), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("workspace"), std::string::npos);
  auto* q_off = reinterpret_cast<const __nv_bfloat16*>(u.q.p + 1);
  EXPECT_EQ(cuda::attention_decode_int4(q_off, u.pool.p, u.block_table.p, u.seq_lens.p, o, 1, 32, 8, 128, c.max_pages,
                                        32768, ws.p, ws_bytes, nullptr),
            cudaErrorInvalidValue);  // q not 16-byte aligned
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("aligned"), std::string::npos);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : out.download()) ASSERT_EQ(v, 0xFFFF);
}

// --- Host-only: the shape contract and the heuristics (no device needed). ---

TEST(AttentionDecodeHost, CanImplementNamesTheProblem) {
  std::string why;
  EXPECT_EQ(cuda::attention_decode_can_implement(KvFormat::INT4, 32, 32, 8, 128, 512, 32768, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::attention_decode_can_implement(KvFormat::INT4_HADAMARD, 1, 8, 8, 64, 1, 1, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::attention_decode_can_implement(KvFormat::BF16, 3, 64, 8, 128, 3, 129, &why), cudaSuccess) << why;
  struct Bad {
    KvFormat f;
    int batch, n_heads, n_kv, hd, max_pages, max_len;
    const char* needle;
  };
  for (const Bad& b :
       {Bad{KvFormat::FP8, 1, 32, 8, 128, 4, 100, "fp8"}, Bad{KvFormat::INT4, 1, 32, 8, 96, 4, 100, "head_dim = 96"},
        Bad{KvFormat::INT4, 0, 32, 8, 128, 4, 100, "batch = 0"},
        Bad{KvFormat::INT4, 70000, 32, 8, 128, 4, 100, "batch = 70000"},
        Bad{KvFormat::INT4, 1, 30, 8, 128, 4, 100, "n_heads = 30"},
        Bad{KvFormat::INT4, 1, 16, 1, 128, 4, 100, "n_heads = 16"},
        Bad{KvFormat::BF16, 1, 32, 0, 128, 4, 100, "n_kv_heads = 0"},
        Bad{KvFormat::INT4, 1, 32, 8, 128, 0, 100, "max_pages_per_seq = 0"},
        Bad{KvFormat::INT4, 1, 32, 8, 128, 4, 257, "max_seq_len = 257"},
        Bad{KvFormat::INT4, 1, 32, 8, 128, 4, 0, "max_seq_len = 0"}}) {
    EXPECT_EQ(cuda::attention_decode_can_implement(b.f, b.batch, b.n_heads, b.n_kv, b.hd, b.max_pages, b.max_len, &why),
              cudaErrorInvalidValue);
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' lacks '" << b.needle << "'";
    // The launchers refuse before touching the device (null pointers are never dereferenced).
    const auto launcher = b.f == KvFormat::BF16 ? cuda::attention_decode_bf16 : cuda::attention_decode_int4;
    if (b.f != KvFormat::FP8) {
      EXPECT_EQ(launcher(nullptr, nullptr, nullptr, nullptr, nullptr, b.batch, b.n_heads, b.n_kv, b.hd, b.max_pages,
                         b.max_len, nullptr, 0, nullptr, false),
                cudaErrorInvalidValue);
      EXPECT_NE(std::string(cuda::attention_decode_last_error()).find(b.needle), std::string::npos);
    }
  }
}

TEST(AttentionDecodeHost, HeuristicPlansAreLaunchable) {
  const PlanKnobs knobs;
  attn::set_forced_splits(0);  // the models' own choices, whatever FT_ATTN_DECODE_SPLITS says
  const attn::DeviceLimits h200;
  for (attn::PlanModel model : {attn::PlanModel::kOccupancy, attn::PlanModel::kDram}) {
    attn::set_plan_model(model);
    for (bool int4 : {true, false}) {
      for (int hd : {64, 128}) {
        ASSERT_LE(attn::smem_bytes_for(int4, hd), h200.smem_per_block);
        for (int batch : {1, 2, 3, 8, 32, 256}) {
          for (int n_kv : {1, 8}) {
            for (int len : {1, 17, 64, 1000, 4097, 32768, 131072}) {
              const attn::Plan p = attn::choose_plan(int4, hd, batch, n_kv, len, h200);
              SCOPED_TRACE(attn::describe_plan(p, int4, hd, batch, 8 * n_kv, n_kv, len, h200));
              ASSERT_GE(p.splits, 1);
              ASSERT_LE(p.splits, attn::kMaxSplits);
              ASSERT_LE(p.splits, attn::tiles_for(len));
              ASSERT_EQ(p.smem_bytes, attn::smem_bytes_for(int4, hd, p.warps));
              ASSERT_EQ(p.warps, attn::cta_warps(int4, hd, batch, n_kv));
              ASSERT_FALSE(p.forced);
              ASSERT_EQ(p.model, model);
              ASSERT_EQ(p.splits, attn::model_plan(model, int4, hd, batch, n_kv, len, h200).splits);
            }
          }
        }
      }
    }
  }
  // The decode target: one long Llama-3.1-8B sequence (8 KV heads) must spread over the 132 SMs under either
  // model: at least 16 splits, 128 CTAs (the H200 sweep's best count there).
  for (attn::PlanModel model : {attn::PlanModel::kOccupancy, attn::PlanModel::kDram}) {
    const attn::Plan one = attn::model_plan(model, true, 128, 1, 8, 32768, h200);
    EXPECT_GE(one.splits, 16) << attn::describe_plan(one, true, 128, 1, 32, 8, 32768, h200);
  }
  // The DRAM model (the earlier choice): a large batch of long sequences saturates the DRAM unsplit.
  EXPECT_EQ(attn::model_plan(attn::PlanModel::kDram, true, 128, 32, 8, 32768, h200).splits, 1);
}

// The H200 split sweep (bench_attention_decode --sweep-splits 1,2,3,4,6,8,12,16, INT4, head_dim 128, 32 / 8 heads,
// every sequence at the full context; docs/results/bench_attention_decode-v10-splits.json, 4-warp CTAs): the
// occupancy rule picks these counts, each within 1.02x of the best measured one (in a comment where that differs).
TEST(AttentionDecodeHost, OccupancyRuleReproducesTheH200Sweep) {
  const PlanKnobs knobs;
  attn::set_forced_warps(4);  // the sweep's CTAs
  const attn::DeviceLimits h200;
  struct Point {
    int ctx, batch, splits;
  };
  for (const Point& m : {Point{1024, 1, 8}, Point{1024, 8, 4} /* 2 */, Point{1024, 32, 1}, Point{8192, 1, 16},
                         Point{8192, 8, 4}, Point{8192, 32, 1}, Point{32768, 1, 16}, Point{32768, 8, 4},
                         Point{32768, 32, 1} /* 12 */}) {
    const attn::Plan p = attn::model_plan(attn::PlanModel::kOccupancy, true, 128, m.batch, 8, m.ctx, h200);
    EXPECT_EQ(p.splits, m.splits) << attn::describe_plan(p, true, 128, m.batch, 32, 8, m.ctx, h200);
    EXPECT_EQ(p.model, attn::PlanModel::kOccupancy);
    EXPECT_FALSE(p.forced);
  }
}

// 8-warp CTAs from 48 CTAs a split on (64 until the thirty-sixth session), with the same two-CTAs-per-SM target: in
// the whole decode step that beat both 4-warp CTAs and one 8-warp CTA per SM (twenty-first session, docs/results.md),
// though alone one per SM was faster. Batch 6 (48 CTAs a split) takes 8 warps and the walk term's 4 splits.
TEST(AttentionDecodeHost, OccupancyRuleWithEightWarpCtas) {
  const PlanKnobs knobs;
  attn::set_forced_warps(0);  // the rule's own warps, whatever FT_ATTN_DECODE_WARPS says
  const attn::DeviceLimits h200;
  struct Point {
    int ctx, batch, warps, splits;
  };
  for (const Point& m : {Point{1024, 1, 4, 8}, Point{1024, 4, 4, 8}, Point{1024, 5, 4, 6}, Point{1024, 6, 8, 4},
                         Point{1024, 7, 8, 4}, Point{1024, 8, 8, 4}, Point{1024, 16, 8, 2},
                         Point{1024, 32, 8, 1}, Point{8192, 1, 4, 16}, Point{8192, 8, 8, 4}, Point{8192, 16, 8, 2},
                         Point{8192, 32, 8, 1}, Point{256, 8, 8, 1} /* 16 tiles: the walk term, 2 a warp */}) {
    const attn::Plan p = attn::model_plan(attn::PlanModel::kOccupancy, true, 128, m.batch, 8, m.ctx, h200);
    SCOPED_TRACE(attn::describe_plan(p, true, 128, m.batch, 32, 8, m.ctx, h200));
    EXPECT_EQ(p.warps, m.warps);
    EXPECT_EQ(p.splits, m.splits);
  }
}

// Each term of the rule binds where it should, and the clamp keeps the count in [1, min(tiles, kMaxSplits)] (4-warp
// CTAs, forced, so every batch follows the two-CTAs-per-SM arithmetic below).
TEST(AttentionDecodeHost, OccupancyRuleClamps) {
  const PlanKnobs knobs;
  attn::set_forced_warps(4);
  const attn::DeviceLimits h200;
  const auto splits = [&](int batch, int n_kv, int len) {
    return attn::model_plan(attn::PlanModel::kOccupancy, true, 128, batch, n_kv, len, h200).splits;
  };
  // Few tiles: under 2 tiles a warp (8 a split) no split at all, whatever the batch.
  for (int len : {1, 17, 64, 240}) EXPECT_EQ(splits(1, 8, len), 1) << "len " << len;
  EXPECT_EQ(splits(1, 8, 256), 2);   // 16 tiles
  EXPECT_EQ(splits(1, 8, 1000), 7);  // 63 tiles
  // A large batch fills the SMs unsplit, however long the context.
  for (int len : {1024, 32768, 131072}) {
    EXPECT_EQ(splits(32, 8, len), 1) << "len " << len;
    EXPECT_EQ(splits(256, 8, len), 1) << "len " << len;
  }
  // A long context at batch 1: the cap, whatever the KV heads (1 KV head would ask for 264).
  for (int n_kv : {1, 2, 8}) EXPECT_EQ(splits(1, n_kv, 32768), 16) << "kv heads " << n_kv;
  EXPECT_EQ(splits(1, 8, 131072), 16);
  // In between: at most two CTAs per SM (floor(264 / (batch * KV heads))).
  EXPECT_EQ(splits(3, 8, 32768), 11);  // 264 / 24
  EXPECT_EQ(splits(4, 8, 32768), 8);   // 264 / 32 = 8.25
  EXPECT_EQ(splits(16, 8, 32768), 2);  // 264 / 128 = 2.06
  EXPECT_EQ(splits(24, 8, 32768), 1);  // 264 / 192 = 1.375
  // Rounded down where the nearest count would put a third CTA on some SMs (thirty-sixth session).
  EXPECT_EQ(splits(5, 8, 32768), 6);   // 264 / 40 = 6.6
  EXPECT_EQ(splits(7, 8, 32768), 4);   // 264 / 56 = 4.71
  EXPECT_EQ(splits(9, 8, 32768), 3);   // 264 / 72 = 3.67
  EXPECT_EQ(splits(12, 8, 32768), 2);  // 264 / 96 = 2.75
  EXPECT_EQ(splits(17, 8, 32768), 1);  // 264 / 136 = 1.94
  // The SM count is the device's: an H100 PCIe (114 SMs) at batch 4: floor(228 / 32) = 7.
  attn::DeviceLimits pcie;
  pcie.sm_count = 114;
  EXPECT_EQ(attn::model_plan(attn::PlanModel::kOccupancy, true, 128, 4, 8, 32768, pcie).splits, 7);
}

TEST(AttentionDecodeHost, ForcedSplitsAreClampedAndSizeTheWorkspace) {
  const PlanKnobs knobs;
  const attn::DeviceLimits h200;
  struct Want {
    int forced, len, splits;
  };
  // 1000 tokens = 63 tiles, 17 = 2, 1 = 1; 32768 tokens = 2048 tiles, capped at kMaxSplits.
  for (const Want& w : {Want{5, 32768, 5}, Want{100, 1000, 63}, Want{100, 32768, attn::kMaxSplits}, Want{3, 17, 2},
                        Want{7, 1, 1}, Want{1, 32768, 1}, Want{64, 1024, 64}}) {
    attn::set_forced_splits(w.forced);
    for (bool int4 : {true, false}) {
      const attn::Plan p = attn::choose_plan(int4, 128, 3, 8, w.len, h200);
      SCOPED_TRACE(attn::describe_plan(p, int4, 128, 3, 32, 8, w.len, h200));
      EXPECT_TRUE(p.forced);
      EXPECT_EQ(p.splits, w.splits) << "forced " << w.forced;
      EXPECT_EQ(p.smem_bytes, attn::smem_bytes_for(int4, 128, p.warps));
      const int64_t want_ws = w.splits == 1 ? 0 : int64_t{3} * 32 * w.splits * (128 + 1) * 4;
      EXPECT_EQ(attn::workspace_bytes_for(p, 3, 32, 128), want_ws);
      EXPECT_EQ(attn::workspace_lse_offset(p, 3, 32, 128), w.splits == 1 ? 0 : int64_t{3} * 32 * w.splits * 128 * 4);
    }
  }
  // One split even where the model splits: no workspace.
  attn::set_forced_splits(1);
  EXPECT_EQ(attn::workspace_bytes_for(attn::choose_plan(true, 128, 1, 8, 32768, h200), 1, 32, 128), 0);
  // 0 and negative counts give the model's choice back.
  for (int n : {0, -4}) {
    attn::set_forced_splits(n);
    EXPECT_EQ(attn::forced_splits(), 0);
    const attn::Plan p = attn::choose_plan(true, 128, 1, 8, 32768, h200);
    EXPECT_FALSE(p.forced);
    EXPECT_EQ(p.splits, attn::model_plan(attn::plan_model(), true, 128, 1, 8, 32768, h200).splits);
    EXPECT_GT(p.splits, 1);
  }
  // The model knob: choose_plan follows it (on a shape where the two models disagree).
  const int dram = attn::model_plan(attn::PlanModel::kDram, true, 128, 8, 8, 8192, h200).splits;
  const int occupancy = attn::model_plan(attn::PlanModel::kOccupancy, true, 128, 8, 8, 8192, h200).splits;
  ASSERT_NE(dram, occupancy);
  attn::set_plan_model(attn::PlanModel::kDram);
  EXPECT_EQ(attn::plan_model(), attn::PlanModel::kDram);
  EXPECT_EQ(attn::choose_plan(true, 128, 8, 8, 8192, h200).splits, dram);
  EXPECT_EQ(attn::choose_plan(true, 128, 8, 8, 8192, h200).model, attn::PlanModel::kDram);
  attn::set_plan_model(attn::PlanModel::kOccupancy);
  EXPECT_EQ(attn::choose_plan(true, 128, 8, 8, 8192, h200).splits, occupancy);
  EXPECT_EQ(attn::choose_plan(true, 128, 8, 8, 8192, h200).model, attn::PlanModel::kOccupancy);
  EXPECT_STREQ(attn::plan_model_name(attn::PlanModel::kOccupancy), "occupancy");
  EXPECT_STREQ(attn::plan_model_name(attn::PlanModel::kDram), "dram");
}

}  // namespace
