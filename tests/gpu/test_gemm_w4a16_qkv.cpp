// GPU tests of the W4A16 qkv GEMM with the attention prologue as its epilogue (gemm_w4a16_qkv_rope_append and the
// internal gemm_w4a16_qkv_rope_append_with_tiling) against the two launches it replaces, on the device, on the same
// inputs and the same tiling: gemm_w4a16 (BF16 qkv) followed by qkv_rope_kv_append. The fused reduce sums the
// split-K partials in the plain reduce's order, rounds as its store does and then runs qkv_rope_kv_append's own
// per-head code (for INT4 caches at head_dim 128 its lane-layout code, finish_item_lanes, with each lane's float4 kept
// in registers: gemm_w4a16_reduce_qkv_lanes_kernel), so every comparison is bit for bit (no tolerance): qkv afterwards (RoPE'd q and k, v), q_out and
// every byte of the page pool. Outputs, pools and the split-K workspace are poisoned (0xFF) before each run. Cases:
// every KV format, head_dim 64 and 128, GQA ratios 1, 4 and 8, M = 1, 3, 8, 17, 32, the v4 and v2 tilings with one
// K slice (the two-kernel fallback) and with 2 and 3 slices (the fused reduce), and the library's own choice; padding
// rows, anchors (int4-hadamard) and all-zero token rows (zero heads: the unit-scale rules). The two unfused ops are
// tested against their CPU twins elsewhere (test_gemm_w4a16.cpp, test_fused_ops.cpp), which makes them the oracle.
// The GemmW4A16QkvHost tests need no device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/gemm_w4a16_heuristics.h"
#include "cuda/gemm_w4a16_internal.h"
#include "futransformer/cuda/fused_ops.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "gpu_test_util.h"
#include "qkv_prologue_case.h"
#include "ref/ops.h"
#include "w4a16_cases.h"
#include "w4a16_wg_tilings.h"

namespace {

using namespace futransformer;
using formats::Int4MmaRows;
using formats::Int4Weight;
using formats::KvFormat;
using formats::ScaleType;
using test::DeviceBuffer;
using test::w4a16::random_weight;
using test::w4a16::random_x;
namespace w4 = futransformer::cuda::w4a16;

// Tolerance: none. Every comparison is bit for bit (the contract of gemm_w4a16_qkv_rope_append).
constexpr KvFormat kAllFormats[] = {KvFormat::BF16, KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD};
const std::vector<int> kMs = {1, 3, 8, 17, 32};
constexpr double kRopeTheta = 500000.0;
constexpr int kMaxPosition = 131072;

__nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
const __nv_bfloat16* bf(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

using test::QkvShape;
// GQA 1, 4 and 8 at both head sizes (N = 768 / 640 at head_dim 64, 1536 / 1280 at 128).
const QkvShape kShapes[] = {{4, 4, 64}, {8, 2, 64}, {8, 1, 64}, {4, 4, 128}, {8, 2, 128}, {8, 1, 128}};

// Host inputs of one case: activations (every 7th row from row 3 all zero: zero heads) and the metadata of
// test::make_qkv_case_meta.
struct Inputs : test::QkvCaseMeta {
  std::vector<uint16_t> x;
};

Inputs make_inputs(const QkvShape& s, int M, int K, uint32_t seed) {
  Inputs in;
  in.x = random_x(M, K, seed);
  for (int r = 3; r < M; r += 7) std::fill_n(in.x.begin() + static_cast<int64_t>(r) * K, K, uint16_t{0});
  std::mt19937 rng(seed + 1);
  static_cast<test::QkvCaseMeta&>(in) = test::make_qkv_case_meta(s, M, rng, kMaxPosition, kRopeTheta);
  return in;
}

using Side = test::QkvCaseOutputs;

// A random INT4 weight [N, K] and its canonical MMA packing on the device.
struct PackedWeight {
  Int4Weight w;
  DeviceBuffer<uint32_t> words;
  DeviceBuffer<uint16_t> scales;
  PackedWeight(int N, int K, int group, ScaleType st, uint32_t seed)
      : w(random_weight(N, K, group, st, seed)),
        words(formats::repack_int4_for_mma(w, Int4MmaRows::canonical)),
        scales(formats::repack_int4_scales_for_mma(w, Int4MmaRows::canonical)) {}
};

// Fused (tiling t, or the library's when null) against gemm_w4a16 on the same tiling + qkv_rope_kv_append.
// With counters (zeroed device memory, n_heads + 2 n_kv_heads of them) the fused call gets them as head_counters,
// runs `launches` times on the same inputs (a second launch must find the counters the first left, i.e. zero), and
// the counters must be zero afterwards.
void check_case(const w4::Tiling* t, KvFormat format, const QkvShape& s, const PackedWeight& pw, int M, uint32_t seed,
                DeviceBuffer<uint32_t>* counters = nullptr, int launches = 1) {
  const Int4Weight& w = pw.w;
  const DeviceBuffer<uint32_t>& words = pw.words;
  const DeviceBuffer<uint16_t>& scales = pw.scales;
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), group = static_cast<int>(w.group);
  const ScaleType st = w.spec.scale_type;
  const int hb = static_cast<int>(formats::kv_hadamard_block(format, s.head_dim));
  const bool hadamard = format == KvFormat::INT4_HADAMARD;
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " heads " << s.n_heads << "/" << s.n_kv
                                  << " head_dim " << s.head_dim << " M " << M << " K " << K << " group " << group
                                  << " tiling "
                                  << (t ? (std::string(t->variant == w4::Variant::v4 ? "v4" : "v2") +
                                           (t->swap32 ? " swap32" : "") + " splits " + std::to_string(t->splits))
                                        : std::string("library"))
                                  << " seed " << seed);
  const Inputs in = make_inputs(s, M, K, seed);
  const formats::KvPageLayout L = formats::kv_page_layout(format, s.head_dim);
  const size_t pool_bytes = static_cast<size_t>(in.n_pages) * s.n_kv * static_cast<size_t>(L.page_bytes);
  const size_t q_elems = static_cast<size_t>(M) * s.n_heads * s.head_dim, qkv_elems = static_cast<size_t>(M) * N;
  size_t ws_bytes = cuda::gemm_w4a16_workspace_bytes(M, N, K);
  if (t) ws_bytes = std::max<size_t>(ws_bytes, static_cast<size_t>(w4::workspace_bytes_for(*t, M, N)));

