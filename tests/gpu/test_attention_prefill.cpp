// GPU tests of the paged prefill attention (BF16 / INT4 / INT4-Hadamard caches) against its CPU twin: every row of
// every chunk is a decode query of ref::paged_decode_attention with seq_len = chunk start + row + 1 over the
// chunk's block table. Plus host-only checks of the shape contract. Device tests report SKIPPED without Hopper.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention_prefill_internal.h"
#include "cuda/engine/engine_kernels.h"
#include "futransformer/cuda/attention_prefill.h"
#include "futransformer/dtype.h"
#include "gpu_test_util.h"
#include "paged_kv_case.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using test::DeviceBuffer;

struct ChunkSpec {
  int start;  // tokens of the sequence in the cache before the chunk
  int rows;
};

// One sequence per chunk, holding start + rows tokens (the chunk's own K/V are in the cache already, as the engine
// appends before it attends). Every byte no token owns is 0xFF (NaN as BF16 and as FP16 scales).
struct PrefillCase {
  test::PagedKvCase kv;  // its q (one per sequence) is unused
  std::vector<ChunkSpec> chunks;
  std::vector<int32_t> first_row, start_pos;
  int rows = 0;  // q/out rows: the chunks' rows plus `spare_rows` rows that belong to no chunk
  int chunk_rows = 0, max_chunk_rows = 0;
  std::vector<uint16_t> q_bf16;  // [rows, n_heads, head_dim], rotated for int4-hadamard, then rounded
  std::vector<float> q;          // the same values in fp32
};

PrefillCase make_case(KvFormat format, int head_dim, int n_heads, int n_kv, const std::vector<ChunkSpec>& chunks,
                      uint32_t seed, int spare_rows = 0) {
  PrefillCase c;
  std::vector<int32_t> lens;
  for (const ChunkSpec& s : chunks) lens.push_back(s.start + s.rows);
  c.kv = test::make_paged_kv_case(format, head_dim, n_heads, n_kv, lens, seed);
  c.chunks = chunks;
  c.first_row.push_back(0);
  for (const ChunkSpec& s : chunks) {
    c.first_row.push_back(c.first_row.back() + s.rows);
    c.start_pos.push_back(s.start);
    c.max_chunk_rows = std::max(c.max_chunk_rows, s.rows);
  }
  c.chunk_rows = c.first_row.back();
  c.rows = c.chunk_rows + spare_rows;
  std::mt19937 rng(seed ^ 0x9e3779b9u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  c.q.resize(static_cast<size_t>(c.rows) * n_heads * head_dim);
  for (float& v : c.q) v = 0.5f * normal(rng);  // as make_paged_kv_case: a softmax neither flat nor one-hot
  formats::kv_rotate_query(format, head_dim, c.q);
  c.q_bf16.resize(c.q.size());
  for (size_t i = 0; i < c.q.size(); ++i) {
    c.q_bf16[i] = f32_to_bf16(c.q[i]);
    c.q[i] = bf16_to_f32(c.q_bf16[i]);
  }
  return c;
}

// The twin: one decode query per chunk row (block table row of its chunk, seq_len = start + i + 1). Returns out
// [chunk_rows, n_heads, head_dim] and, in abs_out, the same attention over |v|.
std::vector<float> twin(const PrefillCase& c, std::vector<float>* abs_out) {
  const test::PagedKvCase& kv = c.kv;
  std::vector<int32_t> table, lens;
  for (size_t ch = 0; ch < c.chunks.size(); ++ch) {
    for (int i = 0; i < c.chunks[ch].rows; ++i) {
      table.insert(table.end(), kv.block_table.begin() + static_cast<std::ptrdiff_t>(ch * kv.max_pages),
                   kv.block_table.begin() + static_cast<std::ptrdiff_t>((ch + 1) * kv.max_pages));
      lens.push_back(c.chunks[ch].start + i + 1);
    }
  }
  const ref::PagedKvCache cache{kv.layout, kv.pool, kv.n_kv_heads, table, kv.max_pages};
  const size_t n = static_cast<size_t>(c.chunk_rows) * kv.n_heads * kv.head_dim;
  return ref::paged_decode_attention(cache, lens, std::span<const float>(c.q.data(), n), kv.n_heads, abs_out);
}

struct Uploaded {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<int32_t> block_table, first_row, start_pos;
  DeviceBuffer<uint16_t> q;
  explicit Uploaded(const PrefillCase& c)
      : pool(c.kv.pool), block_table(c.kv.block_table), first_row(c.first_row), start_pos(c.start_pos), q(c.q_bf16) {}
};

// The kernel the device tests run (each TEST_P below runs once per design).
cuda::AttentionPrefillKernel g_kernel = cuda::AttentionPrefillKernel::kWgmma;

cudaError_t launch(const PrefillCase& c, const Uploaded& u, uint16_t* out) {
  return cuda::attention_prefill_with(g_kernel, c.kv.format, reinterpret_cast<const __nv_bfloat16*>(u.q.p), u.pool.p,
                                      u.block_table.p, u.first_row.p, u.start_pos.p,
                                      reinterpret_cast<__nv_bfloat16*>(out), c.rows, static_cast<int>(c.chunks.size()),
                                      c.kv.n_heads, c.kv.n_kv_heads, c.kv.head_dim, c.kv.max_pages, c.max_chunk_rows,
                                      nullptr);
}

// Runs the kernel into a NaN-poisoned output; returns the output bits.
std::vector<uint16_t> run(const PrefillCase& c) {
  const Uploaded u(c);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(c.rows) * c.kv.n_heads * c.kv.head_dim);
  EXPECT_EQ(out.poison(), cudaSuccess);
  const cudaError_t e = launch(c, u, out.p);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::attention_prefill_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.download();
}

