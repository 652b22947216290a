// GPU tests of the FP8 QKV GEMM with the attention prologue in its epilogue (include/futransformer/cuda/
// gemm_fp8_qkv.h), bit for bit against the unfused launcher sequence it replaces:
//   gemm_fp8 → rope_qk_bf16 → [kv_key_anchor_compute →] kv_append_rotate_q
// on the same operands: every byte of the 0xFF-poisoned page pool, q_out, the key anchors, and (keys-to-qkv mode) the
// RoPE'd keys with the q and v slices of that buffer left untouched. The unfused ops have their own tests against the
// CPU twins (test_gemm_fp8.cpp, test_decoder_ops.cpp, test_kv_append.cpp, test_fused_ops.cpp), which makes them the
// oracle here. Also kv_append_keys (the keys-only append) and rope_cos_sin_table. Inputs: per-token FP8 of Gaussian
// activations and per-channel FP8 of Gaussian weights with an outlier key channel; random positions up to 128k,
// shuffled (page, slot) cells with padding rows, anchors per row or none. Device tests report SKIPPED without a
// CUDA device; the Fp8QkvHost tests need none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fused_ops.h"
#include "futransformer/cuda/gemm_fp8.h"
#include "futransformer/cuda/gemm_fp8_qkv.h"
#include "futransformer/cuda/kv_append.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "gpu_test_util.h"
#include "qkv_prologue_case.h"
#include "ref/ops.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;

// Tolerance: none for the fused GEMM (every comparison is bit for bit, the contract of gemm_fp8_qkv.h).
constexpr int kHeadDim = 128;
constexpr float kOutlierGain = 30.0f;    // one key channel per KV head, as real keys have
constexpr double kRopeTheta = 500000.0;  // Llama 3
constexpr int kMaxPosition = 131072;
constexpr int kNewSequenceRows = 5;      // rows 0..4 start a sequence whose anchor goes to slot 0
// rope_cos_sin_table against the host's fp64 cos / sin rounded to fp32: the two libms may differ in the last bit of
// the double, which can move the float rounding by one unit.
constexpr int kTableMaxUlps = 1;

struct Case {
  KvFormat format;
  int n_heads, n_kv, rows, K;
  int hadamard_block;  // q's rotation; -1: the format's block (the engine's choice)
  bool keys_to_qkv;
};

// Host operands and metadata of one case.
struct Inputs {
  int N = 0;
  std::vector<uint8_t> a, b;
  std::vector<float> sa, sb;
  test::QkvCaseMeta meta;  // positions, pages, slots, anchor indices, fp16 anchors, RoPE frequencies
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  Inputs in;
  const int items = c.n_heads + 2 * c.n_kv;
  in.N = items * kHeadDim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(c.rows) * c.K), w(static_cast<size_t>(in.N) * c.K);
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = 0.06f * nd(rng);
  // An outlier channel (3) in every k head: its weight row scaled.
  for (int h = 0; h < c.n_kv; ++h) {
    const size_t row = static_cast<size_t>((c.n_heads + h) * kHeadDim + 3);
    for (int k = 0; k < c.K; ++k) w[row * c.K + k] *= kOutlierGain;
  }
  formats::Fp8Matrix qa = formats::fp8_quantize_per_token(x, c.rows, c.K, "test.x");
  formats::Fp8Matrix qb = formats::fp8_quantize_weight(w, in.N, c.K, "test.w_qkv");
  in.a = std::move(qa.codes);
  in.sa = std::move(qa.scales);
  in.b = std::move(qb.codes);
  in.sb = std::move(qb.scales);

  // Metadata as the other qkv prologue tests draw it (padding rows, shuffled cells, anchors or none); the new
  // sequence's rows use anchor slot 0 (the slot the anchor kernel fills in the keys-to-qkv mode).
  test::QkvCaseMeta meta =
      test::make_qkv_case_meta({c.n_heads, c.n_kv, kHeadDim}, c.rows, rng, kMaxPosition, kRopeTheta);
  for (int r = 0; r < std::min(c.rows, kNewSequenceRows); ++r) meta.anchor[static_cast<size_t>(r)] = 0;
  in.meta = std::move(meta);
  return in;
}

