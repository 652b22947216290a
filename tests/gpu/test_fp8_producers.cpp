// GPU tests of the FP8 prefill producers (include/futransformer/cuda/fp8_producers.h). Two references per op:
//  1. the quantisation step, bit for bit: formats::fp8_quantize_per_token applied to the kernel's own fp32 y (its
//     y_debug output) must give the kernel's codes and scales exactly; and y itself, rounded to BF16, must be the
//     BF16 sibling op's output bit for bit (rmsnorm_bf16, swiglu_bf16: same arithmetic, same summation order);
//  2. the whole op against its CPU twin (ref::rmsnorm / ref::swiglu, then fp8_quantize_per_token): y within a few
//     fp32 ulps, scales within the same relative bound, codes at most one E4M3 step apart (a y a few ulps away can
//     fall on the other side of an E4M3 rounding boundary, never further).
// quantize_rows_fp8 has no fp32 step (the BF16 widening is exact), so it is bit-exact against the CPU quantiser.
// Inputs are fresh seeded random values over awkward shapes; outputs are NaN-poisoned before every launch; pointers
// are 16-byte aligned (vector kernels) and offset by one element (scalar kernels). Device tests report SKIPPED
// without a CUDA device; the Fp8ProducersHost tests check the argument rejection and need none.
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

#include "cuda/engine/engine_kernels.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fp8_producers.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/hadamard.h"
#include "gpu_test_util.h"
#include "ref/ops.h"

namespace {

using namespace futransformer;
using test::DeviceBuffer;

// --- Tolerances --------------------------------------------------------------------------------------------------
// rmsnorm: the GPU sums squares in fp32 by a block tree, the twin in fp64, so the row scale s and with it every y
// differ by ~1e-6 relative (decoder_ops' test bounds the same difference by one BF16 ulp). 2^-16 leaves a wide
// margin and is still 2^12 times finer than an E4M3 step (2^-3 relative), so a real error cannot hide under it.
constexpr double kRmsnormYRelTol = 0x1p-16;
// swiglu: ops::silu_mul's SFU exponential and reciprocal (decoder_ops.cuh) keep y within 2^-21 of exact arithmetic
// (ex2.approx 2^-22, rcp.approx 1 ulp, five roundings), the C library's exp and division within ~2 ulps;
// 2^-20 = 8 ulps.
constexpr double kSwigluYRelTol = 0x1p-20;
// Codes of y values that close differ by at most one step of the E4M3 grid (adjacent codes).
constexpr int kMaxCodeSteps = 1;

const std::vector<int> kRows = {1, 3, 17, 64};

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// E4M3 codes on a line where adjacent representable values differ by 1 (+0 and -0 both map to 0).
int fp8_ordinal(uint8_t c) { return (c & 0x80) ? -static_cast<int>(c & 0x7f) : static_cast<int>(c & 0x7f); }

std::vector<float> random_f32(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

// A device copy of `host` starting `offset` elements into a NaN-poisoned (all-ones) allocation: offset 1 misaligns
// the pointer for the vector paths; download() checks nothing was written before the start.
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
  cudaError_t poison() { return buf.poison(); }
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
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::fp8_producers_last_error();
  EXPECT_STREQ(cuda::fp8_producers_last_error(), "");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The kernel's codes and scales are exactly formats::fp8_quantize_per_token of the kernel's y.
void expect_exact_quantisation(const std::vector<float>& y, const std::vector<uint8_t>& codes,
                               const std::vector<float>& scales, int rows, int cols) {
  const formats::Fp8Matrix q = formats::fp8_quantize_per_token(y, rows, cols, "kernel y");
  for (int r = 0; r < rows; ++r) {
    ASSERT_EQ(f32_bits(scales[static_cast<size_t>(r)]), f32_bits(q.scales[static_cast<size_t>(r)]))
        << "row " << r << " scale " << scales[static_cast<size_t>(r)] << " vs " << q.scales[static_cast<size_t>(r)];
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      ASSERT_EQ(codes[i], q.codes[i]) << "row " << r << " column " << c << " y " << y[i];
    }
  }
}

// bf16(y) is bit for bit the BF16 sibling op's output.
void expect_bf16_sibling(const std::vector<float>& y, const std::vector<uint16_t>& sibling) {
  ASSERT_EQ(y.size(), sibling.size());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(f32_to_bf16(y[i]), sibling[i]) << "element " << i << " y " << y[i];
}

// The whole op against its twin: y elementwise within rel_tol, scales within rel_tol, codes within kMaxCodeSteps.
void expect_near_twin(const std::vector<float>& y, const std::vector<uint8_t>& codes, const std::vector<float>& scales,
                      const std::vector<float>& y_ref, int rows, int cols, double rel_tol) {
  const formats::Fp8Matrix q = formats::fp8_quantize_per_token(y_ref, rows, cols, "twin y");
  for (int r = 0; r < rows; ++r) {
    const double s = scales[static_cast<size_t>(r)], s_ref = q.scales[static_cast<size_t>(r)];
    ASSERT_LE(std::fabs(s - s_ref), rel_tol * s_ref) << "row " << r << " scale " << s << " vs " << s_ref;
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      ASSERT_LE(std::fabs(double(y[i]) - double(y_ref[i])), rel_tol * std::fabs(double(y_ref[i])))
          << "row " << r << " column " << c << " y " << y[i] << " vs " << y_ref[i];
      ASSERT_LE(std::abs(fp8_ordinal(codes[i]) - fp8_ordinal(q.codes[i])), kMaxCodeSteps)
          << "row " << r << " column " << c << " code " << int(codes[i]) << " vs " << int(q.codes[i]);
    }
  }
}