std::string describe(const std::vector<ChunkSpec>& chunks) {
  std::string s;
  for (const ChunkSpec& ch : chunks) s += " (" + std::to_string(ch.start) + "+" + std::to_string(ch.rows) + ")";
  return s;
}

// Tolerances: the decode kernel's (tests/paged_kv_case.h), for the same reasons. Per element
// |out − ref| ≤ 2^-8 |ref| (output rounded to BF16) + 2^-7 Σp|v|/Σp (each probability, times its value scale for
// INT4, rounded to BF16 before P·V: 2^-8, doubled for ex2.approx and the fp32 summation orders); scores are exact
// integer (INT4) or BF16 products summed in fp32 and the key scales are applied in fp32, which adds no visible
// error. Whole tensor: relative L2 ≤ 1e-2 (the two roundings give about 2e-3).
void check_against_twin(KvFormat format, int head_dim, int n_heads, int n_kv, const std::vector<ChunkSpec>& chunks,
                        uint32_t seed, int spare_rows = 0) {
  const PrefillCase c = make_case(format, head_dim, n_heads, n_kv, chunks, seed, spare_rows);
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " head_dim " << head_dim << " heads "
                                  << n_heads << "/" << n_kv << " chunks (start+rows):" << describe(chunks) << " seed "
                                  << seed);
  std::vector<float> abs_ref;
  const std::vector<float> ref = twin(c, &abs_ref);
  const std::vector<uint16_t> got = run(c);
  const size_t per_row = static_cast<size_t>(n_heads) * head_dim;
  ASSERT_EQ(got.size(), static_cast<size_t>(c.rows) * per_row);
  double err2 = 0.0, ref2 = 0.0;
  size_t chunk = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const int row = static_cast<int>(i / per_row);
    while (row >= c.first_row[chunk + 1]) ++chunk;
    const double v = bf16_to_f32(got[i]);
    ASSERT_FALSE(std::isnan(v)) << "row " << row << " (chunk " << chunk << ") head " << i / head_dim % n_heads
                                << " not written";
    const double bound = test::kAttnOutputRel * std::fabs(ref[i]) + test::kAttnProbRel * abs_ref[i];
    ASSERT_LE(std::fabs(v - ref[i]), bound)
        << "row " << row << " (chunk " << chunk << ", position " << c.start_pos[chunk] + row - c.first_row[chunk]
        << ") head " << i / head_dim % n_heads << " channel " << i % head_dim << ": got " << v << ", ref " << ref[i];
    err2 += (v - ref[i]) * (v - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  for (size_t i = ref.size(); i < got.size(); ++i) {
    ASSERT_EQ(got[i], 0xFFFF) << "row " << i / per_row << " belongs to no chunk but was written";
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), test::kAttnRelL2);
}

