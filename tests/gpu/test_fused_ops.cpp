// GPU tests of the fused decoder ops (include/futransformer/cuda/fused_ops.h) against the unfused launcher
// sequences they replace, bit for bit: x and y of add_residual_bf16 + rmsnorm_bf16; qkv (after RoPE), every byte of
// the 0xFF-poisoned page pool and q_out of rope_qk_bf16 + kv_append + rotate_heads_bf16 (and of kv_append +
// rotate_heads_bf16 for the no-RoPE variant). Inputs are fresh seeded random values, outputs poisoned before each
// run on both sides, so an element either side leaves unwritten shows (and is checked for separately). The unfused
// ops have their own tests against the CPU twins (test_decoder_ops.cpp, test_kv_append.cpp), which make those
// the oracle here. Device tests report SKIPPED without a CUDA device; the FusedOpsHost tests need none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/engine/engine_kernels.h"
#include "cuda/fused_ops_internal.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fused_ops.h"
#include "futransformer/cuda/kv_append.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "gpu_test_util.h"
#include "ref/ops.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;

// Tolerance: none. Every comparison below is bit for bit (the contract of fused_ops.h).
constexpr KvFormat kAllFormats[] = {KvFormat::BF16, KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD};
const std::vector<int> kRows = {1, 3, 17, 64};
constexpr int kPageTokens = static_cast<int>(formats::kKvPageTokens);
constexpr int kAnchors = 3;             // anchor vectors per KV head
constexpr float kOutlierGain = 30.0f;   // one K channel per head, as real keys have
constexpr double kRopeTheta = 500000.0; // Llama 3
constexpr int kMaxPosition = 131072;

// Index of the first element where two equally long vectors differ, or -1.
template <typename T>
int64_t first_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string hex(uint64_t v) {
  char s[24];
  std::snprintf(s, sizeof s, "0x%llx", static_cast<unsigned long long>(v));
  return s;
}

template <typename T>
std::string mismatch_text(const std::vector<T>& got, const std::vector<T>& want, int64_t i) {
  uint64_t g = 0, w = 0;
  std::memcpy(&g, &got[static_cast<size_t>(i)], sizeof(T));
  std::memcpy(&w, &want[static_cast<size_t>(i)], sizeof(T));
  return "element " + std::to_string(i) + ": fused bits " + hex(g) + ", unfused " + hex(w);
}

// Bitwise comparison that prints the first difference, not both arrays.
#define EXPECT_SAME_BITS(got, want, what)                                                           \
  do {                                                                                              \
    const int64_t at_ = first_mismatch(got, want);                                                  \
    EXPECT_EQ(at_, -1) << what << " differs at " << (at_ >= 0 ? mismatch_text(got, want, at_) : ""); \
  } while (0)