// --- rmsnorm_fp8 -----------------------------------------------------------------------------------------------------
std::vector<float> rmsnorm_input(int rows, int hidden, std::mt19937& rng) {
  std::vector<float> x = random_f32(static_cast<size_t>(rows) * hidden, rng, -1.0f, 1.0f);
  // Rows of very different magnitude (residual streams grow through the layers), and an outlier channel: the
  // outlier sets the row's amax, so the other values land low on the E4M3 grid, some on its subnormals.
  for (int r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, 4 * (r % 5) - 8);
    for (int i = 0; i < hidden; ++i) x[static_cast<size_t>(r) * hidden + i] *= scale;
    x[static_cast<size_t>(r) * hidden + (r * 7) % hidden] *= 50.0f;
  }
  // A row of zeros: y = ±0, amax 0, so the unit-scale rule applies (codes 0x00 / 0x80 by the sign of the weight).
  if (rows > 2) std::fill_n(x.begin() + 2 * hidden, hidden, 0.0f);
  return x;
}

void check_rmsnorm_fp8(int rows, int hidden, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " hidden " << hidden << " offset " << off << " seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<float> x = rmsnorm_input(rows, hidden, rng);
  const std::vector<float> w = random_f32(static_cast<size_t>(hidden), rng, -1.5f, 1.5f);
  constexpr float kEps = 1e-5f;
  const size_t n = static_cast<size_t>(rows) * hidden;
  const OffsetBuffer<float> d_x(x, off), d_w(w, off);
  OffsetBuffer<uint8_t> d_codes(n, off);
  OffsetBuffer<float> d_scales(static_cast<size_t>(rows), off), d_y(n, off);
  const OffsetBuffer<uint16_t> d_bf16(n, off);

  expect_launched(
      cuda::rmsnorm_fp8(d_x.ptr(), d_w.ptr(), d_codes.ptr(), d_scales.ptr(), rows, hidden, kEps, nullptr, d_y.ptr()));
  const std::vector<float> y = d_y.download(), scales = d_scales.download();
  const std::vector<uint8_t> codes = d_codes.download();
  expect_exact_quantisation(y, codes, scales, rows, hidden);

  expect_launched(cuda::rmsnorm_bf16(d_x.ptr(), d_w.ptr(), as_bf16(d_bf16.ptr()), rows, hidden, kEps, nullptr));
  expect_bf16_sibling(y, d_bf16.download());

  std::vector<float> y_ref(n);
  for (int r = 0; r < rows; ++r) {
    const size_t o = static_cast<size_t>(r) * hidden;
    ref::rmsnorm(&x[o], w.data(), &y_ref[o], hidden, kEps);
  }
  expect_near_twin(y, codes, scales, y_ref, rows, hidden, kRmsnormYRelTol);

  // The engine's call (no debug output) writes the same codes and scales.
  ASSERT_EQ(d_codes.poison(), cudaSuccess);
  ASSERT_EQ(d_scales.poison(), cudaSuccess);
  expect_launched(cuda::rmsnorm_fp8(d_x.ptr(), d_w.ptr(), d_codes.ptr(), d_scales.ptr(), rows, hidden, kEps, nullptr));
  EXPECT_EQ(d_codes.download(), codes);
  const std::vector<float> scales2 = d_scales.download();
  for (int r = 0; r < rows; ++r) EXPECT_EQ(f32_bits(scales2[r]), f32_bits(scales[r])) << "row " << r;
}