void check(const Case& c, uint32_t seed) {
  const int hb = c.hadamard_block >= 0 ? c.hadamard_block
                                       : static_cast<int>(formats::kv_hadamard_block(c.format, kHeadDim));
  SCOPED_TRACE(testing::Message() << "gemm_fp8_qkv " << formats::kv_format_name(c.format) << " heads " << c.n_heads
                                  << "/" << c.n_kv << " rows " << c.rows << " K " << c.K << " q block " << hb
                                  << (c.keys_to_qkv ? " keys to qkv" : " keys to the cache") << " seed " << seed);
  const Inputs in = make_inputs(c, seed);
  const bool hadamard = c.format == KvFormat::INT4_HADAMARD;
  const int k_offset = c.n_heads * kHeadDim;
  const formats::KvPageLayout L = formats::kv_page_layout(c.format, kHeadDim);
  const test::QkvCaseMeta& meta = in.meta;
  const size_t pool_bytes = static_cast<size_t>(meta.n_pages) * c.n_kv * static_cast<size_t>(L.page_bytes);
  const size_t q_elems = static_cast<size_t>(c.rows) * c.n_heads * kHeadDim;
  const size_t qkv_elems = static_cast<size_t>(c.rows) * in.N;

  DeviceBuffer<uint8_t> a(in.a), b(in.b);
  DeviceBuffer<float> sa(in.sa), sb(in.sb), inv_freq(meta.inv_freq);
  DeviceBuffer<int32_t> positions(meta.positions), page(meta.page), slot(meta.slot), row_anchor(meta.anchor);
  const std::vector<int32_t> first = {0}, count = {std::min(c.rows, kNewSequenceRows)}, index = {0};
  DeviceBuffer<int32_t> d_first(first), d_count(count), d_index(index);
  DeviceBuffer<uint16_t> anchors_ref(meta.anchors), anchors_got(meta.anchors);
  DeviceBuffer<uint16_t> qkv_ref(qkv_elems), qkv_got(qkv_elems), q_ref(q_elems), q_got(q_elems);
  DeviceBuffer<uint8_t> pool_ref(pool_bytes), pool_got(pool_bytes);
  DeviceBuffer<float> table(static_cast<size_t>(c.rows) * kHeadDim);
  for (auto* buf : {&qkv_ref, &qkv_got, &q_ref, &q_got}) ASSERT_EQ(buf->poison(), cudaSuccess);
  ASSERT_EQ(pool_ref.poison(), cudaSuccess);
  ASSERT_EQ(pool_got.poison(), cudaSuccess);
  ASSERT_EQ(table.poison(), cudaSuccess);
  auto bf = [](DeviceBuffer<uint16_t>& d) { return reinterpret_cast<__nv_bfloat16*>(d.p); };
  const bool new_sequence = c.keys_to_qkv && hadamard;  // the anchor of slot 0 is computed between RoPE and append

  // Unfused.
  cudaError_t e = cuda::gemm_fp8(a.p, b.p, sa.p, sb.p, bf(qkv_ref), c.rows, in.N, c.K, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cuda::gemm_fp8_last_error();
  ASSERT_EQ(cuda::rope_qk_bf16(bf(qkv_ref), positions.p, inv_freq.p, c.rows, c.n_heads, c.n_kv, kHeadDim, nullptr),
            cudaSuccess)
      << cuda::decoder_ops_last_error();
  if (new_sequence) {
    ASSERT_EQ(cuda::kv_key_anchor_compute(bf(qkv_ref), in.N, k_offset, c.n_kv, kHeadDim, 1, d_first.p, d_count.p,
                                          d_index.p, anchors_ref.p, nullptr),
              cudaSuccess)
        << cuda::kv_append_last_error();
  }
  e = cuda::kv_append_rotate_q(c.format, bf(qkv_ref), c.rows, c.n_heads, c.n_kv, kHeadDim, page.p, slot.p,
                               hadamard ? anchors_ref.p : nullptr, hadamard ? row_anchor.p : nullptr, pool_ref.p, hb,
                               bf(q_ref), nullptr);
  ASSERT_EQ(e, cudaSuccess) << cuda::fused_ops_last_error();

  // Fused.
  ASSERT_EQ(cuda::rope_cos_sin_table(positions.p, inv_freq.p, c.rows, kHeadDim, table.p, nullptr), cudaSuccess)
      << cuda::decoder_ops_last_error();
  cuda::GemmFp8QkvArgs args;
  args.format = c.format;
  args.n_heads = c.n_heads;
  args.n_kv_heads = c.n_kv;
  args.rope_cos_sin = table.p;
  args.row_page = page.p;
  args.row_slot = slot.p;
  args.key_anchors = hadamard ? anchors_got.p : nullptr;
  args.row_anchor = hadamard ? row_anchor.p : nullptr;
  args.kv_pool = pool_got.p;
  args.hadamard_block = hb;
  args.q_out = bf(q_got);
  args.qkv_keys = c.keys_to_qkv ? bf(qkv_got) : nullptr;
  e = cuda::gemm_fp8_qkv(a.p, b.p, sa.p, sb.p, c.rows, c.K, args, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_fp8_qkv_last_error();
  if (c.keys_to_qkv) {
    if (new_sequence) {
      ASSERT_EQ(cuda::kv_key_anchor_compute(bf(qkv_got), in.N, k_offset, c.n_kv, kHeadDim, 1, d_first.p, d_count.p,
                                            d_index.p, anchors_got.p, nullptr),
                cudaSuccess)
          << cuda::kv_append_last_error();
    }
    e = cuda::kv_append_keys(c.format, bf(qkv_got), c.rows, c.n_heads, c.n_kv, kHeadDim, page.p, slot.p,
                             hadamard ? anchors_got.p : nullptr, hadamard ? row_anchor.p : nullptr, pool_got.p,
                             nullptr);
    ASSERT_EQ(e, cudaSuccess) << cuda::fused_ops_last_error();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<uint8_t> pg = pool_got.download(), pr = pool_ref.download();
  const std::vector<uint16_t> qg = q_got.download(), qr = q_ref.download();
  EXPECT_SAME_BITS(pg, pr, "page pool byte");
  EXPECT_SAME_BITS(qg, qr, "q_out");
  if (hadamard) EXPECT_SAME_BITS(anchors_got.download(), anchors_ref.download(), "key anchors");
  const std::vector<uint16_t> kg = qkv_got.download(), kr = qkv_ref.download();
  for (int r = 0; r < c.rows; ++r) {
    for (int j = 0; j < in.N; ++j) {
      const size_t i = static_cast<size_t>(r) * in.N + j;
      const bool key = j >= k_offset && j < k_offset + c.n_kv * kHeadDim;
      if (c.keys_to_qkv && key) {
        ASSERT_EQ(kg[i], kr[i]) << "RoPE'd key, row " << r << " column " << j;
      } else {
        ASSERT_EQ(kg[i], 0xFFFF) << "qkv element written that should not be: row " << r << " column " << j;
      }
    }
  }
  // Not vacuous: every q_out element written and finite, the pool written somewhere (row 0 is never padding).
  for (size_t i = 0; i < qg.size(); ++i) ASSERT_FALSE((qg[i] & 0x7fff) >= 0x7f80) << "q_out element " << i;
  EXPECT_NE(std::count(pg.begin(), pg.end(), uint8_t{0xFF}), static_cast<ptrdiff_t>(pg.size()));
}

// Both cache formats and both key modes on the 8B head layout (32 / 8) and a 9 / 3 layout; one row, a partial last
// row tile (130, 300 rows), a K with a partial last 128-deep block (1040); q blocks: the format's, none, 32.
TEST(GemmFp8QkvGpu, EqualsGemmRopeAndAppendBitForBit) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 500;
  for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::INT4}) {
    for (bool keys_to_qkv : {false, true}) {
      for (int rows : {1, 130, 300}) check({f, 32, 8, rows, 256, -1, keys_to_qkv}, seed += 13);
      check({f, 9, 3, 77, 1040, -1, keys_to_qkv}, seed += 13);
      check({f, 32, 8, 64, 512, 0, keys_to_qkv}, seed += 13);
      check({f, 32, 8, 64, 512, 32, keys_to_qkv}, seed += 13);
    }
  }
}