  DeviceBuffer<uint16_t> x(in.x), anchors(in.anchors);
  DeviceBuffer<int32_t> positions(in.positions), page(in.page), slot(in.slot), row_anchor(in.anchor);
  DeviceBuffer<float> inv_freq(in.inv_freq);
  Side ref(qkv_elems, q_elems, pool_bytes, ws_bytes), got(qkv_elems, q_elems, pool_bytes, ws_bytes);
  const uint16_t* key_anchors = hadamard ? anchors.p : nullptr;
  const int32_t* ra = hadamard ? row_anchor.p : nullptr;

  cudaError_t e = t ? cuda::gemm_w4a16_with_tiling(*t, bf(x.p), words.p, scales.p, bf(ref.qkv.p), M, N, K, group, st,
                                                   ref.ws.p, ws_bytes, nullptr)
                    : cuda::gemm_w4a16(bf(x.p), words.p, scales.p, bf(ref.qkv.p), M, N, K, group, st, ref.ws.p,
                                       ws_bytes, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  e = cuda::qkv_rope_kv_append(format, bf(ref.qkv.p), M, s.n_heads, s.n_kv, s.head_dim, positions.p, inv_freq.p,
                               page.p, slot.p, key_anchors, ra, ref.pool.p, hb, bf(ref.q_out.p), nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::fused_ops_last_error();

  uint32_t* const hc = counters ? counters->p : nullptr;
  for (int launch = 0; launch < launches; ++launch) {
    if (launch > 0) {  // the same inputs again, onto poisoned outputs (qkv holds RoPE'd values after a launch)
      ASSERT_EQ(got.qkv.poison(), cudaSuccess);
      ASSERT_EQ(got.q_out.poison(), cudaSuccess);
      ASSERT_EQ(got.pool.poison(), cudaSuccess);
    }
    e = t ? cuda::gemm_w4a16_qkv_rope_append_with_tiling(*t, bf(x.p), words.p, scales.p, M, K, group, st, got.ws.p,
                                                         ws_bytes, format, bf(got.qkv.p), s.n_heads, s.n_kv,
                                                         s.head_dim, positions.p, inv_freq.p, page.p, slot.p,
                                                         key_anchors, ra, got.pool.p, hb, bf(got.q_out.p), nullptr, hc)
          : cuda::gemm_w4a16_qkv_rope_append(bf(x.p), words.p, scales.p, M, K, group, st, got.ws.p, ws_bytes, format,
                                             bf(got.qkv.p), s.n_heads, s.n_kv, s.head_dim, positions.p, inv_freq.p,
                                             page.p, slot.p, key_anchors, ra, got.pool.p, hb, bf(got.q_out.p),
                                             nullptr, hc);
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (counters) {
    const std::vector<uint32_t> left = counters->download();
    for (size_t i = 0; i < left.size(); ++i) ASSERT_EQ(left[i], 0u) << "head counter " << i << " left non-zero";
  }

  const std::vector<uint16_t> qkv_g = got.qkv.download(), qkv_r = ref.qkv.download();
  const std::vector<uint16_t> q_g = got.q_out.download(), q_r = ref.q_out.download();
  const std::vector<uint8_t> pool_g = got.pool.download(), pool_r = ref.pool.download();
  EXPECT_SAME_BITS(qkv_g, qkv_r, "qkv");
  EXPECT_SAME_BITS(q_g, q_r, "q_out");
  EXPECT_SAME_BITS(pool_g, pool_r, "page pool byte");

  // Not vacuous: every qkv and q_out element written (finite inputs and weights give no NaN), and the cache written
  // for the non-padding rows: each (row, KV head) stores at least head_dim code bytes for K and V together (int4;
  // fp8 and bf16 more), of which a code byte of 0xFF (two nibbles of 15) is rare, so at least half of them differ
  // from the poison.
  for (size_t i = 0; i < qkv_g.size(); ++i) ASSERT_FALSE((qkv_g[i] & 0x7fff) > 0x7f80) << "qkv element " << i;
  for (size_t i = 0; i < q_g.size(); ++i) ASSERT_FALSE((q_g[i] & 0x7fff) > 0x7f80) << "q_out element " << i;
  const int64_t written = static_cast<int64_t>(pool_g.size()) - std::count(pool_g.begin(), pool_g.end(), uint8_t{0xFF});
  int live_rows = 0;
  for (int r = 0; r < M; ++r) live_rows += in.page[static_cast<size_t>(r)] >= 0;
  EXPECT_GE(written, int64_t{live_rows} * s.n_kv * s.head_dim / 2) << "cache bytes written";
}

// Tilings for one M: v4 and v2 on the default plan, and for M = 17..32 v4 with swap32 flipped from its default
// (the swapped three/four-tile path or the 16-row one), each with 1 (GEMM store + prologue kernel), 2 and 3 K
// slices (prologue in the reduce).
std::vector<w4::Tiling> tilings_for(int M, int N, int K, int group, ScaleType st) {
  w4::Tiling base;
  EXPECT_EQ(cuda::gemm_w4a16_plan_config(M, N, K, group, st, w4::V4Config{}, &base), cudaSuccess);
  std::vector<w4::Tiling> bases;
  for (w4::Variant v : {w4::Variant::v4, w4::Variant::v2}) {
    w4::Tiling t = base;
    t.variant = v;
    if (v == w4::Variant::v2) t.swap32 = false;  // a v4-only path (kSwap32ByDefault)
    bases.push_back(t);
  }
  if (M >= w4::kSwap32MinM && M <= w4::kSwap32MaxM) {
    w4::Tiling t = bases.front();
    t.swap32 = !w4::kSwap32ByDefault;
    bases.push_back(t);
  }
  // The warpgroup path, staged and streamed, where the shape allows it (M <= 32; N a multiple of 128 / 256).
  for (const w4::Tiling& wg : test::wg_planned_tilings(M, N, K, group, st)) bases.push_back(wg);
  std::vector<w4::Tiling> out;
  for (const w4::Tiling& b : bases) {
    for (int splits : {1, 2, 3}) {
      w4::Tiling t = b;
      t.splits = splits;
      std::string why;
      EXPECT_TRUE(w4::tiling_is_valid(t, M, N, K, group, w4::DeviceLimits{}, &why)) << why;
      out.push_back(t);
    }
  }
  return out;
}

TEST(GemmW4A16QkvGpu, MatchesGemmThenQkvRopeKvAppendBitForBit) {
  FT_REQUIRE_HOPPER();
  constexpr int K = 512, group = 64;  // 8 groups: 2 and 3 slices are valid
  uint32_t seed = 300;
  for (const QkvShape& s : kShapes) {
    const int N = (s.n_heads + 2 * s.n_kv) * s.head_dim;
    const ScaleType st = s.head_dim == 64 ? ScaleType::F16 : ScaleType::BF16;
    const PackedWeight pw(N, K, group, st, ++seed);
    for (KvFormat f : kAllFormats) {
      for (int M : kMs) {
        for (const w4::Tiling& t : tilings_for(M, N, K, group, st)) check_case(&t, f, s, pw, M, ++seed);
        check_case(nullptr, f, s, pw, M, ++seed);
      }
    }
  }
}

// The 8B layer's qkv (32 / 8 heads of 128, K 4096) through the public launcher at the M where the library splits K
// (checked: otherwise this would only test the fallback) and at M = 1 (no split on an H200: the fallback).
TEST(GemmW4A16QkvGpu, Llama8BShapeLibraryTiling) {
  FT_REQUIRE_HOPPER();
  const QkvShape s{32, 8, 128};
  constexpr int K = 4096, group = 128;
  const int N = (s.n_heads + 2 * s.n_kv) * s.head_dim;
  const PackedWeight pw(N, K, group, ScaleType::BF16, 77);
  EXPECT_TRUE(cuda::gemm_w4a16_splits_k(32, N, K, group)) << "the 8B qkv at M = 32 no longer splits K";
  uint32_t seed = 900;
  for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::BF16}) {
    for (int M : {1, 32, 64}) check_case(nullptr, f, s, pw, M, ++seed);
  }
}

// The prologue in the unsplit GEMM's tail (head_counters): v4 rows8 tilings of each compiled tail shape (8 / 16,
// 16 / 16, 24 / 8 warps / slots) with CTAs of 1, 2, 4 and 8 column blocks (a quarter, half, one and two heads), one K
// slice, M = 1..8, both INT4 caches and the head_dim-128 GQA shapes; each case launched twice on the same counters.
// The premise (the tail runs, w4a16_qkv_tail_applies) is checked for every INT4 case, so the test cannot pass on the
// fallback; on BF16 / FP8 caches the counters are ignored (the two-kernel path, same bits).
TEST(GemmW4A16QkvGpu, TailMatchesGemmThenQkvRopeKvAppendBitForBit) {
  FT_REQUIRE_HOPPER();
  constexpr int K = 1024, group = 64;
  uint32_t seed = 1300;
  int tail_cases = 0;
  for (const QkvShape& s : kShapes) {
    if (s.head_dim != 128) continue;
    const int N = (s.n_heads + 2 * s.n_kv) * s.head_dim;
    for (const ScaleType st : {ScaleType::BF16, ScaleType::F16}) {
      const PackedWeight pw(N, K, group, st, ++seed);
      DeviceBuffer<uint32_t> counters(std::vector<uint32_t>(static_cast<size_t>(s.n_heads + 2 * s.n_kv), 0u));
      for (const auto& [warps, stages] : {std::pair{8, 16}, std::pair{16, 16}, std::pair{24, 8}}) {
        for (int warps_n : {1, 2, 4, 8}) {
          if ((N / 32) % warps_n != 0 || warps % warps_n != 0) continue;
          for (int M : {1, 2, 5, 8}) {
            w4::V4Config c;
            c.warps = warps;
            c.stages = stages;
            c.splits = 1;
            c.warps_n = warps_n;
            w4::Tiling t;
            ASSERT_EQ(cuda::gemm_w4a16_plan_config(M, N, K, group, st, c, &t), cudaSuccess);
            t.variant = w4::Variant::v4;
            ASSERT_TRUE(t.rows8 && t.splits == 1 && t.warps == warps) << "M " << M;
            if (t.warps_n != warps_n) continue;  // the planner declined the width (counted below)
            for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::INT4, KvFormat::BF16}) {
              const bool int4 = f != KvFormat::BF16;
              EXPECT_EQ(cuda::w4a16_qkv_tail_applies(t, M, K, group, f, s.head_dim, st == ScaleType::F16,
                                                     w4::DeviceLimits{}),
                        int4)
                  << "warps " << warps << " warps_n " << warps_n << " M " << M;
              tail_cases += int4;
              check_case(&t, f, s, pw, M, ++seed, &counters, 2);
            }
          }
        }
      }
    }
  }
  EXPECT_GE(tail_cases, 300);  // of 576 (INT4 formats): most widths plan as asked
}

