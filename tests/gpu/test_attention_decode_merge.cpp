// The decode attention's merge in its own last CTA (split_counters, include/futransformer/cuda/attention_decode.h)
// against the combine kernel it replaces: bit for bit on the same inputs, for every format (bf16, int4, int4-hadamard
// with and without the un-rotation), GQA 1 / 4 / 8, forced split counts from 2 to 64 (splits without tokens
// included), batches mixing long, short and empty sequences. The counters must be all zero after every call (the
// next launch, here the next layer's, reuses them) and a second call on the same counters must give the same bits.
// head_dim 64 has no fused merge (the CTA is not one thread per channel): the counters are ignored there and must
// stay zero. Outputs are NaN-poisoned before every launch; caches and queries are fresh seeded random values.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/attention_decode_heuristics.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/dtype.h"
#include "gpu_test_util.h"
#include "paged_kv_case.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;
using test::PagedKvCase;
namespace attn = futransformer::cuda::attn;

// Restores the split heuristic when a test ends, however it ends.
struct ForcedSplits {
  explicit ForcedSplits(int n) { attn::set_forced_splits(n); }
  ~ForcedSplits() { attn::set_forced_splits(0); }
};

struct Uploaded {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<int32_t> block_table, seq_lens, counters;
  DeviceBuffer<uint16_t> q, out;
  size_t ws_bytes;
  DeviceBuffer<unsigned char> ws;
  explicit Uploaded(const PagedKvCase& c)
      : pool(c.pool),
        block_table(c.block_table),
        seq_lens(c.seq_lens),
        counters(std::vector<int32_t>(static_cast<size_t>(c.batch) * c.n_kv_heads, 0)),
        q(c.q_bf16),
        out(static_cast<size_t>(c.batch) * c.n_heads * c.head_dim),
        ws_bytes(cuda::attention_decode_workspace_bytes(c.format, c.batch, c.n_heads, c.n_kv_heads, c.head_dim,
                                                        c.max_pages, c.max_seq_len)),
        ws(ws_bytes) {}
};

// One launch into the poisoned output (and a poisoned workspace); counters null: the combine kernel.
// unrotate_block > 0: attention_decode_int4_unrotated (int4-hadamard), *unrotated reported.
std::vector<uint16_t> run(const PagedKvCase& c, Uploaded& u, int32_t* counters, int unrotate_block, bool* unrotated) {
  EXPECT_EQ(u.out.poison(), cudaSuccess);
  if (u.ws_bytes > 0) EXPECT_EQ(u.ws.poison(), cudaSuccess);
  const auto* q = reinterpret_cast<const __nv_bfloat16*>(u.q.p);
  auto* out = reinterpret_cast<__nv_bfloat16*>(u.out.p);
  cudaError_t e = cudaSuccess;
  if (unrotate_block > 0) {
    e = cuda::attention_decode_int4_unrotated(q, u.pool.p, u.block_table.p, u.seq_lens.p, out, c.batch, c.n_heads,
                                              c.n_kv_heads, c.head_dim, c.max_pages, c.max_seq_len, unrotate_block,
                                              u.ws.p, u.ws_bytes, nullptr, unrotated, false, counters);
  } else {
    const auto fn = c.format == KvFormat::BF16 ? cuda::attention_decode_bf16 : cuda::attention_decode_int4;
    e = fn(q, u.pool.p, u.block_table.p, u.seq_lens.p, out, c.batch, c.n_heads, c.n_kv_heads, c.head_dim, c.max_pages,
           c.max_seq_len, u.ws.p, u.ws_bytes, nullptr, false, counters);
  }
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_decode_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return u.out.download();
}

size_t first_difference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  size_t i = 0;
  while (i < a.size() && a[i] == b[i]) ++i;
  return i;
}

