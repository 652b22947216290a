// GPU tests of the FP8 GEMM (futransformer/cuda/gemm_fp8.h) against its CPU twin formats::gemm_fp8_reference,
// plus host-only checks of the shape contract. Device tests report SKIPPED without an sm_90 device. Large shapes
// compare a sample of rows (tile boundaries, the last row and random rows) with the twin; every output element is
// checked to have been written (the output is poisoned with NaN before each launch).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "futransformer/cuda/gemm_fp8.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/fp8_gemm.h"
#include "gpu_test_util.h"

namespace {

using namespace futransformer;

// Tolerances, from the number formats. D is rounded once to BF16 (half an ulp is 2^-9 relative; 2^-8 leaves room
// for the two fp32 scale products). Hopper's FP8 tensor-core accumulation keeps about 14 significant bits and
// truncates; the kernel restarts it every 128 products and promotes to fp32, so its error is a small multiple of
// 2^-13 of sum |a b| per block: 2^-10 of the whole sum |a b| bounds it with margin.
constexpr double kBf16Rel = 0x1p-8;
constexpr double kAccumulationRel = 0x1p-10;
// Whole-tensor relative L2 error against the twin (BF16 rounding alone gives about 1e-3).
constexpr double kRelL2Tol = 1e-2;
// Against the unquantised fp32 product: E4M3 keeps 3 mantissa bits (2^-4 relative half-ulp per value), so the
// per-token / per-channel quantised GEMM of Gaussian data lands near 4e-2 relative L2; 0.1 flags a broken format.
constexpr double kFp8FormatRelL2 = 0.1;
// Above this many multiply-adds the twin runs on sampled rows only.
constexpr double kFullCheckMacs = 2e9;

using test::DeviceBuffer;

struct Inputs {
  int M = 0, N = 0, K = 0;
  std::vector<uint8_t> a, b;   // codes [M, K], [N, K]
  std::vector<float> sa, sb;   // [M], [N]
  std::vector<float> x, w;     // the unquantised data, when the inputs come from the quantisers
};

// Gaussian activations (a few channels 20x larger, as in real prefill) and weights through the library's
// quantisers: per-token and per-channel scales, exactly the data the kernel serves.
Inputs quantised_inputs(int M, int N, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Inputs in{M, N, K, {}, {}, {}, {}, {}, {}};
  in.x.resize(static_cast<size_t>(M) * K);
  in.w.resize(static_cast<size_t>(N) * K);
  for (size_t i = 0; i < in.x.size(); ++i) in.x[i] = dist(rng) * (i % static_cast<size_t>(K) % 97 == 5 ? 20.0f : 1.0f);
  for (float& v : in.w) v = 0.02f * dist(rng);
  formats::Fp8Matrix qa = formats::fp8_quantize_per_token(in.x, M, K, "test.x");
  formats::Fp8Matrix qb = formats::fp8_quantize_weight(in.w, N, K, "test.w");
  in.a = std::move(qa.codes);
  in.sa = std::move(qa.scales);
  in.b = std::move(qb.codes);
  in.sb = std::move(qb.scales);
  return in;
}

// Uniform random finite codes with scales in [2^-8, 2^-4): fast to make for the 70B-sized weights.
Inputs random_inputs(int M, int N, int K, uint32_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in{M, N, K, {}, {}, {}, {}, {}, {}};
  auto fill = [&](std::vector<uint8_t>& v, size_t n) {
    v.resize(n);
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t r = rng();
      std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
    }
    for (uint8_t& c : v)
      if ((c & 0x7F) == 0x7F) c ^= 1;  // 0x7F / 0xFF are NaN
  };
  fill(in.a, static_cast<size_t>(M) * K);
  fill(in.b, static_cast<size_t>(N) * K);
  std::uniform_real_distribution<float> scale(0x1p-8f, 0x1p-4f);
  std::mt19937 srng(seed);
  in.sa.resize(static_cast<size_t>(M));
  in.sb.resize(static_cast<size_t>(N));
  for (float& s : in.sa) s = scale(srng);
  for (float& s : in.sb) s = scale(srng);
  return in;
}

