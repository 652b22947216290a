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
#include "cuda/gemm_w4a16_internal.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "gpu_test_util.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4Weight;
using formats::ScaleType;
namespace w4 = futransformer::cuda::w4a16;

// Tolerances (derived in w4a16_cases.h): BF16 output rounding, fp32 accumulation, and for v4 the cancellation
// of the 136 * sum(x) offset.
using test::DeviceBuffer;
using test::w4a16::error_bound;
using test::w4a16::kRelL2Tol;
using test::w4a16::offset_dot;
using test::w4a16::random_weight;
using test::w4a16::random_x;
using w4::Variant;

const char* name(Variant v) { return v == Variant::v4 ? "v4" : "v2"; }

struct UploadedWeight {
  Int4Weight w;
  DeviceBuffer<uint32_t> packed;
  DeviceBuffer<uint16_t> scales;
  explicit UploadedWeight(Int4Weight q)
      : w(std::move(q)), packed(formats::repack_int4_for_mma(w)), scales(formats::repack_int4_scales_for_mma(w)) {}
};

// Runs the GEMM on fresh inputs into a NaN-poisoned output; returns the output bits. With a tiling, through the
// internal entry point (that tiling and its variant), else through the public gemm_w4a16.
std::vector<uint16_t> run_gemm(const UploadedWeight& uw, const std::vector<uint16_t>& x, int M,
                               const w4::Tiling* tiling = nullptr) {
  const int N = static_cast<int>(uw.w.rows), K = static_cast<int>(uw.w.cols);
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<uint16_t> dy(static_cast<size_t>(M) * N);
  EXPECT_EQ(dy.poison(), cudaSuccess);
  size_t ws_bytes = cuda::gemm_w4a16_workspace_bytes(M, N, K);
  if (tiling) ws_bytes = std::max<size_t>(ws_bytes, static_cast<size_t>(w4::workspace_bytes_for(*tiling, M, N)));
  DeviceBuffer<unsigned char> ws(ws_bytes);
  // The workspace is poisoned too: split-K partials must all be written before the reduce reads them.
  EXPECT_EQ(ws.poison(), cudaSuccess);
  const auto* xp = reinterpret_cast<const __nv_bfloat16*>(dx.p);
  auto* yp = reinterpret_cast<__nv_bfloat16*>(dy.p);
  const int group = static_cast<int>(uw.w.group);
  const cudaError_t e =
      tiling ? cuda::gemm_w4a16_with_tiling(*tiling, xp, uw.packed.p, uw.scales.p, yp, M, N, K, group,
                                            uw.w.spec.scale_type, ws.p, ws_bytes, nullptr)
             : cuda::gemm_w4a16(xp, uw.packed.p, uw.scales.p, yp, M, N, K, group, uw.w.spec.scale_type, ws.p,
                                ws_bytes, nullptr);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dy.download();
}

// y against the twin: per element within error_bound(variant), relative L2 within kRelL2Tol, nothing left at the
// NaN poison.
void check_output(const std::vector<uint16_t>& y, const std::vector<float>& ref, const std::vector<float>& abs_dot,
                  const std::vector<double>& off, int N, Variant v) {
  SCOPED_TRACE(name(v));
  ASSERT_EQ(y.size(), ref.size());
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double got = bf16_to_f32(y[i]);
    ASSERT_FALSE(std::isnan(got)) << "output " << i << " (row " << i / N << ", col " << i % N << ") not written";
    ASSERT_LE(std::fabs(got - ref[i]), error_bound(v, ref[i], abs_dot[i], off[i]))
        << "row " << i / N << " col " << i % N << ": got " << got << ", ref " << ref[i];
    err2 += (got - ref[i]) * (got - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), kRelL2Tol);
}