TEST(Fp8ProducersGpu, RmsnormFp8QuantisesItsOwnYExactlyAndMatchesTheTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 100;
  for (int rows : kRows) {
    // 64, 576: one unit per thread (K = 1); 192, 1280: two virtual warps per real one (K = 2); 4096, 8192: K = 4
    // with one and two units per virtual thread; 12288: the two-pass kernel; 575, 5: scalar.
    for (int hidden : {64, 192, 576, 1280, 4096, 8192, 12288, 575, 5}) {
      for (int off : {0, 1}) check_rmsnorm_fp8(rows, hidden, off, ++seed);
    }
  }
}

// --- quantize_rows_fp8 -------------------------------------------------------------------------------------------
void check_quantize_rows(int rows, int cols, int stride, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " cols " << cols << " stride " << stride << " offset " << off
                                  << " seed " << seed);
  std::mt19937 rng(seed);
  const size_t in_elems = static_cast<size_t>(rows - 1) * stride + cols;
  std::vector<uint16_t> x = random_bf16(in_elems, rng, -3.0f, 3.0f);
  for (int r = 0; r < rows; ++r) {
    // Row magnitudes from BF16 subnormals (scale = amax / 448 is then an fp32 subnormal) to 2^60.
    const float mag = r % 4 == 1 ? 0x1p-130f : std::ldexp(1.0f, 15 * (r % 5) - 10);
    for (int c = 0; c < cols; ++c) {
      uint16_t& b = x[static_cast<size_t>(r) * stride + c];
      b = f32_to_bf16(bf16_to_f32(b) * mag);
    }
  }
  if (rows > 2) std::fill_n(x.begin() + 2 * stride, cols, uint16_t{0x8000});  // a row of -0: unit scale, codes 0x80
  // Stride padding holds NaN: reading it would turn the row's scale into NaN.
  for (int r = 0; r + 1 < rows; ++r) std::fill_n(x.begin() + r * stride + cols, stride - cols, uint16_t{0xFFFF});

  const OffsetBuffer<uint16_t> d_x(x, off);
  const OffsetBuffer<uint8_t> d_codes(static_cast<size_t>(rows) * cols, off);
  const OffsetBuffer<float> d_scales(static_cast<size_t>(rows), off);
  expect_launched(
      cuda::quantize_rows_fp8(as_bf16(d_x.ptr()), stride, d_codes.ptr(), d_scales.ptr(), rows, cols, nullptr));
  std::vector<float> y(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c)
      y[static_cast<size_t>(r) * cols + c] = bf16_to_f32(x[static_cast<size_t>(r) * stride + c]);
  }
  expect_exact_quantisation(y, d_codes.download(), d_scales.download(), rows, cols);
}

TEST(Fp8ProducersGpu, QuantizeRowsFp8IsExact) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 200;
  for (int rows : kRows) {
    for (int cols : {64, 576, 4096, 575, 8}) {
      for (int pad : {0, 8, 1}) {
        for (int off : {0, 1}) check_quantize_rows(rows, cols, cols + pad, off, ++seed);
      }
    }
  }
}