// Starts 0, non-multiples of 64 and a long prefix; lengths 1, 17, 64, 200; a chunk of no rows; each chunk its own
// sequence, all in one call.
const std::vector<ChunkSpec> kMixedChunks = {{0, 200}, {37, 17}, {3000, 64}, {130, 1}, {100, 0}, {64, 64}, {2999, 17}};

// Every design (warp-specialised wgmma with two consumers, the default, or one; mma.sync) against the twin on the
// same cases.
class AttentionPrefillGpu : public testing::TestWithParam<cuda::AttentionPrefillKernel> {
 protected:
  void SetUp() override { g_kernel = GetParam(); }
  void TearDown() override { g_kernel = cuda::AttentionPrefillKernel::kWgmma; }
};

TEST_P(AttentionPrefillGpu, EveryFormatHeadDimAndGqa) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 100;
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD, KvFormat::BF16}) {
    for (int head_dim : {128, 64}) {
      for (int G : {1, 4, 8}) check_against_twin(f, head_dim, 2 * G, 2, kMixedChunks, ++seed, 3);
    }
  }
}

TEST_P(AttentionPrefillGpu, GqaThatDoesNotDivideTheTile) {
  FT_REQUIRE_HOPPER();
  // G = 3, 5, 6, 7: a tile of 64 query vectors starts and ends in the middle of a row's heads.
  uint32_t seed = 200;
  for (KvFormat f : {KvFormat::INT4, KvFormat::BF16}) {
    for (int G : {3, 5, 6, 7}) check_against_twin(f, 64, 2 * G, 2, {{0, 100}, {70, 45}, {1, 1}}, ++seed);
  }
}

TEST_P(AttentionPrefillGpu, Llama8BShape) {
  FT_REQUIRE_HOPPER();
  check_against_twin(KvFormat::INT4_HADAMARD, 128, 32, 8, {{0, 300}, {1000, 33}}, 301);
  check_against_twin(KvFormat::BF16, 128, 32, 8, {{0, 300}, {1000, 33}}, 302);
  check_against_twin(KvFormat::INT4, 128, 32, 8, {{0, 129}}, 303);
}

TEST_P(AttentionPrefillGpu, DeterministicAcrossRuns) {
  FT_REQUIRE_HOPPER();
  for (KvFormat f : {KvFormat::INT4, KvFormat::BF16}) {
    const PrefillCase c = make_case(f, 128, 32, 8, {{0, 257}, {3000, 17}}, 401);
    EXPECT_EQ(run(c), run(c)) << formats::kv_format_name(f);
  }
}

