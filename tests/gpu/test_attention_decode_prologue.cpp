// attention_decode_int4_with_prologue (include/futransformer/cuda/attention_decode.h): the decode attention running
// the attention prologue itself (RoPE, q rotation, the new token's INT4 cache append); and the plain decode attention
// with early_copies behind the prologue kernel. Bit for bit against the two launches without early copies on the
// same inputs: qkv_rope_kv_append (tested against its CPU twins in test_fused_ops.cpp and
// test_kv_append.cpp) into a q buffer and the cache, then attention_decode_int4_unrotated (tested against the CPU
// attention twin in test_attention_decode.cpp and the un-rotation's twin in test_attention_decode_unrotate.cpp).
// Compared: every output element, every byte of the page pool, the *unrotated answer; qkv must be left as it was.
// Inputs are fresh seeded random values: the cache of tests/paged_kv_case.h, N(0, 1) BF16 projections, fp16 key
// anchors. Each sequence's last token is the one appended (its cache slot is poisoned first, so a missing append
// shows). Outputs are NaN-poisoned before every launch. Split counts are forced from 1 to 64 so that the new token's
// tile lands in every position of a warp's ring (the deferred copy) and in splits of every size.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_decode_plan_knobs.h"
#include "cuda/attention_decode_heuristics.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/cuda/fused_ops.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "gpu_test_util.h"
#include "paged_kv_case.h"
#include "qkv_prologue_case.h"
#include "ref/ops.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;
using test::PagedKvCase;
namespace attn = futransformer::cuda::attn;

constexpr int kHeadDim = 128;          // the fused prologue's head size
constexpr int kAnchors = 3;            // key-anchor entries per KV head in a case
constexpr double kRopeTheta = 500000;  // Llama 3's
constexpr float kQkvSigma = 1.0f;      // projections' spread: RoPE, rotation and INT4 see ordinary magnitudes

__nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

struct Case {
  PagedKvCase kv;
  std::vector<uint16_t> qkv;  // [batch, (n_heads + 2 n_kv) * 128] BF16
  std::vector<int32_t> positions, row_page, row_slot, row_anchor;
  std::vector<float> inv_freq;
  std::vector<uint16_t> anchors;  // [kAnchors, n_kv, 128] fp16
};

// lens: each sequence's length after this step; 0 is a padding row (no page, nothing appended).
Case make_case(KvFormat format, int n_heads, int n_kv, const std::vector<int32_t>& lens, uint32_t seed) {
  Case c;
  c.kv = test::make_paged_kv_case(format, kHeadDim, n_heads, n_kv, lens, seed);
  std::mt19937 rng(seed * 7919u + 1u);
  std::normal_distribution<float> nd(0.0f, kQkvSigma), na(0.0f, 0.3f);
  const size_t width = static_cast<size_t>(n_heads + 2 * n_kv) * kHeadDim;
  c.qkv.resize(lens.size() * width);
  for (uint16_t& v : c.qkv) v = f32_to_bf16(nd(rng));
  const int P = static_cast<int>(c.kv.layout.page_tokens);
  const size_t page_bytes = static_cast<size_t>(c.kv.layout.page_bytes);
  for (size_t b = 0; b < lens.size(); ++b) {
    const int len = lens[b];
    c.positions.push_back(len > 0 ? len - 1 : 0);
    const int page = len > 0 ? c.kv.block_table[b * static_cast<size_t>(c.kv.max_pages) + (len - 1) / P] : -1;
    c.row_page.push_back(page);
    c.row_slot.push_back(len > 0 ? (len - 1) % P : 0);
    c.row_anchor.push_back(b % 3 == 1 ? -1 : static_cast<int32_t>(rng() % kAnchors));
    // Poison the new token's bytes of every KV head's page (codes, scales, zeros): the append must rewrite them.
    if (page >= 0) {
      for (int h = 0; h < n_kv; ++h) {
        uint8_t* p = c.kv.pool.data() + (static_cast<size_t>(page) * n_kv + h) * page_bytes;
        const formats::KvPageLayout& L = c.kv.layout;
        const int64_t t = (len - 1) % P;
        for (int part = 0; part < 2; ++part) {
          std::fill_n(p + L.codes[part] + t * L.code_row_bytes, L.code_row_bytes, uint8_t{0xFF});
          std::fill_n(p + L.scales[part] + t * L.groups * 2, L.groups * 2, uint8_t{0xFF});
          std::fill_n(p + L.zeros[part] + t * L.groups, L.groups, uint8_t{0xFF});
        }
      }
    }
  }
  c.inv_freq = ref::rope_inv_freq(kHeadDim, kRopeTheta, RopeScaling{});
  c.anchors.resize(static_cast<size_t>(kAnchors) * n_kv * kHeadDim);
  for (uint16_t& a : c.anchors) a = f32_to_f16(na(rng));
  return c;
}

struct Result {
  std::vector<uint16_t> out, qkv;
  std::vector<uint8_t> pool;
  bool unrotated = false;
};