// The 8B layer's qkv through the library's tiling with head_counters at the decode sizes where the tail applies
// (checked through the public query), and at M = 32 (split K: the counters are ignored, the reduce runs the prologue).
TEST(GemmW4A16QkvGpu, Llama8BShapeTail) {
  FT_REQUIRE_HOPPER();
  const QkvShape s{32, 8, 128};
  constexpr int K = 4096, group = 128;
  const int N = (s.n_heads + 2 * s.n_kv) * s.head_dim;
  const PackedWeight pw(N, K, group, ScaleType::BF16, 78);
  DeviceBuffer<uint32_t> counters(std::vector<uint32_t>(static_cast<size_t>(s.n_heads + 2 * s.n_kv), 0u));
  uint32_t seed = 950;
  for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::INT4}) {
    for (int M : {1, 2, 8}) {
      EXPECT_TRUE(cuda::gemm_w4a16_qkv_prologue_in_tail(M, K, group, ScaleType::BF16, f, s.n_heads, s.n_kv,
                                                        s.head_dim))
          << "M " << M;
      check_case(nullptr, f, s, pw, M, ++seed, &counters, 2);
    }
    EXPECT_FALSE(cuda::gemm_w4a16_qkv_prologue_in_tail(32, K, group, ScaleType::BF16, f, s.n_heads, s.n_kv,
                                                       s.head_dim));
    check_case(nullptr, f, s, pw, 32, ++seed, &counters, 1);
  }
  EXPECT_FALSE(cuda::gemm_w4a16_qkv_prologue_in_tail(1, K, group, ScaleType::BF16, KvFormat::BF16, s.n_heads, s.n_kv,
                                                     s.head_dim));
}