// --- unrotate_rows_fp8 ---------------------------------------------------------------------------------------------
// Against two references: the CPU (each head through formats::hadamard_blocks, rounded to BF16, then the per-token
// quantiser: exact), and the two GPU kernels it replaces (rotate_heads_bf16 into a buffer, then quantize_rows_fp8:
// the same codes and scale bits).
void check_unrotate_rows(int rows, int n_heads, int head_dim, int block, int pad, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " heads " << n_heads << " head_dim " << head_dim << " block "
                                  << block << " pad " << pad << " seed " << seed);
  std::mt19937 rng(seed);
  const int cols = n_heads * head_dim, stride = cols + pad;
  const size_t in_elems = static_cast<size_t>(rows - 1) * stride + cols;
  std::vector<uint16_t> x = random_bf16(in_elems, rng, -3.0f, 3.0f);
  for (int r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, 13 * (r % 4) - 12);  // rows from 2^-12 to 2^27
    for (int c = 0; c < cols; ++c) {
      uint16_t& b = x[static_cast<size_t>(r) * stride + c];
      b = f32_to_bf16(bf16_to_f32(b) * mag);
    }
  }
  // Stride padding holds NaN: reading it would turn the row's scale into NaN.
  for (int r = 0; r + 1 < rows; ++r) std::fill_n(x.begin() + r * stride + cols, stride - cols, uint16_t{0xFFFF});
  std::vector<float> y(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c)
      y[static_cast<size_t>(r) * cols + c] = bf16_to_f32(x[static_cast<size_t>(r) * stride + c]);
    for (int h = 0; h < n_heads; ++h)
      formats::hadamard_blocks(&y[static_cast<size_t>(r) * cols + static_cast<size_t>(h) * head_dim], head_dim, block);
  }
  for (float& v : y) v = bf16_to_f32(f32_to_bf16(v));  // rotate_heads_bf16 stores BF16

  const DeviceBuffer<uint16_t> d_x(x);
  DeviceBuffer<uint8_t> d_codes(static_cast<size_t>(rows) * cols), d_codes2(static_cast<size_t>(rows) * cols);
  DeviceBuffer<float> d_scales(static_cast<size_t>(rows)), d_scales2(static_cast<size_t>(rows));
  DeviceBuffer<uint16_t> d_rot(static_cast<size_t>(rows) * cols);
  for (auto* b : {&d_codes, &d_codes2}) ASSERT_EQ(b->poison(), cudaSuccess);
  for (auto* b : {&d_scales, &d_scales2}) ASSERT_EQ(b->poison(), cudaSuccess);
  expect_launched(cuda::unrotate_rows_fp8(as_bf16(d_x.p), stride, d_codes.p, d_scales.p, rows, n_heads, head_dim,
                                          block, nullptr));
  const std::vector<uint8_t> codes = d_codes.download();
  const std::vector<float> scales = d_scales.download();
  expect_exact_quantisation(y, codes, scales, rows, cols);

  ASSERT_EQ(cuda::rotate_heads_bf16(as_bf16(d_x.p), stride, as_bf16(d_rot.p), rows, n_heads, head_dim, block, nullptr),
            cudaSuccess);
  expect_launched(cuda::quantize_rows_fp8(as_bf16(d_rot.p), cols, d_codes2.p, d_scales2.p, rows, cols, nullptr));
  EXPECT_EQ(codes, d_codes2.download()) << "codes differ from rotate_heads_bf16 + quantize_rows_fp8";
  const std::vector<float> scales2 = d_scales2.download();
  for (int r = 0; r < rows; ++r) EXPECT_EQ(f32_bits(scales[r]), f32_bits(scales2[r])) << "scale of row " << r;
}

TEST(Fp8ProducersGpu, UnrotateRowsFp8EqualsRotateHeadsThenQuantizeRows) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 900;
  check_unrotate_rows(37, 32, 128, 128, 0, ++seed);   // Llama-3.1-8B's attention output (int4-hadamard, block 128)
  check_unrotate_rows(5, 64, 128, 128, 8, ++seed);    // 70B: 8192 channels, padded rows
  check_unrotate_rows(17, 9, 64, 64, 0, ++seed);      // SmolLM2: 576 channels, the last warp partly outside the row
  check_unrotate_rows(3, 6, 32, 32, 16, ++seed);      // 2 lanes per head
  check_unrotate_rows(4, 3, 256, 128, 0, ++seed);     // block smaller than the head: two blocks per head
  check_unrotate_rows(2, 5, 16, 8, 0, ++seed);        // one lane per head, block inside a lane
}