// A device copy of `host` starting `offset` elements into a poisoned allocation (offset > 0 misaligns it).
template <typename T>
struct OffsetBuffer {
  DeviceBuffer<T> buf;
  size_t n;
  int offset;
  OffsetBuffer(size_t count, int off) : buf(count + static_cast<size_t>(off)), n(count), offset(off) {
    EXPECT_EQ(buf.poison(), cudaSuccess);
  }
  OffsetBuffer(const std::vector<T>& host, int off) : OffsetBuffer(host.size(), off) {
    EXPECT_EQ(cudaMemcpy(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  T* get() const { return buf.p + offset; }
  std::vector<T> download() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// --- add_residual_rmsnorm_bf16 -----------------------------------------------------------------------------------

struct NormCase {
  int hidden;
  int x_offset, delta_offset, y_offset;  // elements; 0 = allocation-aligned
  const char* what;
};

// float4 instance with 8-byte delta loads, with element-wise delta loads, the scalar instance (odd hidden or a
// misaligned x / y), one or several units per thread, fewer units than a warp.
const NormCase kNormCases[] = {
    {4096, 0, 0, 0, "Llama-8B width, vector"},
    {4096, 0, 4, 0, "vector x, delta 8-byte aligned only"},
    {4096, 0, 2, 0, "vector x, delta 4-byte aligned only"},
    {4096, 0, 1, 0, "vector x, delta 2-byte aligned only"},
    {4096, 1, 0, 0, "misaligned x: scalar"},
    {4096, 0, 0, 1, "misaligned y: scalar"},
    {4095, 0, 0, 0, "odd width: scalar"},
    {5120, 0, 0, 0, "1280 float4 units: two per thread for some"},
    {16384, 0, 0, 0, "four float4 per thread"},
    {1000, 0, 0, 0, "250 units, partial last warp"},
    {12, 0, 0, 0, "three units"},
    {3, 0, 0, 0, "three elements, scalar"},
};

void check_norm(const NormCase& c, int rows, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << c.what << ": hidden " << c.hidden << " rows " << rows << " seed " << seed);
  const size_t n = static_cast<size_t>(rows) * c.hidden;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n), weight(static_cast<size_t>(c.hidden));
  std::vector<uint16_t> delta(n);
  for (float& v : x) v = 3.0f * nd(rng);
  for (uint16_t& b : delta) b = f32_to_bf16(nd(rng));
  for (float& w : weight) w = 1.0f + 0.25f * nd(rng);
  const float eps = 1e-5f;

  DeviceBuffer<float> d_weight(weight);
  OffsetBuffer<uint16_t> d_delta(delta, c.delta_offset);
  const auto* dl = reinterpret_cast<const __nv_bfloat16*>(d_delta.get());
  // Unfused: the engine's two calls.
  OffsetBuffer<float> x_ref(x, c.x_offset);
  OffsetBuffer<uint16_t> y_ref(n, c.y_offset);
  ASSERT_EQ(cuda::add_residual_bf16(x_ref.get(), dl, rows, c.hidden, nullptr), cudaSuccess)
      << cuda::decoder_ops_last_error();
  ASSERT_EQ(cuda::rmsnorm_bf16(x_ref.get(), d_weight.p, reinterpret_cast<__nv_bfloat16*>(y_ref.get()), rows,
                               c.hidden, eps, nullptr),
            cudaSuccess)
      << cuda::decoder_ops_last_error();
  // Fused.
  OffsetBuffer<float> x_got(x, c.x_offset);
  OffsetBuffer<uint16_t> y_got(n, c.y_offset);
  const cudaError_t e = cuda::add_residual_rmsnorm_bf16(x_got.get(), dl, d_weight.p,
                                                        reinterpret_cast<__nv_bfloat16*>(y_got.get()), rows,
                                                        c.hidden, eps, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::fused_ops_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<float> xg = x_got.download(), xr = x_ref.download();
  const std::vector<uint16_t> yg = y_got.download(), yr = y_ref.download();
  EXPECT_SAME_BITS(xg, xr, "x");
  EXPECT_SAME_BITS(yg, yr, "y");
  // Neither side can pass by leaving its poison: the inputs are finite, so a NaN is an unwritten element. The
  // residual add is one fp32 rounding, which the host reproduces exactly.
  for (size_t i = 0; i < n; ++i) {
    ASSERT_FALSE((yg[i] & 0x7fff) > 0x7f80) << "y element " << i << " was not written";
    ASSERT_EQ(xg[i], x[i] + bf16_to_f32(delta[i])) << "x element " << i;
  }
}

TEST(FusedOpsGpu, AddResidualRmsnormMatchesTheTwoOpsBitForBit) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 100;
  for (const NormCase& c : kNormCases) {
    for (int rows : kRows) check_norm(c, rows, seed += 7);
  }
}

// --- qkv_rope_kv_append / kv_append_rotate_q ---------------------------------------------------------------------

struct QkvCase {
  KvFormat format;
  int n_heads, n_kv, head_dim, rows;
  int hadamard_block;  // the q rotation; -1: the engine's choice, formats::kv_hadamard_block(format, head_dim)
};

// Host inputs of one case.
struct QkvInputs {
  int row_width = 0, n_pages = 0;
  std::vector<uint16_t> qkv;  // [rows][q | k | v]
  std::vector<int32_t> positions, page, slot, anchor;
  std::vector<float> inv_freq;
  std::vector<uint16_t> anchors;  // fp16 [kAnchors][n_kv][head_dim]
};

// N(0,1) heads with one outlier K channel; every 7th row (from row 3) has an all-zero K head 0 and a -0 V of the
// last head (the unit-scale rules of int4 and fp8). Positions random up to 128k (row 0 at 0: RoPE is then the
// identity); distinct random (page, slot) cells with every 9th row (from row 4) a padding row; an anchor index per
// row, -1 (none) for every 4th.
QkvInputs make_inputs(const QkvCase& c, uint32_t seed) {
  QkvInputs in;
  in.row_width = (c.n_heads + 2 * c.n_kv) * c.head_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  in.qkv.resize(static_cast<size_t>(c.rows) * in.row_width);
  for (uint16_t& b : in.qkv) b = f32_to_bf16(nd(rng));
  const int k_offset = c.n_heads * c.head_dim, v_offset = k_offset + c.n_kv * c.head_dim;
  for (int r = 0; r < c.rows; ++r) {
    uint16_t* row = in.qkv.data() + static_cast<size_t>(r) * in.row_width;
    for (int h = 0; h < c.n_kv; ++h)
      row[k_offset + h * c.head_dim + 3 % c.head_dim] = f32_to_bf16(kOutlierGain * (2.0f + nd(rng)));
    if (r % 7 == 3) {
      std::fill_n(row + k_offset, c.head_dim, uint16_t{0});
      std::fill_n(row + v_offset + (c.n_kv - 1) * c.head_dim, c.head_dim, uint16_t{0x8000});
    }
  }
  std::uniform_int_distribution<int> pos(0, kMaxPosition - 1);
  for (int r = 0; r < c.rows; ++r) in.positions.push_back(r == 0 ? 0 : pos(rng));
  in.inv_freq = ref::rope_inv_freq(c.head_dim, kRopeTheta, RopeScaling{});

  in.n_pages = (c.rows + kPageTokens - 1) / kPageTokens + 2;
  std::vector<int32_t> cells(static_cast<size_t>(in.n_pages) * kPageTokens);
  std::iota(cells.begin(), cells.end(), 0);
  std::shuffle(cells.begin(), cells.end(), rng);
  for (int r = 0; r < c.rows; ++r) {
    const int32_t cell = cells[static_cast<size_t>(r)];
    in.page.push_back(r % 9 == 4 ? -1 : cell / kPageTokens);
    in.slot.push_back(cell % kPageTokens);
    in.anchor.push_back(r % 4 == 2 ? -1 : static_cast<int32_t>(rng() % kAnchors));
  }
  std::normal_distribution<float> anchor_nd(0.0f, 3.0f);
  in.anchors.resize(static_cast<size_t>(kAnchors) * c.n_kv * c.head_dim);
  for (uint16_t& a : in.anchors) a = f32_to_f16(anchor_nd(rng));
  return in;
}

// Device state of one side (unfused or fused): its own qkv copy, poisoned pool and q_out, shared read-only inputs.
struct QkvSide {
  DeviceBuffer<uint16_t> qkv, q_out;
  DeviceBuffer<uint8_t> pool;
  QkvSide(const QkvInputs& in, size_t q_elems, size_t pool_bytes) : qkv(in.qkv), q_out(q_elems), pool(pool_bytes) {
    EXPECT_EQ(q_out.poison(), cudaSuccess);
    EXPECT_EQ(pool.poison(), cudaSuccess);
  }
  __nv_bfloat16* qkv_bf() const { return reinterpret_cast<__nv_bfloat16*>(qkv.p); }
  __nv_bfloat16* q_bf() const { return reinterpret_cast<__nv_bfloat16*>(q_out.p); }
};

// rope: qkv_rope_kv_append against rope_qk_bf16 + kv_append + rotate_heads_bf16. !rope: both sides first run
// rope_qk_bf16 and (int4-hadamard) kv_key_anchor_compute of the first rows into anchor slot 0, as the engine does
// for a pass that starts sequences; then kv_append_rotate_q against kv_append + rotate_heads_bf16.
void check_qkv(const QkvCase& c, bool rope, uint32_t seed) {
  const int hb = c.hadamard_block >= 0 ? c.hadamard_block
                                       : static_cast<int>(formats::kv_hadamard_block(c.format, c.head_dim));
  SCOPED_TRACE(testing::Message() << (rope ? "qkv_rope_kv_append " : "kv_append_rotate_q ")
                                  << formats::kv_format_name(c.format) << " heads " << c.n_heads << "/" << c.n_kv
                                  << " head_dim " << c.head_dim << " rows " << c.rows << " hadamard_block " << hb
                                  << " seed " << seed);
  const QkvInputs in = make_inputs(c, seed);
  const formats::KvPageLayout L = formats::kv_page_layout(c.format, c.head_dim);
  const size_t pool_bytes = static_cast<size_t>(in.n_pages) * c.n_kv * static_cast<size_t>(L.page_bytes);
  const size_t q_elems = static_cast<size_t>(c.rows) * c.n_heads * c.head_dim;
  const int k_offset = c.n_heads * c.head_dim, v_offset = k_offset + c.n_kv * c.head_dim;
  const bool hadamard = c.format == KvFormat::INT4_HADAMARD;

  DeviceBuffer<int32_t> positions(in.positions), page(in.page), slot(in.slot), row_anchor(in.anchor);
  DeviceBuffer<float> inv_freq(in.inv_freq);
  QkvSide ref(in, q_elems, pool_bytes), got(in, q_elems, pool_bytes);
  DeviceBuffer<uint16_t> anchors_ref(in.anchors), anchors_got(in.anchors);
  // The first min(rows, 5) rows are one new sequence's first chunk, whose anchor goes to slot 0.
  const std::vector<int32_t> first = {0}, count = {std::min(c.rows, 5)}, index = {0};
  DeviceBuffer<int32_t> d_first(first), d_count(count), d_index(index);

  auto prologue = [&](QkvSide& s, uint16_t* anchors) {
    ASSERT_EQ(cuda::rope_qk_bf16(s.qkv_bf(), positions.p, inv_freq.p, c.rows, c.n_heads, c.n_kv, c.head_dim, nullptr),
              cudaSuccess)
        << cuda::decoder_ops_last_error();
    if (hadamard) {
      ASSERT_EQ(cuda::kv_key_anchor_compute(s.qkv_bf(), in.row_width, k_offset, c.n_kv, c.head_dim, 1, d_first.p,
                                            d_count.p, d_index.p, anchors, nullptr),
                cudaSuccess)
          << cuda::kv_append_last_error();
    }
  };

  // Unfused.
  if (rope) {
    ASSERT_EQ(cuda::rope_qk_bf16(ref.qkv_bf(), positions.p, inv_freq.p, c.rows, c.n_heads, c.n_kv, c.head_dim,
                                 nullptr),
              cudaSuccess)
        << cuda::decoder_ops_last_error();
  } else {
    prologue(ref, anchors_ref.p);
  }
  ASSERT_EQ(cuda::kv_append(c.format, ref.qkv_bf(), in.row_width, k_offset, v_offset, c.rows, c.n_kv, c.head_dim,
                            page.p, slot.p, hadamard ? anchors_ref.p : nullptr, hadamard ? row_anchor.p : nullptr,
                            ref.pool.p, nullptr),
            cudaSuccess)
      << cuda::kv_append_last_error();
  ASSERT_EQ(cuda::rotate_heads_bf16(ref.qkv_bf(), in.row_width, ref.q_bf(), c.rows, c.n_heads, c.head_dim, hb,
                                    nullptr),
            cudaSuccess);

  // Fused.
  cudaError_t e;
  if (rope) {
    e = cuda::qkv_rope_kv_append(c.format, got.qkv_bf(), c.rows, c.n_heads, c.n_kv, c.head_dim, positions.p,
                                 inv_freq.p, page.p, slot.p, hadamard ? anchors_got.p : nullptr,
                                 hadamard ? row_anchor.p : nullptr, got.pool.p, hb, got.q_bf(), nullptr);
  } else {
    prologue(got, anchors_got.p);
    e = cuda::kv_append_rotate_q(c.format, got.qkv_bf(), c.rows, c.n_heads, c.n_kv, c.head_dim, page.p, slot.p,
                                 hadamard ? anchors_got.p : nullptr, hadamard ? row_anchor.p : nullptr, got.pool.p,
                                 hb, got.q_bf(), nullptr);
  }
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::fused_ops_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<uint16_t> qkv_g = got.qkv.download(), qkv_r = ref.qkv.download();
  const std::vector<uint16_t> q_g = got.q_out.download(), q_r = ref.q_out.download();
  const std::vector<uint8_t> pool_g = got.pool.download(), pool_r = ref.pool.download();
  EXPECT_SAME_BITS(qkv_g, qkv_r, "qkv after RoPE");
  EXPECT_SAME_BITS(q_g, q_r, "q_out");
  EXPECT_SAME_BITS(pool_g, pool_r, "page pool byte");
  if (!rope && hadamard) EXPECT_SAME_BITS(anchors_got.download(), anchors_ref.download(), "key anchors");

  // Not vacuous: every q_out element written (finite inputs give no NaN), the pool written somewhere (row 0 is
  // never padding), and RoPE applied (rows past 0 have random positions).
  for (size_t i = 0; i < q_g.size(); ++i) ASSERT_FALSE((q_g[i] & 0x7fff) > 0x7f80) << "q_out element " << i;
  EXPECT_NE(std::count(pool_g.begin(), pool_g.end(), uint8_t{0xFF}), static_cast<ptrdiff_t>(pool_g.size()));
  if (c.rows > 1) EXPECT_NE(qkv_g, in.qkv);
}

// The brief's grid: every format, head_dim 64 and 128, GQA 9/3 and 32/8, rows 1, 3, 17, 64, the engine's q
// rotation for the format.
TEST(FusedOpsGpu, QkvRopeKvAppendMatchesTheUnfusedSequenceBitForBit) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 1000;
  for (KvFormat f : kAllFormats) {
    for (int head_dim : {64, 128}) {
      for (auto [nh, nkv] : {std::pair{9, 3}, std::pair{32, 8}}) {
        for (int rows : kRows) check_qkv({f, nh, nkv, head_dim, rows, -1}, true, seed += 11);
      }
    }
  }
}

// Head sizes whose RoPE pairs (i, i + d/2) sit in different lanes (d/2 not a multiple of 32), q rotations with
// other blocks than the format's (lane strides only, register strides up to 128, none), MHA, and the largest row
// count.
TEST(FusedOpsGpu, QkvRopeKvAppendOtherHeadSizesAndBlocks) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 2000;
  const QkvCase cases[] = {
      {KvFormat::INT4_HADAMARD, 6, 2, 96, 17, -1},  // block 32, half 48
      {KvFormat::INT4_HADAMARD, 4, 2, 160, 17, -1}, // block 32, half 80
      {KvFormat::INT4_HADAMARD, 4, 4, 256, 17, -1}, // block 128, 8 registers per lane
      {KvFormat::INT4, 4, 2, 256, 17, 256},         // q block 256: register strides 32, 64, 128
      {KvFormat::INT4, 4, 2, 96, 3, 32},
      {KvFormat::BF16, 6, 3, 80, 17, 16},           // head_dim not a multiple of 32, q block 16
      {KvFormat::BF16, 4, 1, 8, 17, 8},             // smallest head
      {KvFormat::BF16, 4, 2, 40, 3, 0},
      {KvFormat::BF16, 8, 2, 128, 17, 128},         // q rotated although the cache is not
      {KvFormat::FP8, 6, 2, 48, 17, 16},            // half 24
      {KvFormat::FP8, 4, 4, 64, 17, 1},
      {KvFormat::INT4_HADAMARD, 1, 1, 32, 65535, -1},  // rows on the grid's y limit
      {KvFormat::BF16, 2, 1, 8, 65535, 8},
  };
  for (const QkvCase& c : cases) check_qkv(c, true, seed += 11);
}