// Both variants on the library's tiling for this shape, each against the twin; the public launcher must give
// exactly the output of the variant it selects (gemm_w4a16_variant_for, which honours FT_W4A16_VARIANT).
void check_against_twin(const UploadedWeight& uw, int M, uint32_t seed) {
  const int N = static_cast<int>(uw.w.rows), K = static_cast<int>(uw.w.cols);
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << uw.w.group << " scales "
                                  << (uw.w.spec.scale_type == ScaleType::F16 ? "fp16" : "bf16"));
  const std::vector<uint16_t> x = random_x(M, K, seed);
  std::vector<float> abs_dot;
  const std::vector<float> ref = formats::gemm_w4a16_reference(x, M, uw.w, &abs_dot);
  const std::vector<double> off = offset_dot(x, M, uw.w);
  w4::Tiling t;
  ASSERT_EQ(cuda::gemm_w4a16_plan(M, N, K, static_cast<int>(uw.w.group), uw.w.spec.scale_type, &t), cudaSuccess);
  const Variant chosen = t.variant;
  std::vector<uint16_t> y_chosen;
  for (Variant v : {Variant::v2, Variant::v4}) {
    t.variant = v;
    const std::vector<uint16_t> y = run_gemm(uw, x, M, &t);
    check_output(y, ref, abs_dot, off, N, v);
    if (v == chosen) y_chosen = y;
  }
  EXPECT_EQ(run_gemm(uw, x, M), y_chosen) << "gemm_w4a16 differs from the variant it selects (" << name(chosen)
                                          << ")";
}

// v4 decode sizes (1 .. 16: swapped up to 8, one 16-row tile above) and the m-tile edges; both variants each.
const std::vector<int> kMs = {1, 2, 3, 5, 7, 8, 9, 16, 17, 33, 64};
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
        for (int M : {1, 2, 3, 5, 8, 9, 16, 17, 64}) check_against_twin(uw, M, ++seed);
      }
    }
  }
}

// Small-model shapes whose K holds an odd number of groups and whose N is not a multiple of 64 (SmolLM2-135M:
// fused q|k|v 576→960, o 576→576, gate|up 576→3072, down 1536→576), at the prompt-sized M of a prefill.
TEST(GemmW4A16Gpu, SmallModelShapesOddGroupCounts) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 5000;
  for (int group : {64, 32}) {
    for (const NK& s : {NK{960, 576}, NK{576, 576}, NK{3072, 576}, NK{576, 1536}}) {
      const UploadedWeight uw(random_weight(s.N, s.K, group, ScaleType::F16, ++seed));
      for (int M : {1, 2, 3, 6, 7, 16, 40, 64}) check_against_twin(uw, M, ++seed);
    }
  }
}

// The explicit tilings of the CPU emulation (w4a16_cases.h), both variants: warp ranges that start inside a group,
// single-block last pairs, idle warps, ring wrap-around, split-K, M <= 8 through the 16-row path.
TEST(GemmW4A16Gpu, ExplicitTilingsBothVariants) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 3000;
  for (const test::w4a16::TilingCase& c : test::w4a16::tiling_cases()) {
    SCOPED_TRACE(testing::Message() << c.why << ": M " << c.M << " N " << c.N << " K " << c.K << " group " << c.group
                                    << " warps_n " << c.t.warps_n << " splits " << c.t.splits);
    const UploadedWeight uw(random_weight(c.N, c.K, c.group, c.st, ++seed));
    const std::vector<uint16_t> x = random_x(c.M, c.K, ++seed);
    std::vector<float> abs_dot;
    const std::vector<float> ref = formats::gemm_w4a16_reference(x, c.M, uw.w, &abs_dot);
    const std::vector<double> off = offset_dot(x, c.M, uw.w);
    for (Variant v : {Variant::v2, Variant::v4}) {
      w4::Tiling t = c.t;
      t.variant = v;
      check_output(run_gemm(uw, x, c.M, &t), ref, abs_dot, off, c.N, v);
    }
  }
}