// --- swiglu_fp8 ----------------------------------------------------------------------------------------------------
void check_swiglu_fp8(int rows, int inter, int off, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " inter " << inter << " offset " << off << " seed " << seed);
  std::mt19937 rng(seed);
  // Gates far into both tails of silu (exp(−g) overflows to inf below g ≈ −88).
  std::vector<uint16_t> gu = random_bf16(static_cast<size_t>(rows) * 2 * inter, rng, -8.0f, 8.0f);
  for (int r = 0; r < rows; ++r) {
    gu[static_cast<size_t>(r) * 2 * inter] = f32_to_bf16(-100.0f);
    gu[static_cast<size_t>(r) * 2 * inter + (inter - 1)] = f32_to_bf16(30.0f);
  }
  const size_t n = static_cast<size_t>(rows) * inter;
  const OffsetBuffer<uint16_t> d_gu(gu, off);
  OffsetBuffer<uint8_t> d_codes(n, off);
  OffsetBuffer<float> d_scales(static_cast<size_t>(rows), off);
  const OffsetBuffer<float> d_y(n, off);
  const OffsetBuffer<uint16_t> d_bf16(n, off);
  expect_launched(
      cuda::swiglu_fp8(as_bf16(d_gu.ptr()), d_codes.ptr(), d_scales.ptr(), rows, inter, nullptr, d_y.ptr()));
  const std::vector<float> y = d_y.download(), scales = d_scales.download();
  const std::vector<uint8_t> codes = d_codes.download();
  expect_exact_quantisation(y, codes, scales, rows, inter);

  expect_launched(cuda::swiglu_bf16(as_bf16(d_gu.ptr()), as_bf16(d_bf16.ptr()), rows, inter, nullptr));
  expect_bf16_sibling(y, d_bf16.download());

  std::vector<float> y_ref(n), g(static_cast<size_t>(inter)), u(static_cast<size_t>(inter));
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < inter; ++i) {
      g[static_cast<size_t>(i)] = bf16_to_f32(gu[static_cast<size_t>(r) * 2 * inter + i]);
      u[static_cast<size_t>(i)] = bf16_to_f32(gu[static_cast<size_t>(r) * 2 * inter + inter + i]);
    }
    ref::swiglu(g.data(), u.data(), &y_ref[static_cast<size_t>(r) * inter], inter);
  }
  expect_near_twin(y, codes, scales, y_ref, rows, inter, kSwigluYRelTol);

  ASSERT_EQ(d_codes.poison(), cudaSuccess);
  ASSERT_EQ(d_scales.poison(), cudaSuccess);
  expect_launched(cuda::swiglu_fp8(as_bf16(d_gu.ptr()), d_codes.ptr(), d_scales.ptr(), rows, inter, nullptr));
  EXPECT_EQ(d_codes.download(), codes);
  const std::vector<float> scales2 = d_scales.download();
  for (int r = 0; r < rows; ++r) EXPECT_EQ(f32_bits(scales2[r]), f32_bits(scales[r])) << "row " << r;
}

TEST(Fp8ProducersGpu, SwigluFp8QuantisesItsOwnYExactlyAndMatchesTheTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 300;
  for (int rows : kRows) {
    // 16384: the widest row-in-registers row (512 threads x 4 units); 16392: the two-pass kernel.
    for (int inter : {64, 1536, 14336, 16384, 16392, 1535, 3}) {
      for (int off : {0, 1}) check_swiglu_fp8(rows, inter, off, ++seed);
    }
  }
}

// --- prefill-sized passes ------------------------------------------------------------------------------------------
// The Llama-3.1-8B FP8 prefill shapes at 2048 rows (and one more: a row count no CTA grouping divides): hidden
// 4096 for both RMSNorms, the 4096-wide attention output in its q_width-strided rows, inter 14336; and hidden 8192
// (two float4 units per virtual thread of the RMSNorm block).
TEST(Fp8ProducersGpu, PrefillRowCounts) {
  FT_REQUIRE_CUDA_DEVICE();
  check_rmsnorm_fp8(2048, 4096, 0, 401);
  check_rmsnorm_fp8(2049, 8192, 0, 402);
  check_quantize_rows(2048, 4096, 4096, 0, 403);
  check_quantize_rows(2049, 4096, 4104, 0, 404);
  check_swiglu_fp8(2048, 14336, 0, 405);
}

