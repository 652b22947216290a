// GPU tests of the small decoder ops (include/futransformer/cuda/decoder_ops.h) against their CPU twins:
// RefModel::embed's BF16 -> fp32 widening, ref::rmsnorm, the fp32 residual add, ref::swiglu, ref::apply_rope and
// futransformer::argmax. Each op runs on fresh seeded random inputs over awkward shapes, into NaN-poisoned outputs,
// with pointers both 16-byte aligned (vector kernels) and offset by one element (scalar fallbacks). Device tests
// report SKIPPED without a CUDA device; the DecoderOpsHost tests check the argument rejection and need none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/launch_status.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/dtype.h"
#include "futransformer/model.h"
#include "futransformer/sampling.h"
#include "gpu_test_util.h"
#include "ref/ops.h"

namespace {

using namespace futransformer;
using test::DeviceBuffer;

// --- Tolerances --------------------------------------------------------------------------------------------------
// The GPU and the twin compute the same fp32 expression except for one step each, which leaves the fp32 results
// within a few fp32 ulps (relative ~2^-21) of each other. Two fp32 values that close round to the same BF16 or to
// adjacent ones (a BF16 ulp is 2^-8 relative), never further apart:
//   rmsnorm: the sum of squares in fp32 by a block tree (twin: fp64), so the scale differs by ~1e-6 relative;
//   swiglu:  ops::silu_mul (SFU exponential and reciprocal) is within 2^-21 relative of exact arithmetic.
constexpr int kRmsnormMaxUlps = 1;
constexpr int kSwigluMaxUlps = 1;
// Exact (bit for bit): embed (BF16 -> fp32 is exact), the residual add (one fp32 rounding on both sides), RoPE
// (same fp64 angle; cos/sin rounded to fp32 agree unless the fp64 results of the two libraries straddle an fp32
// rounding boundary, odds ~2^-27 per value; then the same fp32 products, no FMA on either side) and argmax.

const std::vector<int> kRows = {1, 3, 17, 64};

// BF16 bits on a line where adjacent representable values differ by 1 (+0 and -0 both map to 0).
int bf16_ordinal(uint16_t b) { return (b & 0x8000) ? -static_cast<int>(b & 0x7fff) : static_cast<int>(b); }
int bf16_ulp_distance(uint16_t a, uint16_t b) { return std::abs(bf16_ordinal(a) - bf16_ordinal(b)); }
bool bf16_is_nan(uint16_t b) { return (b & 0x7fff) > 0x7f80; }

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

std::vector<float> random_f32(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A device copy of `host` starting `offset` elements into the allocation: offset 1 misaligns the pointer for the
// 16-byte vector paths. The elements before it hold NaN (all-ones) bits.
template <typename T>
struct OffsetBuffer {
  DeviceBuffer<T> buf;
  int offset;
  OffsetBuffer(size_t n, int off) : buf(n + static_cast<size_t>(off)), offset(off) {
    EXPECT_EQ(buf.poison(), cudaSuccess);
  }
  OffsetBuffer(const std::vector<T>& host, int off) : OffsetBuffer(host.size(), off) {
    EXPECT_EQ(cudaMemcpy(ptr(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  T* ptr() const { return buf.p + offset; }
  // The elements from the offset on; the ones before it must still be poison (nothing writes below the start).
  std::vector<T> download() const {
    std::vector<T> all = buf.download();
    for (int i = 0; i < offset; ++i) {
      T poison;
      std::memset(&poison, 0xFF, sizeof(T));
      EXPECT_EQ(std::memcmp(&all[static_cast<size_t>(i)], &poison, sizeof(T)), 0) << "write before the start";
    }
    return std::vector<T>(all.begin() + offset, all.end());
  }
};

template <typename T>
__nv_bfloat16* as_bf16(T* p) {
  return reinterpret_cast<__nv_bfloat16*>(p);
}

void expect_launched(cudaError_t e) {
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::decoder_ops_last_error();
  EXPECT_STREQ(cuda::decoder_ops_last_error(), "");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// --- embed ---------------------------------------------------------------------------------------------------------
void check_embed(int rows, int hidden, int vocab, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " hidden " << hidden << " vocab " << vocab << " offset " << off
                                  << " seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<uint16_t> table = random_bf16(static_cast<size_t>(vocab) * hidden, rng, -2.0f, 2.0f);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  for (auto& t : tokens) t = tok(rng);
  tokens[0] = vocab - 1;  // the last table row: an off-by-one past the table would show here
  if (rows > 2) tokens[2] = tokens[1];
  const OffsetBuffer<uint16_t> d_table(table, off);
  const DeviceBuffer<int32_t> d_tokens(tokens);
  const OffsetBuffer<float> d_x(static_cast<size_t>(rows) * hidden, off);
  expect_launched(cuda::embed_rows_bf16(as_bf16(d_table.ptr()), d_tokens.p, d_x.ptr(), rows, hidden, vocab, nullptr));
  const std::vector<float> x = d_x.download();
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < hidden; ++i) {
      const float want = bf16_to_f32(table[static_cast<size_t>(tokens[r]) * hidden + i]);
      ASSERT_EQ(f32_bits(x[static_cast<size_t>(r) * hidden + i]), f32_bits(want))
          << "row " << r << " (token " << tokens[r] << ") column " << i;
    }
  }
}

TEST(DecoderOpsGpu, EmbedIsExact) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 10;
  for (int rows : kRows) {
    for (int hidden : {64, 576, 4096, 575}) {
      for (int off : {0, 1}) check_embed(rows, hidden, 1000, off, ++seed);
    }
  }
  check_embed(2, 8, 1, 0, ++seed);
  // Prefill row counts; 4104 and 12296: a CTA of 4096 values plus a partial one (one vector, then 2 CTAs + one).
  check_embed(2048, 4096, 1000, 0, ++seed);
  check_embed(2049, 4104, 300, 0, ++seed);
  check_embed(3, 12296, 50, 0, ++seed);
}

TEST(DecoderOpsGpu, EmbedWritesNanRowsForOutOfRangeIds) {
  FT_REQUIRE_CUDA_DEVICE();
  constexpr int kVocab = 50, kHidden = 64;
  std::mt19937 rng(20);
  const std::vector<uint16_t> table = random_bf16(size_t{kVocab} * kHidden, rng, -1.0f, 1.0f);
  const std::vector<int32_t> tokens = {-1, kVocab, 7, std::numeric_limits<int32_t>::min(), kVocab - 1};
  const int rows = static_cast<int>(tokens.size());
  for (int off : {0, 1}) {
    const OffsetBuffer<uint16_t> d_table(table, off);
    const DeviceBuffer<int32_t> d_tokens(tokens);
    const OffsetBuffer<float> d_x(static_cast<size_t>(rows) * kHidden, off);
    // Fill x with finite values first, so a NaN below was written by the kernel, not left by the poison.
    ASSERT_EQ(cudaMemset(d_x.ptr(), 0, static_cast<size_t>(rows) * kHidden * sizeof(float)), cudaSuccess);
    expect_launched(
        cuda::embed_rows_bf16(as_bf16(d_table.ptr()), d_tokens.p, d_x.ptr(), rows, kHidden, kVocab, nullptr));
    const std::vector<float> x = d_x.download();
    for (int r = 0; r < rows; ++r) {
      const bool valid = tokens[r] >= 0 && tokens[r] < kVocab;
      for (int i = 0; i < kHidden; ++i) {
        const float got = x[static_cast<size_t>(r) * kHidden + i];
        if (valid) {
          ASSERT_EQ(f32_bits(got), f32_bits(bf16_to_f32(table[static_cast<size_t>(tokens[r]) * kHidden + i])))
              << "row " << r << " column " << i << " offset " << off;
        } else {
          ASSERT_TRUE(std::isnan(got)) << "row " << r << " (token " << tokens[r] << ") column " << i << " offset "
                                       << off;
        }
      }
    }
  }
}

// --- rmsnorm -------------------------------------------------------------------------------------------------------
void check_rmsnorm(int rows, int hidden, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " hidden " << hidden << " offset " << off << " seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> x = random_f32(static_cast<size_t>(rows) * hidden, rng, -1.0f, 1.0f);
  // Rows of very different magnitude (residual streams grow through the layers), and an outlier channel.
  for (int r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, 4 * (r % 5) - 8);
    for (int i = 0; i < hidden; ++i) x[static_cast<size_t>(r) * hidden + i] *= scale;
    x[static_cast<size_t>(r) * hidden + (r * 7) % hidden] *= 50.0f;
  }
  const std::vector<float> w = random_f32(static_cast<size_t>(hidden), rng, -1.5f, 1.5f);
  constexpr float kEps = 1e-5f;
  const OffsetBuffer<float> d_x(x, off), d_w(w, off);
  const OffsetBuffer<uint16_t> d_y(static_cast<size_t>(rows) * hidden, off);
  expect_launched(cuda::rmsnorm_bf16(d_x.ptr(), d_w.ptr(), as_bf16(d_y.ptr()), rows, hidden, kEps, nullptr));
  const std::vector<uint16_t> y = d_y.download();
  std::vector<float> ref(static_cast<size_t>(hidden));
  int exact = 0;
  for (int r = 0; r < rows; ++r) {
    ref::rmsnorm(&x[static_cast<size_t>(r) * hidden], w.data(), ref.data(), hidden, kEps);
    for (int i = 0; i < hidden; ++i) {
      const uint16_t got = y[static_cast<size_t>(r) * hidden + i], want = f32_to_bf16(ref[static_cast<size_t>(i)]);
      ASSERT_FALSE(bf16_is_nan(got)) << "row " << r << " column " << i << " not written";
      ASSERT_LE(bf16_ulp_distance(got, want), kRmsnormMaxUlps)
          << "row " << r << " column " << i << ": got " << bf16_to_f32(got) << ", ref " << ref[static_cast<size_t>(i)];
      exact += got == want;
    }
  }
  // Off-by-one-ulp results come only from fp32 values within ~2^-21 of a rounding boundary: a few per thousand.
  EXPECT_GE(exact, rows * hidden * 99 / 100);
}

TEST(DecoderOpsGpu, RmsnormMatchesTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 30;
  for (int rows : kRows) {
    for (int hidden : {64, 576, 4096, 575}) {
      for (int off : {0, 1}) check_rmsnorm(rows, hidden, off, ++seed);
    }
  }
  check_rmsnorm(2, 16384, 0, ++seed);  // several vectors per thread in each pass
  check_rmsnorm(3, 8192, 1, ++seed);
  check_rmsnorm(1, 1, 0, ++seed);
}

// --- residual add --------------------------------------------------------------------------------------------------
void check_residual(int rows, int hidden, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " hidden " << hidden << " offset " << off << " seed " << seed);
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(rows) * hidden;
  const std::vector<float> x = random_f32(n, rng, -8.0f, 8.0f);
  const std::vector<uint16_t> delta = random_bf16(n, rng, -8.0f, 8.0f);
  const OffsetBuffer<float> d_x(x, off);
  const OffsetBuffer<uint16_t> d_delta(delta, off);
  expect_launched(cuda::add_residual_bf16(d_x.ptr(), as_bf16(d_delta.ptr()), rows, hidden, nullptr));
  const std::vector<float> got = d_x.download();
  for (size_t i = 0; i < n; ++i) {
    const float want = x[i] + bf16_to_f32(delta[i]);
    ASSERT_EQ(f32_bits(got[i]), f32_bits(want)) << "element " << i << " (row " << i / hidden << ")";
  }
  EXPECT_EQ(d_delta.download(), delta) << "delta must be read only";
}

TEST(DecoderOpsGpu, ResidualAddIsExact) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 50;
  for (int rows : kRows) {
    for (int hidden : {64, 576, 4096, 575}) {  // 575 · 3, 17: a partial last group of 8 on the vector path
      for (int off : {0, 1}) check_residual(rows, hidden, off, ++seed);
    }
  }
}

// --- swiglu --------------------------------------------------------------------------------------------------------
void check_swiglu(int rows, int inter, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " inter " << inter << " offset " << off << " seed " << seed);
  std::mt19937 rng(seed);
  std::vector<uint16_t> gate_up(static_cast<size_t>(rows) * 2 * inter);
  std::uniform_real_distribution<float> gd(-12.0f, 12.0f), ud(-3.0f, 3.0f);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < inter; ++i) {
      gate_up[static_cast<size_t>(r) * 2 * inter + i] = f32_to_bf16(gd(rng));
      gate_up[static_cast<size_t>(r) * 2 * inter + inter + i] = f32_to_bf16(ud(rng));
    }
  }
  // Saturated gates: exp(−g) overflows to inf (silu → −0) or underflows to 0 (silu → g).
  gate_up[0] = f32_to_bf16(-100.0f);
  if (inter > 1) gate_up[1] = f32_to_bf16(100.0f);
  const OffsetBuffer<uint16_t> d_in(gate_up, off);
  const OffsetBuffer<uint16_t> d_out(static_cast<size_t>(rows) * inter, off);
  expect_launched(cuda::swiglu_bf16(as_bf16(d_in.ptr()), as_bf16(d_out.ptr()), rows, inter, nullptr));
  const std::vector<uint16_t> out = d_out.download();
  std::vector<float> g(static_cast<size_t>(inter)), u(static_cast<size_t>(inter)), ref(static_cast<size_t>(inter));
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < inter; ++i) {
      g[static_cast<size_t>(i)] = bf16_to_f32(gate_up[static_cast<size_t>(r) * 2 * inter + i]);
      u[static_cast<size_t>(i)] = bf16_to_f32(gate_up[static_cast<size_t>(r) * 2 * inter + inter + i]);
    }
    ref::swiglu(g.data(), u.data(), ref.data(), inter);
    for (int i = 0; i < inter; ++i) {
      const uint16_t got = out[static_cast<size_t>(r) * inter + i], want = f32_to_bf16(ref[static_cast<size_t>(i)]);
      ASSERT_FALSE(bf16_is_nan(got)) << "row " << r << " column " << i << " not written";
      ASSERT_LE(bf16_ulp_distance(got, want), kSwigluMaxUlps)
          << "row " << r << " column " << i << ": gate " << g[static_cast<size_t>(i)] << ", up "
          << u[static_cast<size_t>(i)] << ": got " << bf16_to_f32(got) << ", ref " << ref[static_cast<size_t>(i)];
    }
  }
}