TEST(GemmW4A16Gpu, DeterministicAcrossRuns) {
  FT_REQUIRE_CUDA_DEVICE();
  const UploadedWeight uw(random_weight(4096, 4096, 128, ScaleType::BF16, 77));
  for (int M : {1, 8, 16, 64}) {
    const std::vector<uint16_t> x = random_x(M, 4096, 78 + M);
    w4::Tiling t;
    ASSERT_EQ(cuda::gemm_w4a16_plan(M, 4096, 4096, 128, ScaleType::BF16, &t), cudaSuccess);
    for (Variant v : {Variant::v2, Variant::v4}) {
      t.variant = v;
      EXPECT_EQ(run_gemm(uw, x, M, &t), run_gemm(uw, x, M, &t)) << "M " << M << " " << name(v);
    }
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
  // The internal entry point refuses tilings that do not fit the shape, before launching anything.
  w4::Tiling t;
  ASSERT_EQ(cuda::gemm_w4a16_plan(M, N, K, 128, ScaleType::BF16, &t), cudaSuccess);
  t.variant = Variant::v4;
  auto call_tiling = [&](const w4::Tiling& tt) {
    return cuda::gemm_w4a16_with_tiling(tt, reinterpret_cast<const __nv_bfloat16*>(dx.p), uw.packed.p, uw.scales.p,
                                        reinterpret_cast<__nv_bfloat16*>(dy.p), M, N, K, 128, ScaleType::BF16, ws.p,
                                        ws_bytes, nullptr);
  };
  w4::Tiling bad = t;
  bad.rows = M + 1;
  EXPECT_EQ(call_tiling(bad), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("rows"), std::string::npos);
  bad = t;
  bad.splits = 65;
  EXPECT_EQ(call_tiling(bad), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("splits"), std::string::npos);
  bad = t;
  bad.splits = t.splits + 1;  // more partials than the workspace holds
  if (w4::workspace_bytes_for(bad, M, N) > static_cast<int64_t>(ws_bytes)) {
    EXPECT_EQ(call_tiling(bad), cudaErrorInvalidValue);
    EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("workspace"), std::string::npos);
  }
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
  // Every explicit tiling of the emulation / GPU tests is launchable; broken ones are refused with the field named.
  for (const test::w4a16::TilingCase& c : test::w4a16::tiling_cases()) {
    std::string why;
    EXPECT_TRUE(w4::tiling_is_valid(c.t, c.M, c.N, c.K, c.group, h200, &why)) << c.why << ": " << why;
  }
  const w4::Tiling good = w4::choose_tiling(4, 4096, 4096, 128, h200);
  struct Broken {
    w4::Tiling t;
    const char* needle;
  };
  std::vector<Broken> broken(5, Broken{good, ""});
  broken[0].t.m_tiles = 2, broken[0].needle = "m_tiles";
  broken[1].t.rows = 5, broken[1].needle = "rows";
  broken[2].t.warps_k = w4::kWarps / good.warps_n + 1, broken[2].needle = "warps_n * warps_k";
  broken[3].t.splits = 0, broken[3].needle = "splits";
  broken[4].t.warps_n = 3, broken[4].needle = "warps_n";
  for (const Broken& b : broken) {
    std::string why;
    EXPECT_FALSE(w4::tiling_is_valid(b.t, 4, 4096, 4096, 128, h200, &why)) << b.needle;
    EXPECT_NE(why.find(b.needle), std::string::npos) << "'" << why << "' lacks '" << b.needle << "'";
  }
  w4::Tiling rows8_big = w4::choose_tiling(9, 4096, 4096, 128, h200);
  rows8_big.rows8 = true;
  EXPECT_FALSE(w4::tiling_is_valid(rows8_big, 9, 4096, 4096, 128, h200, nullptr));
  // Variant choice: v4 for decode sizes, v2 above.
  for (int M = 1; M <= 64; ++M) EXPECT_EQ(w4::choose_variant(M), M <= 16 ? Variant::v4 : Variant::v2) << M;

  // The decode target: Llama-3.1-8B gate_up at M = 1 must fill the 132 SMs.
  const w4::Tiling t = w4::choose_tiling(1, 28672, 4096, 128, h200);
  EXPECT_GE(int64_t{28672} / (32 * t.warps_n) * t.splits, h200.sm_count)
      << w4::describe_tiling(t, 1, 28672, 4096, 128, h200);
}

}  // namespace