// Integers in [-4, 4] with power-of-two scales: every product and sum is exact on the GPU (a 128-term block sum
// stays below 2^11, inside the tensor cores' accumulator precision), so D must equal the twin bit for bit.
Inputs integer_inputs(int M, int N, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in{M, N, K, {}, {}, {}, {}, {}, {}};
  auto code = [&] { return formats::fp8_e4m3_encode(static_cast<float>(static_cast<int>(rng() % 9) - 4)); };
  auto pow2 = [&] { return std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3); };
  in.a.resize(static_cast<size_t>(M) * K);
  in.b.resize(static_cast<size_t>(N) * K);
  for (auto& v : in.a) v = code();
  for (auto& v : in.b) v = code();
  in.sa.resize(static_cast<size_t>(M));
  in.sb.resize(static_cast<size_t>(N));
  for (auto& v : in.sa) v = pow2();
  for (auto& v : in.sb) v = pow2();
  return in;
}

// Runs the GEMM into a NaN-poisoned output (0xFFFF is a BF16 NaN); returns D's bits.
std::vector<uint16_t> run_gemm(const Inputs& in) {
  DeviceBuffer<uint8_t> da(in.a), db(in.b);
  DeviceBuffer<float> dsa(in.sa), dsb(in.sb);
  DeviceBuffer<uint16_t> dd(static_cast<size_t>(in.M) * in.N);
  EXPECT_EQ(dd.poison(), cudaSuccess);
  const cudaError_t e = cuda::gemm_fp8(da.p, db.p, dsa.p, dsb.p, reinterpret_cast<__nv_bfloat16*>(dd.p), in.M, in.N,
                                       in.K, nullptr);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_fp8_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dd.download();
}

// Rows the twin checks: all of them for small problems; otherwise every 128-row tile's first and last rows near
// the start and end, the last row, and random rows.
std::vector<int> rows_to_check(const Inputs& in, uint32_t seed) {
  std::vector<int> rows;
  if (static_cast<double>(in.M) * in.N * in.K <= kFullCheckMacs) {
    for (int m = 0; m < in.M; ++m) rows.push_back(m);
    return rows;
  }
  std::set<int> s = {0, 1, 63, 64, 127, 128, 129, in.M - 129, in.M - 128, in.M - 65, in.M - 64, in.M - 1};
  std::mt19937 rng(seed);
  for (int i = 0; i < 20; ++i) s.insert(static_cast<int>(rng() % static_cast<uint32_t>(in.M)));
  for (int m : s)
    if (m >= 0 && m < in.M) rows.push_back(m);
  return rows;
}