// The quad-per-head kernel (INT4 caches at head_dim 128), forced on as quads (4 lanes per head) and as octets (8
// lanes), for both entry points: the same bits as the unfused sequence (qkv after RoPE, q_out, every pool byte,
// anchors) on GQA 32/8 and 9/3 (15 items per row: a CTA of 32 quads spans three rows), rows up to the prefill size,
// with and without the q rotation (and a q block of 16, inside an octet lane), with every row's anchor for
// int4-hadamard keys.
class FusedOpsQuadGpu : public ::testing::TestWithParam<cuda::QuadAppend> {};

TEST_P(FusedOpsQuadGpu, QuadKernelMatchesTheUnfusedSequenceBitForBit) {
  FT_REQUIRE_CUDA_DEVICE();
  struct Restore {
    ~Restore() { cuda::set_kv_append_rotate_q_quad(cuda::QuadAppend::kDefault); }
  } restore;
  cuda::set_kv_append_rotate_q_quad(GetParam());
  // Not vacuous: the dispatcher takes the quad kernel for these shapes (cudaMalloc'd buffers are 256-byte aligned).
  const void* aligned16 = reinterpret_cast<const void*>(uintptr_t{256});
  ASSERT_TRUE(cuda::qkv_append_uses_quad(KvFormat::INT4_HADAMARD, 32, 8, 128, aligned16, aligned16));
  ASSERT_TRUE(cuda::qkv_append_uses_quad(KvFormat::INT4, 9, 3, 128, aligned16, aligned16));
  ASSERT_FALSE(cuda::qkv_append_uses_quad(KvFormat::INT4_HADAMARD, 32, 8, 64, aligned16, aligned16));
  ASSERT_FALSE(cuda::qkv_append_uses_quad(KvFormat::FP8, 32, 8, 128, aligned16, aligned16));
  ASSERT_FALSE(cuda::qkv_append_uses_quad(KvFormat::INT4, 4, 2, 128, aligned16, aligned16));  // 8 items per row
  uint32_t seed = 3500;
  for (bool rope : {false, true}) {
    for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
      for (auto [nh, nkv] : {std::pair{32, 8}, std::pair{9, 3}}) {
        for (int rows : {1, 3, 17, 64, 2048}) check_qkv({f, nh, nkv, 128, rows, -1}, rope, seed += 11);
      }
      check_qkv({f, 32, 8, 128, 33, 0}, rope, seed += 11);   // no q rotation
      check_qkv({f, 32, 8, 128, 33, 32}, rope, seed += 11);  // a q block below a quad lane's 32 channels
      check_qkv({f, 32, 8, 128, 9, 16}, rope, seed += 11);   // ... and not above an octet lane's 16
    }
  }
}