enum class Mode {
  kSeparate,       // qkv_rope_kv_append, then attention_decode_int4_unrotated
  kSeparateEarly,  // the same with early_copies: the attention copies all but the new tokens' tiles before its wait
  kFused,          // attention_decode_int4_with_prologue
};

Result run(const Case& c, Mode mode, int unrotate_block) {
  const bool fused = mode == Mode::kFused;
  const PagedKvCase& k = c.kv;
  const int hb = static_cast<int>(formats::kv_hadamard_block(k.format, kHeadDim));
  DeviceBuffer<uint16_t> qkv(c.qkv), anchors(c.anchors), q(static_cast<size_t>(k.batch) * k.n_heads * kHeadDim),
      out(static_cast<size_t>(k.batch) * k.n_heads * kHeadDim);
  DeviceBuffer<uint8_t> pool(k.pool);
  DeviceBuffer<int32_t> bt(k.block_table), lens(k.seq_lens), pos(c.positions), page(c.row_page), slot(c.row_slot),
      ra(c.row_anchor);
  DeviceBuffer<float> inv(c.inv_freq);
  const size_t ws_bytes = cuda::attention_decode_workspace_bytes(k.format, k.batch, k.n_heads, k.n_kv_heads, kHeadDim,
                                                                 k.max_pages, k.max_seq_len);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  EXPECT_EQ(out.poison(), cudaSuccess);
  EXPECT_EQ(q.poison(), cudaSuccess);
  EXPECT_EQ(ws.poison(), cudaSuccess);
  const bool hadamard = k.format == KvFormat::INT4_HADAMARD;
  const uint16_t* key_anchors = hadamard ? anchors.p : nullptr;
  const int32_t* row_anchor = hadamard ? ra.p : nullptr;
  Result r;
  if (fused) {
    cuda::AttentionDecodePrologue p;
    p.format = k.format;
    p.qkv = bf(qkv.p);
    p.positions = pos.p;
    p.inv_freq = inv.p;
    p.row_page = page.p;
    p.row_slot = slot.p;
    p.key_anchors = key_anchors;
    p.row_anchor = row_anchor;
    p.hadamard_block = hb;
    const cudaError_t e = cuda::attention_decode_int4_with_prologue(
        p, pool.p, bt.p, lens.p, bf(out.p), k.batch, k.n_heads, k.n_kv_heads, kHeadDim, k.max_pages, k.max_seq_len,
        unrotate_block, ws.p, ws_bytes, nullptr, &r.unrotated);
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_decode_last_error();
  } else {
    cudaError_t e = cuda::qkv_rope_kv_append(k.format, bf(qkv.p), k.batch, k.n_heads, k.n_kv_heads, kHeadDim, pos.p,
                                             inv.p, page.p, slot.p, key_anchors, row_anchor, pool.p, hb, bf(q.p),
                                             nullptr);
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::fused_ops_last_error();
    e = cuda::attention_decode_int4_unrotated(bf(q.p), pool.p, bt.p, lens.p, bf(out.p), k.batch, k.n_heads,
                                              k.n_kv_heads, kHeadDim, k.max_pages, k.max_seq_len, unrotate_block,
                                              ws.p, ws_bytes, nullptr, &r.unrotated, mode == Mode::kSeparateEarly);
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_decode_last_error();
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  r.out = out.download();
  r.qkv = qkv.download();
  r.pool = pool.download();
  return r;
}

void check_case(KvFormat format, int n_heads, int n_kv, const std::vector<int32_t>& lens, uint32_t seed) {
  const Case c = make_case(format, n_heads, n_kv, lens, seed);
  const int hb = static_cast<int>(formats::kv_hadamard_block(format, kHeadDim));
  for (const int unrotate : {0, hb}) {
    SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " heads " << n_heads << "/" << n_kv
                                    << " batch " << lens.size() << " seed " << seed << " unrotate " << unrotate);
    const Result want = run(c, Mode::kSeparate, unrotate), got = run(c, Mode::kFused, unrotate);
    EXPECT_EQ(got.unrotated, want.unrotated);
    EXPECT_SAME_BITS(got.out, want.out, "attention output");
    EXPECT_SAME_BITS(got.pool, want.pool, "page pool byte");
    EXPECT_SAME_BITS(got.qkv, c.qkv, "qkv (must not be written)");
    // Early copies behind the append kernel (programmatic launch: the attention's CTAs start while it runs): a tile
    // copied too early would hold the poisoned slot (NaN scales) or the old token.
    const Result early = run(c, Mode::kSeparateEarly, unrotate);
    EXPECT_EQ(early.unrotated, want.unrotated);
    EXPECT_SAME_BITS(early.out, want.out, "attention output with early copies");
    EXPECT_SAME_BITS(early.pool, want.pool, "page pool byte with early copies");
    // Not vacuous: every output written, and the appended slots rewritten (the reference changed the pool).
    for (size_t i = 0; i < got.out.size(); ++i) ASSERT_FALSE(std::isnan(bf16_to_f32(got.out[i]))) << "output " << i;
    bool any_live = false;
    for (int32_t len : lens) any_live |= len > 0;
    if (any_live) EXPECT_NE(test::first_mismatch(want.pool, c.kv.pool), -1) << "the reference appended nothing";
    if (format != KvFormat::INT4_HADAMARD) break;  // INT4 has no output rotation to undo
  }
}

