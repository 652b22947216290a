// GPU tests of the W4A16 GEMM against its CPU twin (formats::gemm_w4a16_reference on the dequantised weights),
// plus host-only checks of the shape contract and the tiling heuristics. Device tests report SKIPPED without a
// CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/gemm_w4a16_heuristics.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "gpu_test_util.h"

namespace {

using namespace futransformer;
using formats::Int4Weight;
using formats::ScaleType;
namespace w4 = futransformer::cuda::w4a16;

// Tolerances, from the number formats: y is rounded once to BF16 (at most 2^-8 relative); the kernel's
// products (x * (u - 8)) are exact, scales are applied in fp32, and the fp32 tensor-core accumulation over
// K <= 16384 (sums of 16-term blocks, truncating adds) stays below 2^-12 of sum |x w| even added linearly.
constexpr double kBf16Rounding = 1.0 / 256.0;
constexpr double kAccumulationRel = 1.0 / 4096.0;
// Whole-tensor relative L2 error; BF16 output rounding alone gives about 2e-3.
constexpr double kRelL2Tol = 1e-2;

using test::DeviceBuffer;

Int4Weight random_weight(int N, int K, int group, ScaleType st, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(N) * K);
  for (float& v : w) v = dist(rng);
  formats::Int4Spec spec;
  spec.group_size = group;
  spec.symmetric = true;
  spec.scale_type = st;
  return formats::int4_quantize_rtn(w, N, K, spec, "test.weight");
}

std::vector<uint16_t> random_x(int M, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(M) * K);
  for (auto& v : x) v = f32_to_bf16(dist(rng));
  return x;
}

struct UploadedWeight {
  Int4Weight w;
  DeviceBuffer<uint32_t> packed;
  DeviceBuffer<uint16_t> scales;
  explicit UploadedWeight(Int4Weight q)
      : w(std::move(q)), packed(formats::repack_int4_for_mma(w)), scales(formats::repack_int4_scales_for_mma(w)) {}
};

// Runs the GEMM on fresh inputs into a NaN-poisoned output; returns the output bits.
std::vector<uint16_t> run_gemm(const UploadedWeight& uw, const std::vector<uint16_t>& x, int M) {
  const int N = static_cast<int>(uw.w.rows), K = static_cast<int>(uw.w.cols);
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<uint16_t> dy(static_cast<size_t>(M) * N);
  EXPECT_EQ(dy.poison(), cudaSuccess);
  const size_t ws_bytes = cuda::gemm_w4a16_workspace_bytes(M, N, K);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  const cudaError_t e = cuda::gemm_w4a16(reinterpret_cast<const __nv_bfloat16*>(dx.p), uw.packed.p, uw.scales.p,
                                         reinterpret_cast<__nv_bfloat16*>(dy.p), M, N, K, static_cast<int>(uw.w.group),
                                         uw.w.spec.scale_type, ws.p, ws_bytes, nullptr);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dy.download();
}

void check_against_twin(const UploadedWeight& uw, int M, uint32_t seed) {
  const int N = static_cast<int>(uw.w.rows), K = static_cast<int>(uw.w.cols);
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << uw.w.group << " scales "
                                  << (uw.w.spec.scale_type == ScaleType::F16 ? "fp16" : "bf16"));
  const std::vector<uint16_t> x = random_x(M, K, seed);
  std::vector<float> abs_dot;
  const std::vector<float> ref = formats::gemm_w4a16_reference(x, M, uw.w, &abs_dot);
  const std::vector<uint16_t> y = run_gemm(uw, x, M);
  ASSERT_EQ(y.size(), ref.size());
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double got = bf16_to_f32(y[i]);
    ASSERT_FALSE(std::isnan(got)) << "output " << i << " (row " << i / N << ", col " << i % N << ") not written";
    const double bound = kBf16Rounding * std::fabs(ref[i]) + kAccumulationRel * abs_dot[i];
    ASSERT_LE(std::fabs(got - ref[i]), bound)
        << "row " << i / N << " col " << i % N << ": got " << got << ", ref " << ref[i];
    err2 += (got - ref[i]) * (got - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), kRelL2Tol);
}