// One small case per key mode (compute-sanitizer runs this one: racecheck / memcheck of the epilogue hand-over).
TEST(GemmFp8QkvGpu, SmallCasesForSanitizers) {
  FT_REQUIRE_CUDA_DEVICE();
  check({KvFormat::INT4_HADAMARD, 9, 3, 77, 256, -1, true}, 700);
  check({KvFormat::INT4_HADAMARD, 9, 3, 200, 256, -1, false}, 701);
}

// The 8B projection at prefill size (K = 4096, 2048 rows: several tiles per CTA, every epilogue round).
TEST(GemmFp8QkvGpu, EightBShapeAt2048Rows) {
  FT_REQUIRE_CUDA_DEVICE();
  check({KvFormat::INT4_HADAMARD, 32, 8, 2048, 4096, -1, true}, 900);
  check({KvFormat::INT4_HADAMARD, 32, 8, 2048, 4096, -1, false}, 901);
}

// rope_cos_sin_table against the host's fp64 angle, cos and sin rounded to fp32 (ref::apply_rope's arithmetic).
TEST(GemmFp8QkvGpu, RopeTableMatchesTheHostAngles) {
  FT_REQUIRE_CUDA_DEVICE();
  const int rows = 300;
  std::mt19937 rng(77);
  std::vector<int32_t> pos(rows);
  for (int r = 0; r < rows; ++r) pos[static_cast<size_t>(r)] = r == 0 ? 0 : static_cast<int32_t>(rng() % kMaxPosition);
  const std::vector<float> inv = ref::rope_inv_freq(kHeadDim, kRopeTheta, RopeScaling{});
  DeviceBuffer<int32_t> d_pos(pos);
  DeviceBuffer<float> d_inv(inv), out(static_cast<size_t>(rows) * kHeadDim);
  ASSERT_EQ(out.poison(), cudaSuccess);
  ASSERT_EQ(cuda::rope_cos_sin_table(d_pos.p, d_inv.p, rows, kHeadDim, out.p, nullptr), cudaSuccess)
      << cuda::decoder_ops_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = out.download();
  auto ulps = [](float x, float y) {
    int32_t a, b;
    std::memcpy(&a, &x, 4);
    std::memcpy(&b, &y, 4);
    if ((a < 0) != (b < 0)) return (a & 0x7fffffff) + (b & 0x7fffffff);
    return std::abs(a - b);
  };
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < kHeadDim / 2; ++i) {
      const double angle = static_cast<double>(pos[static_cast<size_t>(r)]) * static_cast<double>(inv[static_cast<size_t>(i)]);
      const size_t at = (static_cast<size_t>(r) * (kHeadDim / 2) + i) * 2;
      ASSERT_LE(ulps(got[at], static_cast<float>(std::cos(angle))), kTableMaxUlps) << "cos, row " << r << " pair " << i;
      ASSERT_LE(ulps(got[at + 1], static_cast<float>(std::sin(angle))), kTableMaxUlps) << "sin, row " << r << " pair " << i;
    }
  }
}