// A 2048-row chunk from position 0 (the 8B prefill's chunk, G = 4, causal over up to 32 key blocks: every tile
// length from 1 block to 32, the producer / consumer ring wrapping many times) and a long prefix; 2 KV heads keep
// the CPU twin quick.
TEST_P(AttentionPrefillGpu, LongChunks) {
  FT_REQUIRE_HOPPER();
  check_against_twin(KvFormat::INT4_HADAMARD, 128, 8, 2, {{0, 2048}}, 311);
  check_against_twin(KvFormat::BF16, 128, 8, 2, {{0, 1024}, {5000, 130}}, 312);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionPrefillGpu,
                         testing::Values(cuda::AttentionPrefillKernel::kWgmma, cuda::AttentionPrefillKernel::kMmaSync),
                         [](const testing::TestParamInfo<cuda::AttentionPrefillKernel>& i) {
                           std::string n = cuda::attention_prefill_kernel_name(i.param);
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

// The wgmma kernel's consumer ping-pong (cuda::set_attention_prefill_pingpong): the same arithmetic in the same
// order as the free-running consumers, so the same bits — every format, both head sizes, GQA 1, 4, 8 on the mixed
// chunks (consumers of a tile seeing different block counts take empty turns), and the 2048-row chunk; then once
// against the twin with it on.
TEST(AttentionPrefillGpuCalls, PingPongEqualsFreeRunningBitForBit) {
  FT_REQUIRE_HOPPER();
  struct Restore {
    ~Restore() { cuda::set_attention_prefill_pingpong(cuda::PrefillPingPong::kDefault); }
  } restore;
  g_kernel = cuda::AttentionPrefillKernel::kWgmma;
  uint32_t seed = 900;
  auto both = [&](const PrefillCase& c, const std::string& what) {
    cuda::set_attention_prefill_pingpong(cuda::PrefillPingPong::kOff);
    ASSERT_FALSE(cuda::pingpong_enabled());
    const std::vector<uint16_t> free_running = run(c);
    cuda::set_attention_prefill_pingpong(cuda::PrefillPingPong::kOn);
    ASSERT_TRUE(cuda::pingpong_enabled());
    const std::vector<uint16_t> pingpong = run(c);
    ASSERT_EQ(pingpong.size(), free_running.size());
    for (size_t i = 0; i < pingpong.size(); ++i)
      ASSERT_EQ(pingpong[i], free_running[i]) << what << ": element " << i;
  };
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD, KvFormat::BF16}) {
    for (int head_dim : {128, 64}) {
      for (int G : {1, 4, 8})
        both(make_case(f, head_dim, 2 * G, 2, kMixedChunks, ++seed, 3),
             std::string(formats::kv_format_name(f)) + " head_dim " + std::to_string(head_dim) + " G " +
                 std::to_string(G));
    }
  }
  both(make_case(KvFormat::INT4_HADAMARD, 128, 32, 8, {{0, 2048}}, ++seed), "8B shape, 2048 rows");
  cuda::set_attention_prefill_pingpong(cuda::PrefillPingPong::kOn);
  check_against_twin(KvFormat::INT4_HADAMARD, 128, 32, 8, {{0, 300}, {1000, 33}}, ++seed);
}

// attention_prefill_int4_unrotated: the same bits as attention_prefill followed by rotate_heads_bf16 (the engine's
// unfused order), for head_dim 128 and 64, G 4 and 3, the format's block and a smaller one; and it reports that the
// default kernel un-rotated.
TEST(AttentionPrefillGpuCalls, Int4UnrotatedEqualsPrefillThenRotateHeads) {
  FT_REQUIRE_HOPPER();
  struct Shape {
    int head_dim, n_heads, n_kv, block;
  };
  uint32_t seed = 700;
  for (const Shape& sh : {Shape{128, 32, 8, 128}, Shape{128, 8, 2, 32}, Shape{64, 6, 2, 64}, Shape{64, 6, 2, 16}}) {
    for (const std::vector<ChunkSpec>& chunks : {kMixedChunks, std::vector<ChunkSpec>{{0, 300}}}) {
      const PrefillCase c = make_case(KvFormat::INT4_HADAMARD, sh.head_dim, sh.n_heads, sh.n_kv, chunks, ++seed);
      SCOPED_TRACE(testing::Message() << "head_dim " << sh.head_dim << " heads " << sh.n_heads << "/" << sh.n_kv
                                      << " block " << sh.block << " chunks" << describe(chunks));
      const Uploaded u(c);
      const size_t n = static_cast<size_t>(c.rows) * sh.n_heads * sh.head_dim;
      DeviceBuffer<uint16_t> ref(n), got(n);
      ASSERT_EQ(ref.poison(), cudaSuccess);
      ASSERT_EQ(got.poison(), cudaSuccess);
      auto* qp = reinterpret_cast<const __nv_bfloat16*>(u.q.p);
      auto* rp = reinterpret_cast<__nv_bfloat16*>(ref.p);
      auto* gp = reinterpret_cast<__nv_bfloat16*>(got.p);
      const int n_chunks = static_cast<int>(chunks.size());
      ASSERT_EQ(cuda::attention_prefill(KvFormat::INT4_HADAMARD, qp, u.pool.p, u.block_table.p, u.first_row.p,
                                        u.start_pos.p, rp, c.rows, n_chunks, sh.n_heads, sh.n_kv, sh.head_dim,
                                        c.kv.max_pages, c.max_chunk_rows, nullptr),
                cudaSuccess)
          << cuda::attention_prefill_last_error();
      ASSERT_EQ(cuda::rotate_heads_bf16(rp, sh.n_heads * sh.head_dim, rp, c.rows, sh.n_heads, sh.head_dim, sh.block,
                                        nullptr),
                cudaSuccess);
      bool unrotated = false;
      ASSERT_EQ(cuda::attention_prefill_int4_unrotated(qp, u.pool.p, u.block_table.p, u.first_row.p, u.start_pos.p,
                                                       gp, c.rows, n_chunks, sh.n_heads, sh.n_kv, sh.head_dim,
                                                       c.kv.max_pages, c.max_chunk_rows, sh.block, nullptr,
                                                       &unrotated),
                cudaSuccess)
          << cuda::attention_prefill_last_error();
      EXPECT_EQ(unrotated, cuda::attention_prefill_default_kernel() == cuda::AttentionPrefillKernel::kWgmma);
      if (!unrotated) {
        ASSERT_EQ(cuda::rotate_heads_bf16(gp, sh.n_heads * sh.head_dim, gp, c.rows, sh.n_heads, sh.head_dim,
                                          sh.block, nullptr),
                  cudaSuccess);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> r = ref.download(), g = got.download();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(g[i], r[i]) << "element " << i << " (row " << i / (static_cast<size_t>(sh.n_heads) * sh.head_dim)
                              << ")";
      }
      size_t nan = 0;  // not vacuous: every chunk row written (finite)
      for (uint16_t b : g) nan += (b & 0x7fff) > 0x7f80;
      EXPECT_EQ(nan, 0u);
    }
  }
  bool unrotated = true;
  EXPECT_EQ(cuda::attention_prefill_int4_unrotated(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 64, 1, 32, 8,
                                                   128, 4, 64, 48, nullptr, &unrotated),
            cudaErrorInvalidValue);
  EXPECT_FALSE(unrotated);
  EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find("hadamard_block = 48"), std::string::npos);
}