// --- host checks (no device) -------------------------------------------------------------------------------------

// Where the tail applies, from the tiling and the shape alone.
TEST(GemmW4A16QkvHost, TailAppliesOnlyWhereItsInstanceAndColumnsFit) {
  EXPECT_TRUE(w4::qkv_tail_columns_ok(1));   // 32 columns: a quarter head
  EXPECT_TRUE(w4::qkv_tail_columns_ok(2));
  EXPECT_TRUE(w4::qkv_tail_columns_ok(4));   // one head
  EXPECT_TRUE(w4::qkv_tail_columns_ok(8));   // two heads
  EXPECT_FALSE(w4::qkv_tail_columns_ok(3));  // 96 columns straddle heads
  EXPECT_FALSE(w4::qkv_tail_columns_ok(7));
  EXPECT_FALSE(w4::qkv_tail_columns_ok(12));  // three heads: more than a CTA's tail handles
  constexpr int M = 4, K = 512, group = 64;
  w4::Tiling t;  // the 24-warp, 8-slot rows8 tiling of 64 columns per CTA, written out (planning needs a device)
  t.variant = w4::Variant::v4;
  t.rows8 = true;
  t.rows = M;
  t.warps = 24;
  t.stages = 8;
  t.warps_n = 2;
  t.warps_k = 12;
  t.splits = 1;
  const w4::DeviceLimits d;
  EXPECT_TRUE(cuda::w4a16_qkv_tail_applies(t, M, K, group, KvFormat::INT4, 128, false, d));
  EXPECT_TRUE(cuda::w4a16_qkv_tail_applies(t, M, K, group, KvFormat::INT4_HADAMARD, 128, true, d));
  EXPECT_FALSE(cuda::w4a16_qkv_tail_applies(t, M, K, group, KvFormat::FP8, 128, false, d));
  EXPECT_FALSE(cuda::w4a16_qkv_tail_applies(t, M, K, group, KvFormat::INT4, 64, false, d));
  EXPECT_FALSE(cuda::w4a16_qkv_tail_applies(t, 9, K, group, KvFormat::INT4, 128, false, d));
  w4::Tiling split = t;
  split.splits = 2;
  EXPECT_FALSE(cuda::w4a16_qkv_tail_applies(split, M, K, group, KvFormat::INT4, 128, false, d));
  w4::Tiling v2 = t;
  v2.variant = w4::Variant::v2;
  EXPECT_FALSE(cuda::w4a16_qkv_tail_applies(v2, M, K, group, KvFormat::INT4, 128, false, d));
  w4::Tiling odd = t;
  odd.warps_n = 3;
  odd.warps_k = 8;
  EXPECT_FALSE(cuda::w4a16_qkv_tail_applies(odd, M, K, group, KvFormat::INT4, 128, false, d));
  w4::Tiling shape = t;
  shape.warps = 28;  // 28 warps / 8 slots: no tail instance compiled
  shape.warps_k = 14;
  EXPECT_FALSE(cuda::w4a16_qkv_tail_applies(shape, M, K, group, KvFormat::INT4, 128, false, d));
}