// --- Host-only argument checks ------------------------------------------------------------------------------------

TEST(Fp8QkvHost, RejectsShapesItCannotRun) {
  std::string why;
  EXPECT_EQ(cuda::gemm_fp8_qkv_can_implement(KvFormat::INT4_HADAMARD, 2048, 32, 8, 128, 4096, 128, &why), cudaSuccess)
      << why;
  EXPECT_EQ(cuda::gemm_fp8_qkv_can_implement(KvFormat::BF16, 16, 32, 8, 128, 4096, 0, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("int4 or int4-hadamard"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_fp8_qkv_can_implement(KvFormat::INT4, 16, 32, 8, 64, 4096, 0, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("head_dim = 64"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_fp8_qkv_can_implement(KvFormat::INT4, 16, 32, 8, 128, 4096, 48, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("hadamard_block = 48"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_fp8_qkv_can_implement(KvFormat::INT4, 16, 32, 8, 128, 4100, 0, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("K = 4100"), std::string::npos) << why;
  EXPECT_EQ(why.rfind("gemm_fp8_qkv", 0), 0u) << why;
  EXPECT_EQ(cuda::gemm_fp8_qkv_can_implement(KvFormat::INT4, 0, 32, 8, 128, 4096, 0, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("M = 0"), std::string::npos) << why;
}

// Host arrays stand in for device pointers: every call below is refused before any CUDA call dereferences them.
TEST(Fp8QkvHost, RejectsMissingPointersAndOtherCaches) {
  alignas(16) static uint8_t bytes[4096];
  alignas(16) static float f[256];
  alignas(16) static int32_t meta[64];
  cuda::GemmFp8QkvArgs args;
  args.format = KvFormat::INT4_HADAMARD;
  args.n_heads = 2;
  args.n_kv_heads = 1;
  args.rope_cos_sin = f;
  args.row_page = meta;
  args.row_slot = meta;
  args.kv_pool = bytes;
  args.q_out = reinterpret_cast<__nv_bfloat16*>(bytes);
  // int4-hadamard without anchors.
  EXPECT_EQ(cuda::gemm_fp8_qkv(bytes, bytes, f, f, 4, 128, args, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_fp8_qkv_last_error()).find("key_anchors"), std::string::npos)
      << cuda::gemm_fp8_qkv_last_error();
  args.format = KvFormat::INT4;
  args.rope_cos_sin = nullptr;
  EXPECT_EQ(cuda::gemm_fp8_qkv(bytes, bytes, f, f, 4, 128, args, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_fp8_qkv_last_error()).find("rope_cos_sin"), std::string::npos)
      << cuda::gemm_fp8_qkv_last_error();
  args.rope_cos_sin = f;
  args.qkv_keys = reinterpret_cast<__nv_bfloat16*>(bytes + 2);  // misaligned
  EXPECT_EQ(cuda::gemm_fp8_qkv(bytes, bytes, f, f, 4, 128, args, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_fp8_qkv_last_error()).find("qkv_keys"), std::string::npos)
      << cuda::gemm_fp8_qkv_last_error();

  const auto* qkv = reinterpret_cast<const __nv_bfloat16*>(bytes);
  EXPECT_EQ(cuda::kv_append_keys(KvFormat::FP8, qkv, 4, 2, 1, 128, meta, meta, nullptr, nullptr, bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::fused_ops_last_error()).find("int4 or int4-hadamard"), std::string::npos)
      << cuda::fused_ops_last_error();
  EXPECT_EQ(cuda::kv_append_keys(KvFormat::INT4, qkv, 4, 2, 1, 64, meta, meta, nullptr, nullptr, bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::kv_append_keys(KvFormat::INT4_HADAMARD, qkv, 4, 2, 1, 128, meta, meta, nullptr, nullptr, bytes,
                                 nullptr),
            cudaErrorInvalidValue);  // no anchors
  EXPECT_NE(std::string(cuda::fused_ops_last_error()).find("key_anchors"), std::string::npos)
      << cuda::fused_ops_last_error();
  EXPECT_EQ(cuda::rope_cos_sin_table(meta, f, 4, 127, f, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::decoder_ops_last_error()).find("head_dim = 127"), std::string::npos)
      << cuda::decoder_ops_last_error();
}

// gemm_fp8_rope (the engine's fused_fp8_rope): bit for bit gemm_fp8 + rope_qk_bf16 over the whole poisoned output —
// the q and k heads rotated, the v heads stored as gemm_fp8 stores them — at row counts with tails and three GQA
// shapes, from the pass's table (rope_cos_sin_table).
TEST(GemmFp8RopeGpu, BitIdenticalToGemmThenRope) {
  FT_REQUIRE_HOPPER();
  for (const Case& c : {Case{KvFormat::INT4, 4, 2, 1, 256, 0, false}, Case{KvFormat::INT4, 8, 2, 65, 512, 0, false},
                        Case{KvFormat::INT4, 4, 1, 300, 1040, 0, false}}) {
    SCOPED_TRACE(testing::Message() << "gemm_fp8_rope heads " << c.n_heads << "/" << c.n_kv << " rows " << c.rows
                                    << " K " << c.K);
    const Inputs in = make_inputs(c, 900u + static_cast<uint32_t>(c.rows));
    const size_t elems = static_cast<size_t>(c.rows) * in.N;
    DeviceBuffer<uint8_t> a(in.a), b(in.b);
    DeviceBuffer<float> sa(in.sa), sb(in.sb), inv_freq(in.meta.inv_freq);
    DeviceBuffer<int32_t> positions(in.meta.positions);
    DeviceBuffer<uint16_t> ref(elems), got(elems);
    DeviceBuffer<float> table(static_cast<size_t>(c.rows) * kHeadDim);
    ASSERT_EQ(ref.poison(), cudaSuccess);
    ASSERT_EQ(got.poison(), cudaSuccess);
    ASSERT_EQ(table.poison(), cudaSuccess);
    auto bf = [](DeviceBuffer<uint16_t>& d) { return reinterpret_cast<__nv_bfloat16*>(d.p); };
    ASSERT_EQ(cuda::rope_cos_sin_table(positions.p, inv_freq.p, c.rows, kHeadDim, table.p, nullptr), cudaSuccess)
        << cuda::decoder_ops_last_error();
    ASSERT_EQ(cuda::gemm_fp8(a.p, b.p, sa.p, sb.p, bf(ref), c.rows, in.N, c.K, nullptr), cudaSuccess)
        << cuda::gemm_fp8_last_error();
    ASSERT_EQ(cuda::rope_qk_bf16(bf(ref), positions.p, inv_freq.p, c.rows, c.n_heads, c.n_kv, kHeadDim, nullptr),
              cudaSuccess)
        << cuda::decoder_ops_last_error();
    ASSERT_EQ(cuda::gemm_fp8_rope(a.p, b.p, sa.p, sb.p, bf(got), table.p, c.n_heads + c.n_kv, c.rows, in.N, c.K,
                                  nullptr),
              cudaSuccess)
        << cuda::gemm_fp8_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> r = ref.download(), g = got.download();
    size_t mismatches = 0, first = elems;
    for (size_t i = 0; i < elems; ++i)
      if (r[i] != g[i] && mismatches++ == 0) first = i;
    EXPECT_EQ(mismatches, 0u) << "first at row " << first / static_cast<size_t>(in.N) << " column "
                              << first % static_cast<size_t>(in.N);
  }
}

// Refusals name the argument and write nothing: rope_heads out of 1 .. N / 128, N not a multiple of 128, a null or
// misaligned table, and gemm_fp8's own shape checks first.
TEST(GemmFp8RopeGpu, RejectedCallsLeaveTheOutputUntouched) {
  FT_REQUIRE_HOPPER();
  const Case c{KvFormat::INT4, 4, 2, 4, 256, 0, false};
  const Inputs in = make_inputs(c, 950);
  DeviceBuffer<uint8_t> a(in.a), b(in.b);
  DeviceBuffer<float> sa(in.sa), sb(in.sb), table(static_cast<size_t>(c.rows) * kHeadDim + 4);
  DeviceBuffer<uint16_t> d(static_cast<size_t>(c.rows) * in.N);
  ASSERT_EQ(d.poison(), cudaSuccess);
  auto* out = reinterpret_cast<__nv_bfloat16*>(d.p);
  struct Bad {
    const float* table;
    int heads, N, K;
    const char* needle;
  };
  for (const Bad& x : {Bad{table.p, 0, in.N, c.K, "rope_heads = 0"}, Bad{table.p, 9, in.N, c.K, "rope_heads = 9"},
                       Bad{table.p, 1, 1000, c.K, "N = 1000"}, Bad{nullptr, 6, in.N, c.K, "rope_cos_sin"},
                       Bad{table.p + 2, 6, in.N, c.K, "16-byte aligned"}, Bad{table.p, 6, in.N, 200, "K = 200"}}) {
    EXPECT_EQ(cuda::gemm_fp8_rope(a.p, b.p, sa.p, sb.p, out, x.table, x.heads, c.rows, x.N, x.K, nullptr),
              cudaErrorInvalidValue)
        << x.needle;
    EXPECT_NE(std::string(cuda::gemm_fp8_last_error()).find(x.needle), std::string::npos)
        << "message '" << cuda::gemm_fp8_last_error() << "' lacks '" << x.needle << "'";
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : d.download()) ASSERT_EQ(v, 0xFFFF);
}

}  // namespace