INSTANTIATE_TEST_SUITE_P(QuadsAndOctets, FusedOpsQuadGpu,
                         ::testing::Values(cuda::QuadAppend::kOn, cuda::QuadAppend::kOctet),
                         [](const ::testing::TestParamInfo<cuda::QuadAppend>& i) {
                           return i.param == cuda::QuadAppend::kOctet ? std::string("Octets") : std::string("Quads");
                         });

// The no-RoPE variant for passes that start int4-hadamard sequences (anchors computed between RoPE and append).
TEST(FusedOpsGpu, KvAppendRotateQMatchesTheUnfusedSequenceBitForBit) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 3000;
  for (KvFormat f : kAllFormats) {
    for (int head_dim : {64, 128}) {
      for (int rows : kRows) check_qkv({f, 32, 8, head_dim, rows, -1}, false, seed += 11);
    }
  }
  check_qkv({KvFormat::INT4_HADAMARD, 6, 2, 96, 17, -1}, false, seed += 11);
}

// --- Host-only argument checks ------------------------------------------------------------------------------------

// Host arrays stand in for device pointers: every call below is refused before any CUDA call dereferences them.
TEST(FusedOpsHost, AddResidualRmsnormRefusesBadArguments) {
  alignas(16) static float x[64];
  alignas(16) static uint16_t half_bits[256];
  alignas(16) static float w[64];
  auto* delta = reinterpret_cast<const __nv_bfloat16*>(half_bits);
  auto* y = reinterpret_cast<__nv_bfloat16*>(half_bits + 128);
  auto call = [&](float* xp, const __nv_bfloat16* dp, const float* wp, __nv_bfloat16* yp, int rows, int hidden,
                  float eps) { return cuda::add_residual_rmsnorm_bf16(xp, dp, wp, yp, rows, hidden, eps, nullptr); };
  auto message = [] { return std::string(cuda::fused_ops_last_error()); };
  EXPECT_EQ(call(nullptr, delta, w, y, 1, 64, 1e-5f), cudaErrorInvalidValue);
  EXPECT_NE(message().find("non-null"), std::string::npos) << message();
  EXPECT_EQ(call(x, delta, nullptr, y, 1, 64, 1e-5f), cudaErrorInvalidValue);
  EXPECT_EQ(call(x, delta, w, y, 0, 64, 1e-5f), cudaErrorInvalidValue);
  EXPECT_NE(message().find("rows = 0"), std::string::npos) << message();
  EXPECT_EQ(call(x, delta, w, y, 65536, 64, 1e-5f), cudaErrorInvalidValue);
  EXPECT_NE(message().find("rows = 65536"), std::string::npos) << message();
  EXPECT_EQ(call(x, delta, w, y, 1, 0, 1e-5f), cudaErrorInvalidValue);
  EXPECT_NE(message().find("hidden = 0"), std::string::npos) << message();
  EXPECT_EQ(call(x, delta, w, y, 1, 64, std::nanf("")), cudaErrorInvalidValue);
  EXPECT_NE(message().find("eps"), std::string::npos) << message();
  EXPECT_EQ(call(x, delta, w, y, 1, 64, -1.0f), cudaErrorInvalidValue);
  // y 32 BF16 after delta, both 64 wide.
  EXPECT_EQ(call(x, delta, w, reinterpret_cast<__nv_bfloat16*>(half_bits + 32), 1, 64, 1e-5f),
            cudaErrorInvalidValue);
  EXPECT_NE(message().find("overlap"), std::string::npos) << message();
  EXPECT_EQ(call(x, reinterpret_cast<const __nv_bfloat16*>(x + 8), w, y, 1, 64, 1e-5f), cudaErrorInvalidValue);
  EXPECT_NE(message().find("overlap"), std::string::npos) << message();
}