TEST(DecoderOpsGpu, SwigluMatchesTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 70;
  for (int rows : kRows) {
    for (int inter : {64, 576, 4096, 333}) {
      for (int off : {0, 1}) check_swiglu(rows, inter, off, ++seed);
    }
  }
  check_swiglu(2, 14336, 0, ++seed);
  check_swiglu(1, 28672, 0, ++seed);
  check_swiglu(3, 1, 0, ++seed);
}

// --- rope ----------------------------------------------------------------------------------------------------------
RopeScaling llama3_scaling() {
  RopeScaling s;
  s.type = "llama3";
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  return s;
}

void check_rope(int rows, int n_heads, int n_kv_heads, int head_dim, const RopeScaling& scaling, double theta,
                uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " heads " << n_heads << "/" << n_kv_heads << " head_dim "
                                  << head_dim << " scaling '" << scaling.type << "' theta " << theta << " seed "
                                  << seed);
  std::mt19937 rng(seed);
  const int width = (n_heads + 2 * n_kv_heads) * head_dim, rot = (n_heads + n_kv_heads) * head_dim;
  const std::vector<uint16_t> qkv = random_bf16(static_cast<size_t>(rows) * width, rng, -3.0f, 3.0f);
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  std::uniform_int_distribution<int32_t> pd(0, 32767);
  for (auto& p : pos) p = pd(rng);
  pos[0] = 32767;
  if (rows > 1) pos[1] = 0;
  if (rows > 2) pos[2] = 1;
  const std::vector<float> inv_freq = ref::rope_inv_freq(head_dim, theta, scaling);
  const DeviceBuffer<uint16_t> d_qkv(qkv);
  const DeviceBuffer<int32_t> d_pos(pos);
  const DeviceBuffer<float> d_freq(inv_freq);
  expect_launched(
      cuda::rope_qk_bf16(as_bf16(d_qkv.p), d_pos.p, d_freq.p, rows, n_heads, n_kv_heads, head_dim, nullptr));
  const std::vector<uint16_t> got = d_qkv.download();
  std::vector<float> x(static_cast<size_t>(rot));
  int64_t changed = 0;
  for (int r = 0; r < rows; ++r) {
    const uint16_t* in = &qkv[static_cast<size_t>(r) * width];
    for (int i = 0; i < rot; ++i) x[static_cast<size_t>(i)] = bf16_to_f32(in[i]);
    ref::apply_rope(x.data(), n_heads + n_kv_heads, head_dim, pos[static_cast<size_t>(r)], inv_freq.data());
    for (int i = 0; i < width; ++i) {
      const uint16_t want = i < rot ? f32_to_bf16(x[static_cast<size_t>(i)]) : in[i];  // v passes through
      const uint16_t g = got[static_cast<size_t>(r) * width + i];
      ASSERT_EQ(g, want) << "row " << r << " (position " << pos[static_cast<size_t>(r)] << ") "
                         << (i < n_heads * head_dim ? "q"
                             : i < rot              ? "k"
                                                    : "v")
                         << " value " << i << " (head " << i / head_dim << ", channel " << i % head_dim << "): got "
                         << bf16_to_f32(g) << ", ref " << bf16_to_f32(want);
      changed += g != in[i];
    }
  }
  // Row 0 (position 32767) alone changes most of its q and k values; a kernel that did nothing would fail here.
  EXPECT_GT(changed, rot / 2);
}