void check_case(KvFormat format, int head_dim, int n_heads, int n_kv, const std::vector<int32_t>& lens, int splits,
                int unrotate_block, uint32_t seed) {
  const PagedKvCase c = test::make_paged_kv_case(format, head_dim, n_heads, n_kv, lens, seed);
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " head_dim " << head_dim << " heads "
                                  << n_heads << "/" << n_kv << " batch " << c.batch << " max_seq_len "
                                  << c.max_seq_len << " forced splits " << splits << " unrotate " << unrotate_block
                                  << " seed " << seed);
  const ForcedSplits forced(splits);
  Uploaded u(c);
  ASSERT_GT(u.ws_bytes, 0u) << "the forced split count should split this case";
  bool unrot_sep = false, unrot_merge = false, unrot_again = false;
  const std::vector<uint16_t> separate = run(c, u, nullptr, unrotate_block, &unrot_sep);
  for (size_t i = 0; i < separate.size(); ++i)
    ASSERT_FALSE(std::isnan(bf16_to_f32(separate[i]))) << "the combine kernel left output " << i << " unwritten";
  const std::vector<uint16_t> merged = run(c, u, u.counters.p, unrotate_block, &unrot_merge);
  const size_t i = first_difference(merged, separate);
  EXPECT_EQ(i, merged.size()) << "output " << i << " (head " << i / head_dim << ", channel " << i % head_dim
                              << "): merged in the kernel " << merged[i] << ", combine kernel " << separate[i];
  EXPECT_EQ(unrot_merge, unrot_sep) << "*unrotated must not depend on where the merge runs";
  const std::vector<int32_t> counters = u.counters.download();
  for (size_t k = 0; k < counters.size(); ++k) EXPECT_EQ(counters[k], 0) << "counter " << k << " left non-zero";
  EXPECT_EQ(run(c, u, u.counters.p, unrotate_block, &unrot_again), merged) << "second call on the same counters";
}

const std::vector<std::vector<int32_t>> kLens = {{1024}, {1000, 40, 0, 3000}, {1, 700, 65}};

TEST(AttentionDecodeMergeGpu, BitExactAgainstTheCombineKernel) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 1200;
  for (KvFormat format : {KvFormat::BF16, KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    for (int G : {1, 4, 8}) {
      for (int splits : {2, 7, 64}) {
        for (const std::vector<int32_t>& lens : kLens) check_case(format, 128, 2 * G, 2, lens, splits, 0, ++seed);
      }
    }
  }
}

TEST(AttentionDecodeMergeGpu, UnrotatedInTheMerge) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 1300;
  for (int block : {1, 2, 32, 128}) {
    for (int splits : {2, 8}) {
      check_case(KvFormat::INT4_HADAMARD, 128, 32, 8, {1024}, splits, block, ++seed);  // Llama-3.1-8B, batch 1
      check_case(KvFormat::INT4_HADAMARD, 128, 64, 8, {1000, 300, 0}, splits, block, ++seed);  // 70B's 8 per KV head
    }
  }
}

TEST(AttentionDecodeMergeGpu, HeadDim64KeepsTheCombineKernel) {
  FT_REQUIRE_CUDA_DEVICE();
  check_case(KvFormat::INT4, 64, 8, 2, {1000, 40}, 4, 0, 1400);
  check_case(KvFormat::INT4_HADAMARD, 64, 8, 2, {3000}, 4, 64, 1401);
}

TEST(AttentionDecodeMergeHost, RejectsMisalignedCounters) {
  // Checked with the other pointers, before the device is asked for anything: fake aligned pointers suffice.
  const auto at = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  auto* bad = static_cast<int32_t*>(at(0x1002));
  const cudaError_t e = cuda::attention_decode_int4(
      static_cast<const __nv_bfloat16*>(at(0x1000)), static_cast<const uint8_t*>(at(0x2000)),
      static_cast<const int32_t*>(at(0x3000)), static_cast<const int32_t*>(at(0x4000)),
      static_cast<__nv_bfloat16*>(at(0x5000)), 1, 32, 8, 128, 4, 100, nullptr, 0, nullptr, false, bad);
  EXPECT_EQ(e, cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("split_counters must be 4-byte aligned"),
            std::string::npos)
      << cuda::attention_decode_last_error();
}

}  // namespace