// --- non-finite rows -------------------------------------------------------------------------------------------------
// A row whose y holds a NaN or an infinity gets scale NaN and every code 0x7F; the other rows are untouched.
void expect_poisoned_row(const std::vector<uint8_t>& codes, const std::vector<float>& scales, int bad_row, int rows,
                         int cols, const char* op) {
  SCOPED_TRACE(op);
  for (int r = 0; r < rows; ++r) {
    const float s = scales[static_cast<size_t>(r)];
    if (r == bad_row) {
      EXPECT_TRUE(std::isnan(s)) << "row " << r << " scale " << s;
    } else {
      EXPECT_TRUE(std::isfinite(s) && s > 0.0f) << "row " << r << " scale " << s;
    }
    for (int c = 0; c < cols; ++c) {
      const uint8_t code = codes[static_cast<size_t>(r) * cols + c];
      if (r == bad_row) {
        ASSERT_EQ(code, formats::kFp8E4M3NaN) << "row " << r << " column " << c;
      } else {
        ASSERT_NE(code & 0x7f, 0x7f) << "row " << r << " column " << c << ": NaN code in a finite row";
      }
    }
  }
}

TEST(Fp8ProducersGpu, NonFiniteRowsGetNanScaleAndNanCodes) {
  FT_REQUIRE_CUDA_DEVICE();
  constexpr int kRowsN = 4, kCols = 256;
  std::mt19937 rng(400);
  const size_t n = size_t{kRowsN} * kCols;
  for (int off : {0, 1}) {
    SCOPED_TRACE(testing::Message() << "offset " << off);
    {  // rmsnorm: an inf in x makes the sum of squares inf, s = 0 and y = 0 · inf = NaN at that channel.
      std::vector<float> x = random_f32(n, rng, -1.0f, 1.0f);
      x[1 * kCols + 17] = std::numeric_limits<float>::infinity();
      const std::vector<float> w = random_f32(kCols, rng, 0.5f, 1.5f);
      const OffsetBuffer<float> d_x(x, off), d_w(w, off), d_scales(kRowsN, off);
      const OffsetBuffer<uint8_t> d_codes(n, off);
      expect_launched(
          cuda::rmsnorm_fp8(d_x.ptr(), d_w.ptr(), d_codes.ptr(), d_scales.ptr(), kRowsN, kCols, 1e-5f, nullptr));
      expect_poisoned_row(d_codes.download(), d_scales.download(), 1, kRowsN, kCols, "rmsnorm_fp8");
    }
    {  // quantize_rows: a NaN in the row.
      std::vector<uint16_t> x = random_bf16(n, rng, -1.0f, 1.0f);
      x[2 * kCols + 100] = 0x7fc0;
      const OffsetBuffer<uint16_t> d_x(x, off);
      const OffsetBuffer<uint8_t> d_codes(n, off);
      const OffsetBuffer<float> d_scales(kRowsN, off);
      expect_launched(
          cuda::quantize_rows_fp8(as_bf16(d_x.ptr()), kCols, d_codes.ptr(), d_scales.ptr(), kRowsN, kCols, nullptr));
      expect_poisoned_row(d_codes.download(), d_scales.download(), 2, kRowsN, kCols, "quantize_rows_fp8");
    }
    {  // swiglu: an infinite up value (silu(g) · inf).
      std::vector<uint16_t> gu = random_bf16(2 * n, rng, 0.5f, 2.0f);
      gu[3 * 2 * kCols + kCols + 5] = 0x7f80;
      const OffsetBuffer<uint16_t> d_gu(gu, off);
      const OffsetBuffer<uint8_t> d_codes(n, off);
      const OffsetBuffer<float> d_scales(kRowsN, off);
      expect_launched(cuda::swiglu_fp8(as_bf16(d_gu.ptr()), d_codes.ptr(), d_scales.ptr(), kRowsN, kCols, nullptr));
      expect_poisoned_row(d_codes.download(), d_scales.download(), 3, kRowsN, kCols, "swiglu_fp8");
    }
  }
}