TEST(DecoderOpsGpu, RopeIsExactOnQAndKAndLeavesV) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 90;
  for (int rows : kRows) {
    for (int head_dim : {8, 64, 128}) {
      check_rope(rows, 32, 8, head_dim, llama3_scaling(), 500000.0, ++seed);
      check_rope(rows, 3, 1, head_dim, RopeScaling{}, 10000.0, ++seed);
    }
  }
  check_rope(2, 9, 3, 64, RopeScaling{}, 10000.0, ++seed);        // 12 rotated heads: several CTAs per row
  check_rope(1, 64, 8, 128, llama3_scaling(), 500000.0, ++seed);  // Llama-3-70B
  check_rope(3, 1, 1, 512, RopeScaling{}, 10000.0, ++seed);       // the largest head_dim
  check_rope(5, 7, 2, 80, RopeScaling{}, 10000.0, ++seed);         // 5 vector groups per half head
  check_rope(5, 7, 2, 72, RopeScaling{}, 10000.0, ++seed);         // head_dim % 16 != 0: the 2-byte kernel
  check_rope(2048, 32, 8, 128, llama3_scaling(), 500000.0, ++seed);  // a Llama-3-8B prefill pass
}

// --- argmax --------------------------------------------------------------------------------------------------------
// `labels` (optional) names each row in a failure.
void check_argmax_rows(const std::vector<float>& logits, int rows, int vocab, int off,
                       const std::vector<int32_t>& expected, const std::vector<const char*>& labels = {}) {
  const OffsetBuffer<float> d_logits(logits, off);
  DeviceBuffer<int32_t> d_out(static_cast<size_t>(rows));
  ASSERT_EQ(d_out.poison(), cudaSuccess);
  expect_launched(cuda::argmax_rows_f32(d_logits.ptr(), d_out.p, rows, vocab, nullptr));
  const std::vector<int32_t> got = d_out.download();
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(got[static_cast<size_t>(r)], expected[static_cast<size_t>(r)])
        << "row " << r << (labels.empty() ? "" : ": ") << (labels.empty() ? "" : labels[static_cast<size_t>(r)]);
  }
}