const std::vector<int> kMs = {1, 2, 3, 7, 16, 17, 33, 64};
struct NK {
  int N, K;
};
const std::vector<NK> kShapes = {{256, 256}, {768, 4096}, {4096, 4096}, {6144, 4096}, {4096, 14336}};

TEST(GemmW4A16Gpu, Bf16ScalesGroup128AllShapes) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 1;
  for (const NK& s : kShapes) {
    const UploadedWeight uw(random_weight(s.N, s.K, 128, ScaleType::BF16, ++seed));
    for (int M : kMs) check_against_twin(uw, M, ++seed);
  }
}

TEST(GemmW4A16Gpu, Fp16ScalesGroup128) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 1000;
  for (const NK& s : {NK{256, 256}, NK{768, 4096}, NK{4096, 4096}}) {
    const UploadedWeight uw(random_weight(s.N, s.K, 128, ScaleType::F16, ++seed));
    for (int M : kMs) check_against_twin(uw, M, ++seed);
  }
}

TEST(GemmW4A16Gpu, Groups64And32BothScaleTypes) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 2000;
  for (int group : {64, 32}) {
    for (ScaleType st : {ScaleType::BF16, ScaleType::F16}) {
      for (const NK& s : {NK{256, 256}, NK{768, 4096}}) {
        const UploadedWeight uw(random_weight(s.N, s.K, group, st, ++seed));
        for (int M : {1, 7, 17, 64}) check_against_twin(uw, M, ++seed);
      }
    }
  }
}

// Small-model shapes whose K holds an odd number of groups and whose N is not a multiple of 64 (SmolLM2-135M:
// fused q|k|v 576→960, o 576→576, gate|up 576→3072, down 1536→576), at the prompt-sized M of a prefill.
TEST(GemmW4A16Gpu, SmallModelShapesOddGroupCounts) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 3000;
  for (int group : {64, 32}) {
    for (const NK& s : {NK{960, 576}, NK{576, 576}, NK{3072, 576}, NK{576, 1536}}) {
      const UploadedWeight uw(random_weight(s.N, s.K, group, ScaleType::F16, ++seed));
      for (int M : {1, 2, 3, 6, 7, 16, 40, 64}) check_against_twin(uw, M, ++seed);
    }
  }
}

TEST(GemmW4A16Gpu, DeterministicAcrossRuns) {
  FT_REQUIRE_CUDA_DEVICE();
  const UploadedWeight uw(random_weight(4096, 4096, 128, ScaleType::BF16, 77));
  for (int M : {1, 16, 64}) {
    const std::vector<uint16_t> x = random_x(M, 4096, 78 + M);
    EXPECT_EQ(run_gemm(uw, x, M), run_gemm(uw, x, M)) << "M " << M;
  }
}

TEST(GemmW4A16Gpu, RejectedCallsLeaveTheOutputUntouched) {
  FT_REQUIRE_CUDA_DEVICE();
  const int M = 4, N = 256, K = 8192;
  const UploadedWeight uw(random_weight(N, K, 128, ScaleType::BF16, 91));
  DeviceBuffer<uint16_t> dx(random_x(M, K, 92));
  DeviceBuffer<uint16_t> dy(static_cast<size_t>(M) * N);
  ASSERT_EQ(dy.poison(), cudaSuccess);
  const size_t ws_bytes = cuda::gemm_w4a16_workspace_bytes(M, N, K);
  ASSERT_GT(ws_bytes, 0u) << "N = 256 with K = 8192 should split K across the SMs";
  DeviceBuffer<unsigned char> ws(ws_bytes);
  auto call = [&](int m, int n, int k, int group, size_t wsb) {
    return cuda::gemm_w4a16(reinterpret_cast<const __nv_bfloat16*>(dx.p), uw.packed.p, uw.scales.p,
                            reinterpret_cast<__nv_bfloat16*>(dy.p), m, n, k, group, ScaleType::BF16, ws.p, wsb,
                            nullptr);
  };
  EXPECT_EQ(call(M, 250, K, 128, ws_bytes), cudaErrorInvalidValue);  // N tail
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("N = 250"), std::string::npos);
  EXPECT_EQ(call(M, N, 4000, 128, ws_bytes), cudaErrorInvalidValue);  // K tail of a group
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("K = 4000"), std::string::npos);
  EXPECT_EQ(call(M, N, K, 128, ws_bytes - 16), cudaErrorInvalidValue);  // workspace too small
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("workspace"), std::string::npos);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : dy.download()) ASSERT_EQ(v, 0xFFFF);
}