TEST(AttentionPrefillGpuCalls, RejectedCallsLeaveTheOutputUntouched) {
  FT_REQUIRE_HOPPER();
  const PrefillCase c = make_case(KvFormat::INT4, 128, 32, 8, {{0, 64}}, 501);
  const Uploaded u(c);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(c.rows) * 32 * 128);
  ASSERT_EQ(out.poison(), cudaSuccess);
  auto* q = reinterpret_cast<const __nv_bfloat16*>(u.q.p);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out.p);
  auto call = [&](KvFormat f, const __nv_bfloat16* qp, int n_heads, int hd, int max_rows) {
    return cuda::attention_prefill(f, qp, u.pool.p, u.block_table.p, u.first_row.p, u.start_pos.p, o, c.rows, 1,
                                   n_heads, 8, hd, c.kv.max_pages, max_rows, nullptr);
  };
  EXPECT_EQ(call(KvFormat::INT4, q, 32, 96, 64), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find("head_dim = 96"), std::string::npos);
  EXPECT_EQ(call(KvFormat::INT4, q, 72, 128, 64), cudaErrorInvalidValue);  // 9 query heads per KV head
  EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find("n_heads = 72"), std::string::npos);
  EXPECT_EQ(call(KvFormat::FP8, q, 32, 128, 64), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find("fp8"), std::string::npos);
  EXPECT_EQ(call(KvFormat::INT4, q, 32, 128, 65), cudaErrorInvalidValue);  // more rows than q holds
  EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find("max_chunk_rows = 65"), std::string::npos);
  auto* q_off = reinterpret_cast<const __nv_bfloat16*>(u.q.p + 1);  // 2-byte aligned only
  EXPECT_EQ(call(KvFormat::INT4, q_off, 32, 128, 64), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find("aligned"), std::string::npos);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : out.download()) ASSERT_EQ(v, 0xFFFF);
  // And the same buffers with the right arguments do get written.
  ASSERT_EQ(call(KvFormat::INT4, q, 32, 128, 64), cudaSuccess) << cuda::attention_prefill_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : out.download()) ASSERT_NE(v, 0xFFFF);
}