void check_argmax_random(int rows, int vocab, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " vocab " << vocab << " offset " << off << " seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> logits = random_f32(static_cast<size_t>(rows) * vocab, rng, -20.0f, 20.0f);
  std::uniform_int_distribution<int> col(0, vocab - 1);
  for (int r = 0; r < rows; ++r) {
    float* row = &logits[static_cast<size_t>(r) * vocab];
    if (r % 2 == 1 && vocab > 1) {
      // A tie for the maximum at two random columns: the lower index must win, whichever threads hold them.
      const int a = col(rng), b = col(rng);
      row[a] = row[b] = 25.0f;
    } else if (r % 4 == 2) {
      row[vocab - 1] = 30.0f;  // the last column (the tail of the vector path)
    }
  }
  std::vector<int32_t> expected(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r)
    expected[static_cast<size_t>(r)] =
        argmax(std::span<const float>(&logits[static_cast<size_t>(r) * vocab], static_cast<size_t>(vocab)));
  check_argmax_rows(logits, rows, vocab, off, expected);
}

TEST(DecoderOpsGpu, ArgmaxMatchesGreedySampler) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 110;
  for (int rows : kRows) {
    for (int vocab : {1, 7, 1000, 32000, 128256, 128257}) {
      for (int off : {0, 1}) check_argmax_random(rows, vocab, off, ++seed);
    }
  }
}