TEST(GemmW4A16QkvHost, CanImplementNamesTheParameter) {
  std::string why;
  EXPECT_EQ(cuda::gemm_w4a16_qkv_rope_append_can_implement(1, 4096, 128, ScaleType::BF16, KvFormat::INT4, 32, 8, 128,
                                                           128, &why),
            cudaSuccess)
      << why;
  EXPECT_TRUE(why.empty());
  EXPECT_EQ(cuda::gemm_w4a16_qkv_rope_append_can_implement(65, 4096, 128, ScaleType::BF16, KvFormat::INT4, 32, 8, 128,
                                                           128, &why),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("M = 65"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_w4a16_qkv_rope_append_can_implement(1, 4096, 128, ScaleType::BF16, KvFormat::INT4, 32, 8, 48,
                                                           0, &why),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("gemm_w4a16_qkv_rope_append: head_dim = 48"), std::string::npos) << why;
  // (1 + 2 * 1) * 8 = 24 columns: not a multiple of the GEMM's 32.
  EXPECT_EQ(cuda::gemm_w4a16_qkv_rope_append_can_implement(1, 256, 32, ScaleType::BF16, KvFormat::BF16, 1, 1, 8, 0,
                                                           &why),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("(1 + 2 * 1) * 8 = 24"), std::string::npos) << why;
  EXPECT_NE(why.find("N = 24"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_w4a16_qkv_rope_append_can_implement(1, 4096, 128, ScaleType::BF16, KvFormat::INT4, 32, 8, 128,
                                                           3, &why),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("hadamard_block = 3"), std::string::npos) << why;
}

// Rejected before any CUDA call (so no device is needed): a null q_out, int4-hadamard without anchors, q_out inside
// qkv, a misaligned qkv. The message names the op and the argument.
TEST(GemmW4A16QkvHost, RejectsBadPointers) {
  constexpr int M = 2, K = 256, group = 64, nh = 4, nkv = 2, hd = 64, N = (nh + 2 * nkv) * hd;
  alignas(16) static uint16_t x[M * K], qkv[M * N + 2], q[M * nh * hd], scales[N * K / group];
  alignas(16) static uint32_t words[N * K / 8];
  alignas(16) static int32_t pos[M], page[M], slot[M], ra[M];
  alignas(16) static float inv[hd / 2];
  alignas(16) static uint8_t pool[64];
  alignas(16) static uint16_t anchors[nkv * hd];
  auto call = [&](KvFormat f, uint16_t* qkv_p, uint16_t* q_p, const uint16_t* anch) {
    return cuda::gemm_w4a16_qkv_rope_append(bf(x), words, scales, M, K, group, ScaleType::F16, nullptr, 0, f,
                                            bf(qkv_p), nh, nkv, hd, pos, inv, page, slot, anch, ra, pool, 0, bf(q_p),
                                            nullptr);
  };
  EXPECT_EQ(call(KvFormat::INT4, qkv, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("gemm_w4a16_qkv_rope_append: qkv, row_page"),
            std::string::npos)
      << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(call(KvFormat::INT4_HADAMARD, qkv, q, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("key_anchors"), std::string::npos)
      << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(call(KvFormat::INT4, qkv, qkv + 16, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("q_out overlaps qkv"), std::string::npos)
      << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(call(KvFormat::INT4, qkv + 1, q, anchors), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("4-byte aligned"), std::string::npos)
      << cuda::gemm_w4a16_last_error();
  alignas(16) static uint32_t counters[nh + 2 * nkv + 1];
  const cudaError_t e = cuda::gemm_w4a16_qkv_rope_append(
      bf(x), words, scales, M, K, group, ScaleType::F16, nullptr, 0, KvFormat::INT4, bf(qkv), nh, nkv, hd, pos, inv,
      page, slot, nullptr, nullptr, pool, 0, bf(q), nullptr,
      reinterpret_cast<uint32_t*>(reinterpret_cast<unsigned char*>(counters) + 2));
  EXPECT_EQ(e, cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("gemm_w4a16_qkv_rope_append: head_counters must be "
                                                            "4-byte aligned"),
            std::string::npos)
      << cuda::gemm_w4a16_last_error();
}

}  // namespace