TEST(AttentionDecodePrologueGpu, BitExactAgainstTheTwoKernels) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 1200;
  for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::INT4}) {
    for (int G : {1, 4, 8}) {
      check_case(f, 2 * G, 2, {1}, ++seed);
      check_case(f, 2 * G, 2, {1000}, ++seed);
      check_case(f, 2 * G, 2, {17, 0, 64, 65, 3000}, ++seed);  // a padding row; page-boundary lengths
    }
  }
}

TEST(AttentionDecodePrologueGpu, LlamaShapes) {
  FT_REQUIRE_HOPPER();
  check_case(KvFormat::INT4_HADAMARD, 32, 8, {1024}, 1301);                // 8B, batch 1 (split plan)
  check_case(KvFormat::INT4_HADAMARD, 32, 8, std::vector<int32_t>(8, 1024), 1302);
  std::vector<int32_t> mixed;
  for (int i = 0; i < 32; ++i) mixed.push_back(1 + (i * 97) % 1100);      // batch 32 (unsplit plan)
  check_case(KvFormat::INT4_HADAMARD, 32, 8, mixed, 1303);
  check_case(KvFormat::INT4_HADAMARD, 64, 8, {1000, 1}, 1304);            // 70B's 8 query heads per KV head
}

// Every forced split count: the new token's tile falls at every ring position of the owning warp.
TEST(AttentionDecodePrologueGpu, ForcedSplits) {
  FT_REQUIRE_HOPPER();
  const test::PlanKnobs knobs;
  uint32_t seed = 1400;
  for (int splits : {1, 2, 3, 5, 8, 13, 16, 31, 64}) {
    SCOPED_TRACE(testing::Message() << "forced splits " << splits);
    attn::set_forced_splits(splits);
    check_case(KvFormat::INT4_HADAMARD, 32, 8, {1024, 77, 500}, ++seed);
  }
}

// 8-warp CTAs: the prologue instances against the two kernels (append, then the 8-warp plain kernel).
TEST(AttentionDecodePrologueGpu, EightWarpCtas) {
  FT_REQUIRE_HOPPER();
  const test::PlanKnobs knobs;
  attn::set_forced_warps(8);
  uint32_t seed = 1500;
  std::vector<int32_t> mixed;
  for (int i = 0; i < 32; ++i) mixed.push_back(1 + (i * 89) % 1100);
  for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::INT4}) {
    check_case(f, 32, 8, mixed, ++seed);
    check_case(f, 32, 8, {1024}, ++seed);
    check_case(f, 16, 2, {17, 0, 64, 65, 3000}, ++seed);
  }
  for (int splits : {1, 5, 16}) {
    SCOPED_TRACE(testing::Message() << "forced splits " << splits);
    attn::set_forced_splits(splits);
    check_case(KvFormat::INT4_HADAMARD, 32, 8, {1024, 77, 500}, ++seed);
  }
}

// --- Host-only: rejected arguments name what is wrong, before anything touches the device. ---

TEST(AttentionDecodePrologueHost, RejectsUnsupportedArguments) {
  alignas(16) static uint16_t dummy_qkv[8];
  cuda::AttentionDecodePrologue p{};
  p.format = KvFormat::INT4_HADAMARD;
  p.qkv = reinterpret_cast<const __nv_bfloat16*>(dummy_qkv);
  p.hadamard_block = 128;
  bool unrotated = true;
  auto call = [&](int head_dim, bool* flag) {
    return cuda::attention_decode_int4_with_prologue(p, nullptr, nullptr, nullptr, nullptr, 1, 32, 8, head_dim, 4, 100,
                                                     128, nullptr, 0, nullptr, flag);
  };
  EXPECT_EQ(call(128, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("unrotated must be non-null"), std::string::npos);
  EXPECT_EQ(call(64, &unrotated), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("head_dim = 64"), std::string::npos);
  EXPECT_FALSE(unrotated);
  p.format = KvFormat::BF16;
  EXPECT_EQ(call(128, &unrotated), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("bf16"), std::string::npos);
  p.format = KvFormat::INT4;
  p.qkv = reinterpret_cast<const __nv_bfloat16*>(dummy_qkv + 1);  // 2-byte aligned only
  EXPECT_EQ(call(128, &unrotated), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("16-byte aligned"), std::string::npos);
  p.qkv = reinterpret_cast<const __nv_bfloat16*>(dummy_qkv);
  // The prologue's own arguments next: missing row metadata and pool.
  EXPECT_EQ(call(128, &unrotated), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_decode_last_error()).find("must be non-null"), std::string::npos);
}

}  // namespace