// --- CUDA graph capture --------------------------------------------------------------------------------------------
TEST(Fp8ProducersGpu, LaunchersCaptureIntoAGraphAndReplayIdentically) {
  FT_REQUIRE_CUDA_DEVICE();
  constexpr int kRowsG = 17, kHidden = 576, kInter = 1536;
  std::mt19937 rng(500);
  const std::vector<float> x = rmsnorm_input(kRowsG, kHidden, rng);
  const std::vector<float> w = random_f32(kHidden, rng, -1.5f, 1.5f);
  const std::vector<uint16_t> att = random_bf16(size_t{kRowsG} * kHidden, rng, -2.0f, 2.0f);
  const std::vector<uint16_t> gu = random_bf16(size_t{kRowsG} * 2 * kInter, rng, -6.0f, 6.0f);
  const DeviceBuffer<float> d_x(x), d_w(w);
  const DeviceBuffer<uint16_t> d_att(att), d_gu(gu);
  DeviceBuffer<uint8_t> c1(size_t{kRowsG} * kHidden), c2(size_t{kRowsG} * kHidden), c3(size_t{kRowsG} * kInter);
  DeviceBuffer<float> s1(kRowsG), s2(kRowsG), s3(kRowsG);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto enqueue = [&] {
    EXPECT_EQ(cuda::rmsnorm_fp8(d_x.p, d_w.p, c1.p, s1.p, kRowsG, kHidden, 1e-5f, stream), cudaSuccess);
    EXPECT_EQ(cuda::quantize_rows_fp8(as_bf16(d_att.p), kHidden, c2.p, s2.p, kRowsG, kHidden, stream), cudaSuccess);
    EXPECT_EQ(cuda::swiglu_fp8(as_bf16(d_gu.p), c3.p, s3.p, kRowsG, kInter, stream), cudaSuccess);
  };
  auto poison_all = [&] {
    for (auto* b : {&c1, &c2, &c3}) EXPECT_EQ(b->poison(), cudaSuccess);
    for (auto* b : {&s1, &s2, &s3}) EXPECT_EQ(b->poison(), cudaSuccess);
  };
  poison_all();
  enqueue();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto want_c1 = c1.download(), want_c2 = c2.download(), want_c3 = c3.download();
  const auto want_s1 = s1.download(), want_s2 = s2.download(), want_s3 = s3.download();

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
    EXPECT_EQ(c1.download(), want_c1);
    EXPECT_EQ(c2.download(), want_c2);
    EXPECT_EQ(c3.download(), want_c3);
    for (auto [got, want] :
         {std::pair{s1.download(), want_s1}, std::pair{s2.download(), want_s2}, std::pair{s3.download(), want_s3}}) {
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(f32_bits(got[i]), f32_bits(want[i])) << "replay " << replay;
    }
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// --- argument checks (no device needed: every rejection happens before any CUDA call) -----------------------------
template <typename T>
T* fake(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void expect_rejected(cudaError_t e, const std::string& needle) {
  EXPECT_EQ(e, cudaErrorInvalidValue);
  const std::string msg = cuda::fp8_producers_last_error();
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
}

TEST(Fp8ProducersHost, RmsnormFp8RejectsBadArguments) {
  const float* x = fake<const float>(0x100000);
  const float* w = fake<const float>(0x200000);
  uint8_t* codes = fake<uint8_t>(0x300000);
  float* scales = fake<float>(0x400000);
  expect_rejected(cuda::rmsnorm_fp8(nullptr, w, codes, scales, 2, 64, 1e-5f, nullptr), "non-null");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, nullptr, 2, 64, 1e-5f, nullptr), "non-null");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, scales, 0, 64, 1e-5f, nullptr), "rows = 0");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, scales, cuda::kFp8ProducersMaxRows + 1, 64, 1e-5f, nullptr), "rows =");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, scales, 2, 0, 1e-5f, nullptr), "hidden = 0");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, scales, 2, 64, -1.0f, nullptr), "eps");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, scales, 2, 64, std::nanf(""), nullptr), "eps");
  // x holds 2 · 64 fp32 = 512 bytes from 0x100000: codes starting inside it overlap.
  expect_rejected(cuda::rmsnorm_fp8(x, w, fake<uint8_t>(0x100000 + 511), scales, 2, 64, 1e-5f, nullptr),
                  "codes overlaps x");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, fake<float>(0x300000 + 124), 2, 64, 1e-5f, nullptr),
                  "codes overlaps scales");
  expect_rejected(cuda::rmsnorm_fp8(x, w, codes, scales, 2, 64, 1e-5f, nullptr, fake<float>(0x200000 - 8)),
                  "y_debug overlaps weight");
}