void check_against_twin(const Inputs& in, bool exact, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "M " << in.M << " N " << in.N << " K " << in.K << (exact ? " (exact)" : ""));
  const std::vector<uint16_t> d = run_gemm(in);
  for (size_t i = 0; i < d.size(); ++i)
    ASSERT_NE(d[i], 0xFFFF) << "output row " << i / in.N << ", col " << i % in.N << " not written";
  const std::vector<int> rows = rows_to_check(in, seed);
  std::vector<uint8_t> a_rows;
  std::vector<float> sa_rows;
  for (int m : rows) {
    a_rows.insert(a_rows.end(), in.a.begin() + static_cast<ptrdiff_t>(m) * in.K,
                  in.a.begin() + static_cast<ptrdiff_t>(m + 1) * in.K);
    sa_rows.push_back(in.sa[static_cast<size_t>(m)]);
  }
  const formats::Fp8GemmReference ref =
      formats::gemm_fp8_reference(a_rows, in.b, sa_rows, in.sb, static_cast<int64_t>(rows.size()), in.N, in.K);
  double err2 = 0.0, ref2 = 0.0;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int n = 0; n < in.N; ++n) {
      const size_t gi = static_cast<size_t>(rows[r]) * in.N + n, ri = r * in.N + n;
      if (exact) {
        ASSERT_EQ(d[gi], ref.bf16[ri]) << "row " << rows[r] << " col " << n << ": got " << bf16_to_f32(d[gi])
                                       << ", want " << bf16_to_f32(ref.bf16[ri]);
        continue;
      }
      const double got = bf16_to_f32(d[gi]), want = ref.value[ri];
      const double bound = kBf16Rel * std::fabs(want) + kAccumulationRel * ref.abs_dot[ri];
      ASSERT_LE(std::fabs(got - want), bound) << "row " << rows[r] << " col " << n << ": got " << got << ", ref "
                                              << want << ", sum|ab| " << ref.abs_dot[ri];
      err2 += (got - want) * (got - want);
      ref2 += want * want;
    }
  }
  if (!exact) {
    ASSERT_GT(ref2, 0.0);
    EXPECT_LE(std::sqrt(err2 / ref2), kRelL2Tol);
  }
}

struct NK {
  int N, K;
};
const NK k8B[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
const NK k70B[] = {{10240, 8192}, {8192, 8192}, {57344, 8192}, {8192, 28672}};
const int kMs[] = {1, 17, 128, 129, 512, 2048};

TEST(GemmFp8Gpu, IntegerInputsAreBitExact) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 1;
  for (const NK& s : {NK{256, 256}, NK{200, 384}, NK{6144, 4096}, NK{8, 128}, NK{96, 80}, NK{960, 576}})
    for (int M : {1, 17, 128, 129, 512}) check_against_twin(integer_inputs(M, s.N, s.K, ++seed), true, seed);
}

TEST(GemmFp8Gpu, Llama8BShapesQuantisedInputs) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 100;
  for (const NK& s : k8B)
    for (int M : kMs) check_against_twin(quantised_inputs(M, s.N, s.K, ++seed), false, seed);
}

TEST(GemmFp8Gpu, Llama70BShapesRandomCodes) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 200;
  for (const NK& s : k70B)
    for (int M : kMs) check_against_twin(random_inputs(M, s.N, s.K, ++seed), false, seed);
}

TEST(GemmFp8Gpu, LongPrefillM16384) {
  FT_REQUIRE_HOPPER();
  check_against_twin(random_inputs(16384, 4096, 4096, 300), false, 300);
}

TEST(GemmFp8Gpu, TailsAndTinyShapes) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 400;
  // K tails: 16 (one partial block), 576 (SmolLM2's hidden: 4.5 blocks), 1040 (8 blocks + 16).
  for (const NK& s : {NK{8, 128}, NK{136, 256}, NK{200, 384}, NK{1000, 128}, NK{6152, 640}, NK{64, 16}, NK{960, 576},
                      NK{8, 1040}})
    for (int M : {1, 2, 3, 64, 65, 255, 257}) check_against_twin(random_inputs(M, s.N, s.K, ++seed), false, seed);
}

TEST(GemmFp8Gpu, QuantisedProductTracksFullPrecision) {
  FT_REQUIRE_HOPPER();
  const Inputs in = quantised_inputs(256, 1024, 4096, 500);
  const std::vector<uint16_t> d = run_gemm(in);
  double err2 = 0.0, ref2 = 0.0;
  for (int m = 0; m < in.M; ++m) {
    for (int n = 0; n < in.N; ++n) {
      double exact = 0.0;
      for (int k = 0; k < in.K; ++k)
        exact += static_cast<double>(in.x[static_cast<size_t>(m) * in.K + k]) * in.w[static_cast<size_t>(n) * in.K + k];
      const double got = bf16_to_f32(d[static_cast<size_t>(m) * in.N + n]);
      err2 += (got - exact) * (got - exact);
      ref2 += exact * exact;
    }
  }
  EXPECT_LE(std::sqrt(err2 / ref2), kFp8FormatRelL2);
}