TEST(DecoderOpsGpu, ArgmaxTiesInfinitiesAndNans) {
  FT_REQUIRE_CUDA_DEVICE();
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  constexpr int kVocab = 4100;  // spans every thread of the CTA, with a partial last round
  struct Case {
    const char* what;
    std::vector<std::pair<int, float>> set;  // (column, value) over a row of -1
    float fill;
    int32_t expected;
  };
  const std::vector<Case> cases = {
      {"tie in one float4", {{9, 3.0f}, {10, 3.0f}}, -1.0f, 9},
      {"tie across threads and warps", {{4099, 3.0f}, {1025, 3.0f}}, -1.0f, 1025},
      {"tie of +0 and -0 as the maximum", {{300, 0.0f}, {200, -0.0f}}, -1.0f, 200},
      {"NaN at 0 never wins", {{0, kNan}, {17, 2.0f}, {3000, kNan}}, -1.0f, 17},
      {"NaN everywhere but one -inf", {{2222, -kInf}}, kNan, 2222},
      {"all NaN gives 0", {}, kNan, 0},
      {"all -inf gives 0", {}, -kInf, 0},
      {"+inf ties: lowest", {{4000, kInf}, {3999, kInf}, {5, kNan}}, -1.0f, 3999},
  };
  const int rows = static_cast<int>(cases.size());
  std::vector<float> logits(static_cast<size_t>(rows) * kVocab);
  std::vector<int32_t> expected;
  std::vector<const char*> labels;
  for (int r = 0; r < rows; ++r) {
    const Case& c = cases[static_cast<size_t>(r)];
    labels.push_back(c.what);
    float* row = &logits[static_cast<size_t>(r) * kVocab];
    std::fill(row, row + kVocab, c.fill);
    for (auto [i, v] : c.set) row[i] = v;
    expected.push_back(c.expected);
    // futransformer::argmax refuses NaNs; where there are none it must agree with the expectation.
    bool has_nan = false;
    for (int i = 0; i < kVocab; ++i) has_nan |= std::isnan(row[i]);
    if (!has_nan) {
      EXPECT_EQ(argmax(std::span<const float>(row, kVocab)), c.expected) << c.what;
    }
  }
  for (int off : {0, 1}) {
    SCOPED_TRACE(testing::Message() << "offset " << off);
    check_argmax_rows(logits, rows, kVocab, off, expected, labels);
  }
}

// --- widen + argmax (the INT4 LM head's tail) -------------------------------------------------------------------------
// argmax_rows_f32's order on the host, NaNs included: a number beats a NaN, a larger number wins, ties (or two NaNs)
// go to the lower index; a row of NaNs gives 0.
int32_t argmax_with_nans(const float* row, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    const bool in = std::isnan(row[i]), bn = std::isnan(row[best]);
    if (in != bn ? bn : (!in && row[i] > row[best])) best = i;
  }
  return std::isnan(row[best]) ? 0 : best;
}