// --- Host-only: the shape contract and the heuristics (no device needed). ---

TEST(GemmW4A16Host, CanImplementNamesTheProblem) {
  std::string why;
  EXPECT_EQ(cuda::gemm_w4a16_can_implement(16, 4096, 4096, 128, ScaleType::BF16, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::gemm_w4a16_can_implement(64, 8192, 28672, 64, ScaleType::F16, &why), cudaSuccess) << why;
  struct Bad {
    int M, N, K, group;
    const char* needle;
  };
  for (const Bad& b :
       {Bad{0, 256, 256, 128, "M = 0"}, Bad{65, 256, 256, 128, "M = 65"}, Bad{1, 250, 256, 128, "N = 250"},
        Bad{1, 256, 4100, 128, "K = 4100"}, Bad{1, 256, 4000, 128, "K = 4000"}, Bad{1, 256, 256, 96, "group size 96"},
        Bad{1, 256, 64, 128, "K = 64"}}) {
    EXPECT_EQ(cuda::gemm_w4a16_can_implement(b.M, b.N, b.K, b.group, ScaleType::BF16, &why), cudaErrorInvalidValue);
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' lacks '" << b.needle << "'";
    // The launcher refuses before touching the device (null pointers are never dereferenced).
    EXPECT_EQ(cuda::gemm_w4a16(nullptr, nullptr, nullptr, nullptr, b.M, b.N, b.K, b.group, ScaleType::BF16, nullptr, 0,
                               nullptr),
              cudaErrorInvalidValue);
    EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find(b.needle), std::string::npos);
  }
}

TEST(GemmW4A16Host, HeuristicTilingsAreLaunchable) {
  const w4::DeviceLimits h200;
  const std::vector<NK> shapes = {{256, 256},    {768, 4096},   {4096, 4096},  {6144, 4096},
                                  {4096, 14336}, {28672, 4096}, {10240, 8192}, {8192, 8192},
                                  {57344, 8192}, {8192, 28672}, {32, 128},     {96, 4096}};
  for (const NK& s : shapes) {
    for (int group : {32, 64, 128}) {
      for (int M = 1; M <= 64; ++M) {
        if (cuda::gemm_w4a16_can_implement(M, s.N, s.K, group, ScaleType::BF16, nullptr) != cudaSuccess) continue;
        const w4::Tiling t = w4::choose_tiling(M, s.N, s.K, group, h200);
        SCOPED_TRACE(w4::describe_tiling(t, M, s.N, s.K, group, h200));
        ASSERT_EQ(t.m_tiles, (M + 15) / 16);
        ASSERT_EQ(t.rows8, M <= 8);
        ASSERT_EQ(t.rows, M);
        ASSERT_EQ(t.warps_n * t.warps_k, w4::kWarps);
        ASSERT_EQ(s.N % (32 * t.warps_n), 0);
        ASSERT_GE(t.splits, 1);
        ASSERT_LE(t.splits, s.K / group);
        ASSERT_LE(w4::smem_layout(t, s.K, group).total, h200.smem_per_block);
      }
    }
  }
  // The decode target: Llama-3.1-8B gate_up at M = 1 must fill the 132 SMs.
  const w4::Tiling t = w4::choose_tiling(1, 28672, 4096, 128, h200);
  EXPECT_GE(int64_t{28672} / (32 * t.warps_n) * t.splits, h200.sm_count)
      << w4::describe_tiling(t, 1, 28672, 4096, 128, h200);
}

}  // namespace