TEST(GemmFp8Gpu, DeterministicAcrossRuns) {
  FT_REQUIRE_HOPPER();
  for (int M : {17, 512}) {
    const Inputs in = random_inputs(M, 6144, 4096, 600 + static_cast<uint32_t>(M));
    EXPECT_EQ(run_gemm(in), run_gemm(in)) << "M " << M;
  }
}

TEST(GemmFp8Gpu, RejectedCallsLeaveTheOutputUntouched) {
  FT_REQUIRE_HOPPER();
  const Inputs in = random_inputs(4, 256, 512, 700);
  DeviceBuffer<uint8_t> da(in.a), db(in.b);
  DeviceBuffer<float> dsa(in.sa), dsb(in.sb);
  DeviceBuffer<uint16_t> dd(static_cast<size_t>(in.M) * in.N);
  ASSERT_EQ(dd.poison(), cudaSuccess);
  auto* d = reinterpret_cast<__nv_bfloat16*>(dd.p);
  struct Bad {
    const uint8_t* a;
    const float* sb;
    int M, N, K;
    const char* needle;
  };
  for (const Bad& b : {Bad{da.p, dsb.p, 4, 256, 500, "K = 500"}, Bad{da.p, dsb.p, 4, 252, 512, "N = 252"},
                       Bad{da.p, dsb.p, 0, 256, 512, "M = 0"}, Bad{da.p + 1, dsb.p, 4, 256, 512, "16-byte aligned"},
                       Bad{da.p, nullptr, 4, 256, 512, "non-null"}}) {
    EXPECT_EQ(cuda::gemm_fp8(b.a, db.p, dsa.p, b.sb, d, b.M, b.N, b.K, nullptr), cudaErrorInvalidValue) << b.needle;
    EXPECT_NE(std::string(cuda::gemm_fp8_last_error()).find(b.needle), std::string::npos)
        << "message '" << cuda::gemm_fp8_last_error() << "' lacks '" << b.needle << "'";
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : dd.download()) ASSERT_EQ(v, 0xFFFF);
}

// --- Host-only: the shape contract (no device needed). ---

TEST(GemmFp8Host, CanImplementNamesTheProblem) {
  std::string why;
  EXPECT_EQ(cuda::gemm_fp8_can_implement(1, 8, 128, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::gemm_fp8_can_implement(16384, 57344, 8192, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::gemm_fp8_can_implement(129, 200, 28672, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::gemm_fp8_can_implement(7, 960, 576, &why), cudaSuccess) << why;  // K tail (SmolLM2)
  struct Bad {
    int M, N, K;
    const char* needle;
  };
  for (const Bad& b : {Bad{0, 256, 256, "M = 0"}, Bad{-3, 256, 256, "M = -3"}, Bad{1, 0, 256, "N = 0"},
                       Bad{1, 12, 256, "N = 12"}, Bad{1, 256, 0, "K = 0"}, Bad{1, 256, 100, "K = 100"},
                       Bad{1, 256, 200, "K = 200"}, Bad{1 << 25, 256, 256, "M = 33554432"},
                       Bad{1 << 24, 1 << 24, 128, "output tiles"}}) {
    EXPECT_EQ(cuda::gemm_fp8_can_implement(b.M, b.N, b.K, &why), cudaErrorInvalidValue) << b.needle;
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' lacks '" << b.needle << "'";
    // The launcher refuses before touching the device (null pointers are never dereferenced).
    EXPECT_EQ(cuda::gemm_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, b.M, b.N, b.K, nullptr),
              cudaErrorInvalidValue);
    EXPECT_NE(std::string(cuda::gemm_fp8_last_error()).find(b.needle), std::string::npos);
  }
}

}  // namespace