// --- Host-only: the shape contract (no device needed). ---

TEST(AttentionPrefillHost, CanImplementNamesTheProblem) {
  std::string why;
  EXPECT_EQ(cuda::attention_prefill_can_implement(KvFormat::INT4, 2048, 1, 32, 8, 128, 32, 2048, &why), cudaSuccess)
      << why;
  EXPECT_EQ(cuda::attention_prefill_can_implement(KvFormat::INT4_HADAMARD, 17, 3, 6, 2, 64, 1, 9, &why), cudaSuccess)
      << why;
  EXPECT_EQ(cuda::attention_prefill_can_implement(KvFormat::BF16, 0, 0, 8, 8, 64, 1, 0, &why), cudaSuccess) << why;
  struct Bad {
    KvFormat f;
    int rows, n_chunks, n_heads, n_kv, hd, max_pages, max_rows;
    const char* needle;
  };
  for (const Bad& b : {Bad{KvFormat::FP8, 64, 1, 32, 8, 128, 4, 64, "fp8"},
                       Bad{KvFormat::INT4, 64, 1, 32, 8, 96, 4, 64, "head_dim = 96"},
                       Bad{KvFormat::BF16, 64, 1, 32, 8, 256, 4, 64, "head_dim = 256"},
                       Bad{KvFormat::INT4, 64, 1, 72, 8, 128, 4, 64, "n_heads = 72"},
                       Bad{KvFormat::INT4, 64, 1, 16, 1, 128, 4, 64, "n_heads = 16"},
                       Bad{KvFormat::INT4, 64, 1, 30, 8, 128, 4, 64, "n_heads = 30"},
                       Bad{KvFormat::BF16, 64, 1, 32, 0, 128, 4, 64, "n_kv_heads = 0"},
                       Bad{KvFormat::BF16, 64, 1, 32, -8, 128, 4, 64, "n_kv_heads = -8"},
                       Bad{KvFormat::INT4, -1, 1, 32, 8, 128, 4, 0, "rows = -1"},
                       Bad{KvFormat::INT4, 64, -2, 32, 8, 128, 4, 64, "n_chunks = -2"},
                       Bad{KvFormat::INT4, 64, 70000, 32, 8, 128, 4, 64, "n_chunks = 70000"},
                       Bad{KvFormat::INT4, 64, 1, 32, 8, 128, 4, -5, "max_chunk_rows = -5"},
                       Bad{KvFormat::INT4, 64, 1, 32, 8, 128, 4, 65, "max_chunk_rows = 65"},
                       Bad{KvFormat::INT4, 64, 1, 32, 8, 128, 0, 64, "max_pages_per_seq = 0"},
                       Bad{KvFormat::INT4, 64, 1, 32, 8, 128, 1 << 20, 64, "max_pages_per_seq"}}) {
    EXPECT_EQ(cuda::attention_prefill_can_implement(b.f, b.rows, b.n_chunks, b.n_heads, b.n_kv, b.hd, b.max_pages,
                                                     b.max_rows, &why),
              cudaErrorInvalidValue)
        << b.needle;
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' lacks '" << b.needle << "'";
    // The launcher refuses before touching the device (null pointers are never dereferenced).
    EXPECT_EQ(cuda::attention_prefill(b.f, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, b.rows, b.n_chunks,
                                      b.n_heads, b.n_kv, b.hd, b.max_pages, b.max_rows, nullptr),
              cudaErrorInvalidValue);
    EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find(b.needle), std::string::npos);
  }
  // Null pointers with work to do are refused by name, still without a device.
  EXPECT_EQ(cuda::attention_prefill(KvFormat::INT4, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 64, 1, 32,
                                    8, 128, 4, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::attention_prefill_last_error()).find("non-null"), std::string::npos);
  // Nothing to do is a success that launches nothing.
  EXPECT_EQ(cuda::attention_prefill(KvFormat::BF16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, 32, 8,
                                    128, 4, 0, nullptr),
            cudaSuccess);
  EXPECT_STREQ(cuda::attention_prefill_last_error(), "");
}

}  // namespace