void check_widen_argmax(int rows, int vocab, int stride, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " vocab " << vocab << " stride " << stride << " offset " << off
                                  << " seed " << seed);
  std::mt19937 rng(seed);
  std::vector<uint16_t> logits = random_bf16(static_cast<size_t>(rows) * stride, rng, -20.0f, 20.0f);
  std::uniform_int_distribution<int> col(0, vocab - 1);
  constexpr uint16_t kNanBits = 0x7FC0, kTop = 0x41F0;  // bf16 NaN; 30.0 (above every random value)
  for (int r = 0; r < rows; ++r) {
    uint16_t* row = &logits[static_cast<size_t>(r) * stride];
    for (int c = vocab; c < stride; ++c) row[c] = kTop;  // padding columns past vocab must never win
    if (r % 3 == 1 && vocab > 1) {
      row[col(rng)] = row[col(rng)] = kTop;  // a tie at two random columns: the lower index wins
    } else if (r % 3 == 2) {
      row[vocab - 1] = kTop;  // the last column (the tail of the vector path)
      for (int k = 0; k < 3; ++k) row[col(rng)] = kNanBits;  // NaNs never win
    }
  }
  std::vector<float> widened(static_cast<size_t>(rows) * vocab);
  std::vector<int32_t> expected(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < vocab; ++c)
      widened[static_cast<size_t>(r) * vocab + c] = bf16_to_f32(logits[static_cast<size_t>(r) * stride + c]);
    expected[static_cast<size_t>(r)] = argmax_with_nans(&widened[static_cast<size_t>(r) * vocab], vocab);
  }
  const OffsetBuffer<uint16_t> d_logits(logits, off);
  const OffsetBuffer<float> d_widened(widened.size(), off);  // poisoned
  DeviceBuffer<int32_t> d_ids(static_cast<size_t>(rows));
  ASSERT_EQ(d_ids.poison(), cudaSuccess);
  expect_launched(cuda::widen_argmax_rows_bf16(as_bf16(d_logits.ptr()), stride, d_widened.ptr(), d_ids.p, rows, vocab,
                                               nullptr));
  const std::vector<float> got_widened = d_widened.download();
  int bad = 0;
  for (size_t i = 0; i < widened.size() && bad < 5; ++i)
    if (f32_bits(got_widened[i]) != f32_bits(widened[i])) {
      ADD_FAILURE() << "widened element " << i << ": bits " << f32_bits(got_widened[i]) << ", expected "
                    << f32_bits(widened[i]);
      ++bad;
    }
  const std::vector<int32_t> got = d_ids.download();
  for (int r = 0; r < rows; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], expected[static_cast<size_t>(r)]) << "row " << r;
  // The fp32 argmax on the same widened rows agrees (the two ops are one rule).
  DeviceBuffer<int32_t> d_ids2(static_cast<size_t>(rows));
  ASSERT_EQ(d_ids2.poison(), cudaSuccess);
  expect_launched(cuda::argmax_rows_f32(d_widened.ptr(), d_ids2.p, rows, vocab, nullptr));
  EXPECT_EQ(d_ids2.download(), got);
}

TEST(DecoderOpsGpu, WidenArgmaxMatchesWidenThenArgmax) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 170;
  for (int rows : kRows) {
    for (int vocab : {1, 7, 1000, 16384, 32000, 128256, 128257}) {
      const int padded = (vocab + 127) / 128 * 128;  // the INT4 head's N, as the engine passes it
      for (int stride : {vocab, padded}) {
        for (int off : {0, 1}) check_widen_argmax(rows, vocab, stride, off, ++seed);
        if (stride == padded && padded == vocab) break;
      }
    }
  }
}