TEST(Fp8ProducersHost, QuantizeRowsFp8RejectsBadArguments) {
  const __nv_bfloat16* x = fake<const __nv_bfloat16>(0x100000);
  uint8_t* codes = fake<uint8_t>(0x300000);
  float* scales = fake<float>(0x400000);
  expect_rejected(cuda::quantize_rows_fp8(nullptr, 64, codes, scales, 2, 64, nullptr), "non-null");
  expect_rejected(cuda::quantize_rows_fp8(x, 64, nullptr, scales, 2, 64, nullptr), "non-null");
  expect_rejected(cuda::quantize_rows_fp8(x, 64, codes, scales, 0, 64, nullptr), "rows = 0");
  expect_rejected(cuda::quantize_rows_fp8(x, 64, codes, scales, 2, 0, nullptr), "cols = 0");
  expect_rejected(cuda::quantize_rows_fp8(x, 63, codes, scales, 2, 64, nullptr), "row_stride = 63");
  // Rows 0 and 1 of stride 100 span (100 + 64) BF16 = 328 bytes.
  expect_rejected(cuda::quantize_rows_fp8(x, 100, fake<uint8_t>(0x100000 + 327), scales, 2, 64, nullptr),
                  "codes overlaps x");
  expect_rejected(cuda::quantize_rows_fp8(x, 64, codes, fake<float>(0x100000), 2, 64, nullptr), "scales overlaps x");
}

TEST(Fp8ProducersHost, UnrotateRowsFp8RejectsBadArguments) {
  const __nv_bfloat16* x = fake<const __nv_bfloat16>(0x100000);
  uint8_t* codes = fake<uint8_t>(0x300000);
  float* scales = fake<float>(0x400000);
  expect_rejected(cuda::unrotate_rows_fp8(nullptr, 4096, codes, scales, 2, 32, 128, 128, nullptr), "non-null");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4096, codes, scales, 0, 32, 128, 128, nullptr), "rows = 0");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4096, codes, scales, 2, 0, 128, 128, nullptr), "n_heads = 0");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4096, codes, scales, 2, 32, 96, 32, nullptr), "head_dim = 96");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4096, codes, scales, 2, 32, 128, 96, nullptr), "hadamard_block = 96");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4096, codes, scales, 2, 32, 128, 1, nullptr), "hadamard_block = 1");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4096, codes, scales, 2, 32, 128, 256, nullptr), "hadamard_block = 256");
  expect_rejected(cuda::unrotate_rows_fp8(x, 32768, codes, scales, 2, 256, 128, 128, nullptr), "at most 16384");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4100, codes, scales, 2, 32, 128, 128, nullptr), "row_stride = 4100");
  expect_rejected(cuda::unrotate_rows_fp8(x, 4088, codes, scales, 2, 32, 128, 128, nullptr), "row_stride = 4088");
  expect_rejected(cuda::unrotate_rows_fp8(fake<const __nv_bfloat16>(0x100008), 4096, codes, scales, 2, 32, 128, 128,
                                          nullptr),
                  "aligned");
  // Two rows of 4096 BF16 span 16 KB from 0x100000: codes starting inside them overlap.
  expect_rejected(cuda::unrotate_rows_fp8(x, 4096, fake<uint8_t>(0x100000 + 16376), scales, 2, 32, 128, 128, nullptr),
                  "codes overlaps x");
}

TEST(Fp8ProducersHost, SwigluFp8RejectsBadArguments) {
  const __nv_bfloat16* gu = fake<const __nv_bfloat16>(0x100000);
  uint8_t* codes = fake<uint8_t>(0x300000);
  float* scales = fake<float>(0x400000);
  expect_rejected(cuda::swiglu_fp8(nullptr, codes, scales, 2, 64, nullptr), "non-null");
  expect_rejected(cuda::swiglu_fp8(gu, codes, nullptr, 2, 64, nullptr), "non-null");
  expect_rejected(cuda::swiglu_fp8(gu, codes, scales, 0, 64, nullptr), "rows = 0");
  expect_rejected(cuda::swiglu_fp8(gu, codes, scales, 2, 0, nullptr), "inter = 0");
  expect_rejected(cuda::swiglu_fp8(gu, codes, scales, 2, cuda::kFp8ProducersMaxWidth + 1, nullptr), "inter =");
  // gate_up: 2 rows · 2 · 64 BF16 = 512 bytes.
  expect_rejected(cuda::swiglu_fp8(gu, fake<uint8_t>(0x100000 + 510), scales, 2, 64, nullptr),
                  "codes overlaps gate_up");
  expect_rejected(cuda::swiglu_fp8(gu, codes, scales, 2, 64, nullptr, fake<float>(0x100000 - 4)),
                  "y_debug overlaps gate_up");
}

}  // namespace