TEST(FusedOpsHost, QkvCanImplementAcceptsTheEngineShapes) {
  std::string why = "stale";
  for (KvFormat f : kAllFormats) {
    for (int head_dim : {64, 128}) {
      const int hb = static_cast<int>(formats::kv_hadamard_block(f, head_dim));
      for (int rows : {1, 64, 65535}) {
        EXPECT_EQ(cuda::qkv_rope_kv_append_can_implement(f, rows, 32, 8, head_dim, hb, &why), cudaSuccess) << why;
        EXPECT_EQ(why, "");
      }
    }
  }
  EXPECT_EQ(cuda::qkv_rope_kv_append_can_implement(KvFormat::BF16, 3, 9, 3, 8, 8, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::qkv_rope_kv_append_can_implement(KvFormat::INT4_HADAMARD, 3, 4, 4, 256, 128, &why), cudaSuccess)
      << why;
  EXPECT_EQ(cuda::qkv_rope_kv_append_can_implement(KvFormat::INT4, 3, 4, 4, 256, 256, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::qkv_rope_kv_append_can_implement(KvFormat::FP8, 3, 4, 4, 48, 1, &why), cudaSuccess) << why;
}

TEST(FusedOpsHost, QkvCanImplementNamesTheProblem) {
  struct Bad {
    KvFormat f;
    int rows, nh, nkv, hd, hb;
    const char* expect;
  };
  const Bad bad[] = {
      {static_cast<KvFormat>(9), 1, 32, 8, 128, 0, "unknown KV format"},
      {KvFormat::BF16, 0, 32, 8, 128, 0, "rows = 0"},
      {KvFormat::BF16, 65536, 32, 8, 128, 0, "rows = 65536"},
      {KvFormat::BF16, 1, 0, 8, 128, 0, "n_heads = 0"},
      {KvFormat::BF16, 1, 32, 0, 128, 0, "n_kv_heads = 0"},
      {KvFormat::BF16, 1, 32, 65536, 128, 0, "n_kv_heads = 65536"},
      {KvFormat::BF16, 1, 32, 8, 12, 0, "head_dim = 12"},
      {KvFormat::BF16, 1, 32, 8, 512, 0, "head_dim = 512"},
      {KvFormat::FP8, 1, 32, 8, 40, 0, "head_dim = 40"},
      {KvFormat::INT4, 1, 32, 8, 80, 0, "head_dim = 80"},
      {KvFormat::INT4_HADAMARD, 1, 32, 8, 0, 0, "head_dim = 0"},
      {KvFormat::BF16, 1, 32, 8, 128, 96, "hadamard_block = 96"},
      {KvFormat::BF16, 1, 32, 8, 96, 64, "hadamard_block = 64"},
      {KvFormat::BF16, 1, 32, 8, 128, 256, "hadamard_block = 256"},
      {KvFormat::BF16, 1, 32, 8, 128, -2, "hadamard_block = -2"},
  };
  for (const Bad& b : bad) {
    std::string why;
    EXPECT_EQ(cuda::qkv_rope_kv_append_can_implement(b.f, b.rows, b.nh, b.nkv, b.hd, b.hb, &why),
              cudaErrorInvalidValue)
        << b.expect;
    EXPECT_NE(why.find(b.expect), std::string::npos) << "message: " << why << "; expected to mention " << b.expect;
  }
}

TEST(FusedOpsHost, QkvLaunchersRefuseBadPointersBeforeTouchingTheDevice) {
  alignas(16) static uint16_t qkv_bits[4096];
  alignas(16) static uint16_t q_bits[4096];
  alignas(16) static uint8_t pool[64];
  alignas(16) static int32_t ints[4];
  alignas(16) static float freq[64];
  alignas(16) static uint16_t anchors[128];
  auto* qkv = reinterpret_cast<__nv_bfloat16*>(qkv_bits);
  auto* q = reinterpret_cast<__nv_bfloat16*>(q_bits);
  auto message = [] { return std::string(cuda::fused_ops_last_error()); };
  // 1 row of 2 q + 1 k + 1 v heads of 128.
  auto rope = [&](KvFormat f, __nv_bfloat16* x, const int32_t* pos, const float* fr, uint8_t* p, const uint16_t* a,
                  const int32_t* ra, __nv_bfloat16* out) {
    return cuda::qkv_rope_kv_append(f, x, 1, 2, 1, 128, pos, fr, ints, ints, a, ra, p, 0, out, nullptr);
  };
  EXPECT_EQ(rope(KvFormat::INT4, nullptr, ints, freq, pool, nullptr, nullptr, q), cudaErrorInvalidValue);
  EXPECT_NE(message().find("qkv_rope_kv_append: "), std::string::npos) << message();
  EXPECT_NE(message().find("non-null"), std::string::npos) << message();
  EXPECT_EQ(rope(KvFormat::INT4, qkv, nullptr, freq, pool, nullptr, nullptr, q), cudaErrorInvalidValue);
  EXPECT_NE(message().find("positions"), std::string::npos) << message();
  EXPECT_EQ(rope(KvFormat::INT4, qkv, ints, nullptr, pool, nullptr, nullptr, q), cudaErrorInvalidValue);
  EXPECT_NE(message().find("inv_freq"), std::string::npos) << message();
  EXPECT_EQ(rope(KvFormat::INT4, qkv, ints, freq, pool + 4, nullptr, nullptr, q), cudaErrorInvalidValue);
  EXPECT_NE(message().find("kv_pool 16-byte aligned"), std::string::npos) << message();
  EXPECT_EQ(rope(KvFormat::INT4, qkv, ints, freq, pool, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(rope(KvFormat::INT4, qkv, ints, freq, pool, nullptr, nullptr,
                 reinterpret_cast<__nv_bfloat16*>(pool + 1)),
            cudaErrorInvalidValue);
  EXPECT_NE(message().find("q_out 2-byte aligned"), std::string::npos) << message();
  EXPECT_EQ(rope(KvFormat::INT4_HADAMARD, qkv, ints, freq, pool, anchors, nullptr, q), cudaErrorInvalidValue);
  EXPECT_NE(message().find("row_anchor"), std::string::npos) << message();
  EXPECT_EQ(rope(KvFormat::INT4_HADAMARD, qkv, ints, freq, pool, nullptr, ints, q), cudaErrorInvalidValue);
  EXPECT_NE(message().find("key_anchors"), std::string::npos) << message();
  // q_out inside qkv's row.
  EXPECT_EQ(rope(KvFormat::INT4, qkv, ints, freq, pool, nullptr, nullptr,
                 reinterpret_cast<__nv_bfloat16*>(qkv_bits + 100)),
            cudaErrorInvalidValue);
  EXPECT_NE(message().find("overlaps"), std::string::npos) << message();
  EXPECT_EQ(cuda::qkv_rope_kv_append(KvFormat::INT4, qkv, 1, 2, 1, 100, ints, freq, ints, ints, nullptr, nullptr,
                                     pool, 0, q, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(message().find("head_dim = 100"), std::string::npos) << message();

  // The no-RoPE variant names itself and needs no positions or inv_freq (a refused pool shows it got past them).
  EXPECT_EQ(cuda::kv_append_rotate_q(KvFormat::INT4, qkv, 1, 2, 1, 128, ints, ints, nullptr, nullptr, pool + 4, 0, q,
                                     nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(message().find("kv_append_rotate_q: "), std::string::npos) << message();
  EXPECT_NE(message().find("kv_pool 16-byte aligned"), std::string::npos) << message();
  EXPECT_EQ(cuda::kv_append_rotate_q(KvFormat::INT4, qkv, 0, 2, 1, 128, ints, ints, nullptr, nullptr, pool, 0, q,
                                     nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(message().find("kv_append_rotate_q: rows = 0"), std::string::npos) << message();
}

}  // namespace