// --- a decode step's op chain in a CUDA graph ----------------------------------------------------------------------
TEST(DecoderOpsGpu, OpsCaptureInAGraphAndReplayDeterministically) {
  FT_REQUIRE_CUDA_DEVICE();
  constexpr int kRows = 5, kHidden = 576, kVocab = 1000, kInter = 1536, kHeads = 9, kKv = 3, kHeadDim = 64;
  std::mt19937 rng(130);
  const DeviceBuffer<uint16_t> table(random_bf16(size_t{kVocab} * kHidden, rng, -1.0f, 1.0f));
  const DeviceBuffer<int32_t> tokens(std::vector<int32_t>{1, 999, 5, 5, 0});
  const DeviceBuffer<int32_t> positions(std::vector<int32_t>{0, 1, 70, 4000, 32767});
  const DeviceBuffer<float> norm_w(random_f32(kHidden, rng, 0.5f, 1.5f));
  const DeviceBuffer<float> inv_freq(ref::rope_inv_freq(kHeadDim, 500000.0, llama3_scaling()));
  const DeviceBuffer<uint16_t> qkv_in(random_bf16(size_t{kRows} * (kHeads + 2 * kKv) * kHeadDim, rng, -2.0f, 2.0f));
  const DeviceBuffer<uint16_t> gate_up(random_bf16(size_t{kRows} * 2 * kInter, rng, -4.0f, 4.0f));
  const DeviceBuffer<float> logits(random_f32(size_t{kRows} * kVocab, rng, -5.0f, 5.0f));
  DeviceBuffer<float> x(size_t{kRows} * kHidden);
  DeviceBuffer<uint16_t> y(size_t{kRows} * kHidden), qkv(qkv_in.n), act(size_t{kRows} * kInter);
  DeviceBuffer<int32_t> next(kRows);

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto enqueue = [&] {
    EXPECT_EQ(cudaMemcpyAsync(qkv.p, qkv_in.p, qkv.n * 2, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    EXPECT_EQ(cuda::embed_rows_bf16(as_bf16(table.p), tokens.p, x.p, kRows, kHidden, kVocab, stream), cudaSuccess);
    EXPECT_EQ(cuda::rmsnorm_bf16(x.p, norm_w.p, as_bf16(y.p), kRows, kHidden, 1e-5f, stream), cudaSuccess);
    EXPECT_EQ(cuda::rope_qk_bf16(as_bf16(qkv.p), positions.p, inv_freq.p, kRows, kHeads, kKv, kHeadDim, stream),
              cudaSuccess);
    EXPECT_EQ(cuda::add_residual_bf16(x.p, as_bf16(y.p), kRows, kHidden, stream), cudaSuccess);
    EXPECT_EQ(cuda::swiglu_bf16(as_bf16(gate_up.p), as_bf16(act.p), kRows, kInter, stream), cudaSuccess);
    EXPECT_EQ(cuda::argmax_rows_f32(logits.p, next.p, kRows, kVocab, stream), cudaSuccess);
  };
  // cudaMemset runs on the legacy stream, which a non-blocking stream does not wait for: synchronise.
  auto poison_all = [&] {
    for (cudaError_t e : {x.poison(), y.poison(), qkv.poison(), act.poison(), next.poison()}) EXPECT_EQ(e, cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  struct Outputs {
    std::vector<float> x;
    std::vector<uint16_t> y, qkv, act;
    std::vector<int32_t> next;
    bool operator==(const Outputs&) const = default;
  };
  auto outputs = [&] { return Outputs{x.download(), y.download(), qkv.download(), act.download(), next.download()}; };

  poison_all();
  enqueue();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Outputs direct = outputs();

  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  enqueue();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    poison_all();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(outputs() == direct) << "graph replay " << replay << " differs from the direct launches";
  }
  const std::vector<float> host_logits = logits.download();
  for (int r = 0; r < kRows; ++r) {
    EXPECT_EQ(direct.next[static_cast<size_t>(r)],
              argmax(std::span<const float>(&host_logits[static_cast<size_t>(r) * kVocab], kVocab)))
        << "row " << r;
  }
  for (float v : direct.x) ASSERT_FALSE(std::isnan(v));
  for (uint16_t v : direct.act) ASSERT_FALSE(bf16_is_nan(v));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// --- argument rejection (no device needed: every check runs before any CUDA call) ----------------------------------
template <typename T>
T* fake(uintptr_t addr = 0x10000) {
  return reinterpret_cast<T*>(addr);
}

void expect_rejected(cudaError_t e, const char* needle, const char* what) {
  EXPECT_EQ(e, cudaErrorInvalidValue) << what;
  EXPECT_NE(std::string(cuda::decoder_ops_last_error()).find(needle), std::string::npos)
      << what << ": message '" << cuda::decoder_ops_last_error() << "' should name '" << needle << "'";
}

TEST(DecoderOpsHost, RejectsBadSizesAndNullPointersWithAReason) {
  auto* bf = fake<__nv_bfloat16>();
  auto* f = fake<float>();
  auto* i32 = fake<int32_t>();
  const int big = cuda::kDecoderOpsMaxWidth + 1;
  expect_rejected(cuda::embed_rows_bf16(nullptr, i32, f, 1, 64, 10, nullptr), "table", "embed null table");
  expect_rejected(cuda::embed_rows_bf16(bf, i32, f, 0, 64, 10, nullptr), "rows = 0", "embed rows 0");
  expect_rejected(cuda::embed_rows_bf16(bf, i32, f, cuda::kDecoderOpsMaxRows + 1, 64, 10, nullptr), "rows = 65536",
                  "embed rows too many");
  expect_rejected(cuda::embed_rows_bf16(bf, i32, f, 1, 0, 10, nullptr), "hidden = 0", "embed hidden 0");
  expect_rejected(cuda::embed_rows_bf16(bf, i32, f, 1, 64, -3, nullptr), "vocab = -3", "embed vocab");

  expect_rejected(cuda::rmsnorm_bf16(f, nullptr, bf, 1, 64, 1e-5f, nullptr), "weight", "rmsnorm null weight");
  expect_rejected(cuda::rmsnorm_bf16(f, f, bf, 1, big, 1e-5f, nullptr), "hidden = 16777217", "rmsnorm hidden");
  expect_rejected(cuda::rmsnorm_bf16(f, f, bf, 1, 64, std::numeric_limits<float>::quiet_NaN(), nullptr), "eps",
                  "rmsnorm NaN eps");
  expect_rejected(cuda::rmsnorm_bf16(f, f, bf, 1, 64, -1.0f, nullptr), "eps", "rmsnorm negative eps");

  expect_rejected(cuda::add_residual_bf16(f, nullptr, 1, 64, nullptr), "delta", "residual null delta");
  expect_rejected(cuda::add_residual_bf16(f, bf, -1, 64, nullptr), "rows = -1", "residual rows");

  expect_rejected(cuda::swiglu_bf16(bf, nullptr, 1, 64, nullptr), "out", "swiglu null out");
  expect_rejected(cuda::swiglu_bf16(bf, bf, 1, 0, nullptr), "inter = 0", "swiglu inter");
  auto* bf_plus_64 = fake<__nv_bfloat16>(0x10000 + 64 * 2);  // __nv_bfloat16 is incomplete here: no pointer arithmetic
  expect_rejected(cuda::swiglu_bf16(bf, bf_plus_64, 1, 64, nullptr), "overlaps", "swiglu out inside gate_up");
  expect_rejected(cuda::swiglu_bf16(bf_plus_64, bf, 2, 64, nullptr), "overlaps", "swiglu gate_up inside out");

  expect_rejected(cuda::rope_qk_bf16(bf, nullptr, f, 1, 8, 2, 64, nullptr), "positions", "rope null positions");
  expect_rejected(cuda::rope_qk_bf16(bf, i32, f, 1, 8, 2, 63, nullptr), "head_dim = 63", "rope odd head_dim");
  expect_rejected(cuda::rope_qk_bf16(bf, i32, f, 1, 8, 2, 514, nullptr), "head_dim = 514", "rope head_dim too big");
  expect_rejected(cuda::rope_qk_bf16(bf, i32, f, 1, 8, 2, 0, nullptr), "head_dim = 0", "rope head_dim 0");
  expect_rejected(cuda::rope_qk_bf16(bf, i32, f, 1, 0, 2, 64, nullptr), "n_heads = 0", "rope n_heads");
  expect_rejected(cuda::rope_qk_bf16(bf, i32, f, 1, 8, 0, 64, nullptr), "n_kv_heads = 0", "rope n_kv_heads");

  expect_rejected(cuda::argmax_rows_f32(f, nullptr, 1, 64, nullptr), "out", "argmax null out");
  expect_rejected(cuda::argmax_rows_f32(f, i32, 1, 0, nullptr), "vocab = 0", "argmax vocab");
  expect_rejected(cuda::argmax_rows_f32(f, i32, 70000, 10, nullptr), "rows = 70000", "argmax rows");
  expect_rejected(cuda::widen_argmax_rows_bf16(bf, 64, nullptr, i32, 1, 64, nullptr), "widened", "widen argmax null");
  expect_rejected(cuda::widen_argmax_rows_bf16(bf, 32, f, i32, 1, 64, nullptr), "row_stride = 32", "widen argmax stride");
  expect_rejected(cuda::widen_argmax_rows_bf16(bf, 64, f, i32, 1, 0, nullptr), "vocab = 0", "widen argmax vocab");
  expect_rejected(cuda::widen_argmax_rows_bf16(bf, 64, f, i32, 70000, 64, nullptr), "rows = 70000",
                  "widen argmax rows");
}

TEST(DecoderOpsHost, Bf16UlpDistanceCountsRepresentableSteps) {
  // The metric behind the rmsnorm and swiglu tolerances.
  EXPECT_EQ(bf16_ulp_distance(0x3f80, 0x3f81), 1);  // 1.0 and the next BF16 up
  EXPECT_EQ(bf16_ulp_distance(0x3f80, 0x3f7f), 1);  // across a binade boundary
  EXPECT_EQ(bf16_ulp_distance(0x0000, 0x8000), 0);  // +0 and -0
  EXPECT_EQ(bf16_ulp_distance(0x0001, 0x8001), 2);  // the two smallest subnormals of opposite sign
  EXPECT_EQ(bf16_ulp_distance(0xbf80, 0xbf81), 1);  // -1.0 and the next one down
  EXPECT_EQ(bf16_ulp_distance(0x3f80, 0xbf80), 2 * 0x3f80);
  EXPECT_TRUE(bf16_is_nan(0xffff));
  EXPECT_TRUE(bf16_is_nan(0x7fc0));
  EXPECT_FALSE(bf16_is_nan(0x7f80));  // +inf
}

// FT_SMEM_CARVEOUT's text: whole percentages 0..100 apply, everything else leaves the driver's choice (-1).
TEST(DecoderOpsHost, SmemCarveoutTakesWholePercentagesOnly) {
  EXPECT_EQ(cuda::parse_smem_carveout(nullptr), -1);
  EXPECT_EQ(cuda::parse_smem_carveout(""), -1);
  EXPECT_EQ(cuda::parse_smem_carveout("0"), 0);
  EXPECT_EQ(cuda::parse_smem_carveout("50"), 50);
  EXPECT_EQ(cuda::parse_smem_carveout("100"), 100);
  EXPECT_EQ(cuda::parse_smem_carveout("101"), -1);
  EXPECT_EQ(cuda::parse_smem_carveout("-1"), -1);
  EXPECT_EQ(cuda::parse_smem_carveout("max"), -1);
  EXPECT_EQ(cuda::parse_smem_carveout("80%"), -1);
}

}  // namespace
