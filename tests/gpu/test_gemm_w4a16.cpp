// GPU tests of the W4A16 GEMM against its CPU twin (formats::gemm_w4a16_reference on the dequantised weights),
// plus host-only checks of the shape contract and the tiling heuristics. Device tests report SKIPPED without a
// CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/gemm_w4a16_heuristics.h"
#include "cuda/gemm_w4a16_tuned.h"
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

// The tiling of `config` for a shape (variant v4; V4Config{} is the default tiling, on which v2 can run too).
w4::Tiling config_tiling(int M, const UploadedWeight& uw, const w4::V4Config& config) {
  w4::Tiling t;
  EXPECT_EQ(cuda::gemm_w4a16_plan_config(M, static_cast<int>(uw.w.rows), static_cast<int>(uw.w.cols),
                                         static_cast<int>(uw.w.group), uw.w.spec.scale_type, config, &t),
            cudaSuccess);
  return t;
}

// The swap32 tiling of a shape with M = 17..32 (variant v4): the default tiling with swap32 on.
w4::Tiling swap32_tiling(int M, const UploadedWeight& uw) {
  w4::V4Config c;
  c.swap32 = true;
  const w4::Tiling t = config_tiling(M, uw, c);
  EXPECT_TRUE(t.swap32) << "M " << M;
  return t;
}

// The library's tiling for this shape (gemm_w4a16_plan: its variant, and the environment's v4 config if any) and
// the other variant on the default tiling, each against the twin, and for M = 17..32 the swap32 tiling too; the
// public launcher must give exactly the output of the tiling it plans. Correct under any FT_W4A16_* environment,
// so the suite can be rerun with one.
void check_against_twin(const UploadedWeight& uw, int M, uint32_t seed) {
  const int N = static_cast<int>(uw.w.rows), K = static_cast<int>(uw.w.cols);
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << uw.w.group << " scales "
                                  << (uw.w.spec.scale_type == ScaleType::F16 ? "fp16" : "bf16"));
  const std::vector<uint16_t> x = random_x(M, K, seed);
  std::vector<float> abs_dot;
  const std::vector<float> ref = formats::gemm_w4a16_reference(x, M, uw.w, &abs_dot);
  const std::vector<double> off = offset_dot(x, M, uw.w);
  w4::Tiling lib;
  ASSERT_EQ(cuda::gemm_w4a16_plan(M, N, K, static_cast<int>(uw.w.group), uw.w.spec.scale_type, &lib), cudaSuccess);
  const std::vector<uint16_t> y_lib = run_gemm(uw, x, M, &lib);
  check_output(y_lib, ref, abs_dot, off, N, lib.variant);
  w4::Tiling other = config_tiling(M, uw, w4::V4Config{});
  other.variant = lib.variant == Variant::v4 ? Variant::v2 : Variant::v4;
  if (other.variant == Variant::v2) other.swap32 = false;  // a v4-only path (kSwap32ByDefault)
  check_output(run_gemm(uw, x, M, &other), ref, abs_dot, off, N, other.variant);
  if (M >= w4::kSwap32MinM && M <= w4::kSwap32MaxM) {
    SCOPED_TRACE("swap32");
    const w4::Tiling s32 = swap32_tiling(M, uw);
    check_output(run_gemm(uw, x, M, &s32), ref, abs_dot, off, N, Variant::v4);
  }
  EXPECT_EQ(run_gemm(uw, x, M), y_lib) << "gemm_w4a16 differs from the tiling it plans (" << name(lib.variant)
                                       << ")";
}

// Every sweep configuration (w4a16::v4_sweep_configs) past the default on the tiling the heuristic gives it,
// against the twin with the v4 bound; swap16 configs only where they change the path (M = 9..16), and for
// M = 17..32 only the configs whose swap32 differs from the default (the others give the default tiling there).
void check_configs_against_twin(const UploadedWeight& uw, const std::vector<int>& Ms, uint32_t seed) {
  const int N = static_cast<int>(uw.w.rows), K = static_cast<int>(uw.w.cols);
  for (int M : Ms) {
    SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << uw.w.group << " scales "
                                    << (uw.w.spec.scale_type == ScaleType::F16 ? "fp16" : "bf16"));
    const std::vector<uint16_t> x = random_x(M, K, ++seed);
    std::vector<float> abs_dot;
    const std::vector<float> ref = formats::gemm_w4a16_reference(x, M, uw.w, &abs_dot);
    const std::vector<double> off = offset_dot(x, M, uw.w);
    const std::vector<w4::NamedV4Config> configs = w4::v4_sweep_configs();
    for (size_t i = 1; i < configs.size(); ++i) {
      const w4::V4Config& c = configs[i].config;
      if (c.swap16 && (M < 9 || M > 16)) continue;
      const bool swap32_range = M >= w4::kSwap32MinM && M <= w4::kSwap32MaxM;
      const bool wgmma_range = c.wgmma && M <= w4::kWgMaxM;
      if (M > w4::kV4DefaultMaxM && (!swap32_range || c.swap32 == w4::kSwap32ByDefault) && !wgmma_range) continue;
      w4::V4Config rest = c;
      rest.swap32 = w4::kSwap32ByDefault;
      if (M <= w4::kV4DefaultMaxM && c.swap32 != w4::kSwap32ByDefault && rest == w4::V4Config{}) continue;  // default
      const w4::Tiling t = config_tiling(M, uw, c);
      SCOPED_TRACE(testing::Message() << configs[i].name << ": warps " << t.warps << " stages " << t.stages
                                      << " warps_n " << t.warps_n << " splits " << t.splits << " swap16 "
                                      << t.swap16 << " swap32 " << t.swap32);
      ASSERT_EQ(t.warps, M <= 16 ? c.warps : w4::kWarps);
      ASSERT_EQ(t.swap16, c.swap16 && M >= 9 && M <= 16);
      ASSERT_EQ(t.swap32, c.swap32 && swap32_range);
      ASSERT_EQ(t.wgmma, wgmma_range && (N / 32) % w4::kWgWarps == 0);
      ASSERT_EQ(t.stream_x, t.wgmma && c.stream_x && (N / 32) % w4::kWarps == 0);
      check_output(run_gemm(uw, x, M, &t), ref, abs_dot, off, N, Variant::v4);
    }
  }
}

// v4 decode sizes (1 .. 16: swapped up to 8, one 16-row tile above), swap32's range (17 .. 32: three tiles up to
// 24, four above) and the m-tile edges; both variants each, and swap32 where it applies.
const std::vector<int> kMs = {1, 2, 3, 5, 7, 8, 9, 16, 17, 24, 25, 32, 33, 64};
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
        for (int M : {1, 2, 3, 5, 8, 9, 16, 17, 24, 31, 32, 64}) check_against_twin(uw, M, ++seed);
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
      for (int M : {1, 2, 3, 6, 7, 16, 20, 29, 40, 64}) check_against_twin(uw, M, ++seed);
    }
  }
}

// Each explicit tiling case (w4a16_cases.h) against the twin on fresh weights and activations drawn from seed: on the
// listed variants, or as the case states it (variant v4) when none are listed.
void check_explicit_cases(const std::vector<test::w4a16::TilingCase>& cases, uint32_t seed,
                          std::initializer_list<Variant> variants = {}) {
  for (const test::w4a16::TilingCase& c : cases) {
    SCOPED_TRACE(testing::Message() << c.why << ": M " << c.M << " N " << c.N << " K " << c.K << " group " << c.group
                                    << " warps " << c.t.warps << " stages " << c.t.stages << " warps_n "
                                    << c.t.warps_n << " splits " << c.t.splits << " swap16 " << c.t.swap16
                                    << " swap32 " << c.t.swap32 << " wgmma " << c.t.wgmma << " stream_x "
                                    << c.t.stream_x);
    const UploadedWeight uw(random_weight(c.N, c.K, c.group, c.st, ++seed));
    const std::vector<uint16_t> x = random_x(c.M, c.K, ++seed);
    std::vector<float> abs_dot;
    const std::vector<float> ref = formats::gemm_w4a16_reference(x, c.M, uw.w, &abs_dot);
    const std::vector<double> off = offset_dot(x, c.M, uw.w);
    if (variants.size() == 0) {
      check_output(run_gemm(uw, x, c.M, &c.t), ref, abs_dot, off, c.N, Variant::v4);
      continue;
    }
    for (Variant v : variants) {
      w4::Tiling t = c.t;
      t.variant = v;
      check_output(run_gemm(uw, x, c.M, &t), ref, abs_dot, off, c.N, v);
    }
  }
}

// The explicit tilings of the CPU emulation (w4a16_cases.h), both variants: warp ranges that start inside a group,
// single-block last pairs, idle warps, ring wrap-around, split-K, M <= 8 through the 16-row path.
TEST(GemmW4A16Gpu, ExplicitTilingsBothVariants) {
  FT_REQUIRE_CUDA_DEVICE();
  check_explicit_cases(test::w4a16::tiling_cases(), 3000, {Variant::v2, Variant::v4});
}

// The explicit tilings on the other compiled (warps, stages) shapes and the swapped two-tile path (v4, M <= 16), and
// the swap32 cases (M = 17..32): idle warps in 16-warp CTAs, ring wrap-around at 32 slots, warp ranges inside
// groups, uneven split-K, clamped rows of a third or fourth activation tile.
TEST(GemmW4A16Gpu, ExplicitTilingsV4Configs) {
  FT_REQUIRE_CUDA_DEVICE();
  check_explicit_cases(test::w4a16::v4_config_cases(), 3500);
}

// The warpgroup path, staged and streamed, on explicit tilings (w4a16_cases.h wgmma_cases) with the v4 bound.
TEST(GemmW4A16Gpu, ExplicitTilingsWgmma) {
  FT_REQUIRE_CUDA_DEVICE();
  check_explicit_cases(test::w4a16::wgmma_cases(), 3900);
}

// The sweep configurations as the heuristic tiles them: decode M = 1..16 (9..16 also swapped) and swap32 at
// M = 17..32, groups 128 / 64 / 32, both scale types, odd group counts (SmolLM2 shapes with K = 576: 9 groups of 64,
// 576 x 1152: 9 groups of 128), split-K where the heuristic picks it (the large K shapes).
TEST(GemmW4A16Gpu, V4ConfigsAgainstTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  std::vector<int> all_m;
  for (int M = 1; M <= 32; ++M) all_m.push_back(M);
  const std::vector<int> some_m = {1, 5, 8, 9, 13, 16, 17, 24, 25, 31, 32};
  uint32_t seed = 6000;
  auto check = [&](int N, int K, int group, ScaleType st, const std::vector<int>& Ms) {
    seed += 100;
    check_configs_against_twin(UploadedWeight(random_weight(N, K, group, st, seed)), Ms, seed);
  };
  for (const NK& s : {NK{256, 256}, NK{768, 4096}}) check(s.N, s.K, 128, ScaleType::BF16, all_m);
  for (const NK& s : {NK{4096, 4096}, NK{6144, 4096}, NK{4096, 14336}}) check(s.N, s.K, 128, ScaleType::BF16, some_m);
  check(576, 1152, 128, ScaleType::F16, some_m);
  for (int group : {64, 32}) {
    for (ScaleType st : {ScaleType::BF16, ScaleType::F16}) {
      check(768, 4096, group, st, some_m);
      for (const NK& s : {NK{960, 576}, NK{576, 1536}}) check(s.N, s.K, group, st, all_m);
    }
  }
}

TEST(GemmW4A16Gpu, DeterministicAcrossRuns) {
  FT_REQUIRE_CUDA_DEVICE();
  const UploadedWeight uw(random_weight(4096, 4096, 128, ScaleType::BF16, 77));
  for (int M : {1, 8, 12, 16, 24, 32, 64}) {
    const std::vector<uint16_t> x = random_x(M, 4096, 78 + M);
    w4::Tiling t = config_tiling(M, uw, w4::V4Config{});
    for (Variant v : {Variant::v2, Variant::v4}) {
      t.variant = v;
      if (v == Variant::v2) t.swap32 = false;
      EXPECT_EQ(run_gemm(uw, x, M, &t), run_gemm(uw, x, M, &t)) << "M " << M << " " << name(v);
    }
    for (const w4::NamedV4Config& c : w4::v4_sweep_configs()) {
      const w4::Tiling tc = config_tiling(M, uw, c.config);
      EXPECT_EQ(run_gemm(uw, x, M, &tc), run_gemm(uw, x, M, &tc)) << "M " << M << " " << c.name;
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
  // Configurations the kernels are not compiled for, or that the variant / M do not allow.
  bad = t;
  bad.warps = 16;
  bad.warps_k = 16 / bad.warps_n;
  bad.variant = Variant::v2;
  EXPECT_EQ(call_tiling(bad), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("need variant v4"), std::string::npos);
  bad = t;
  bad.stages = 64;
  EXPECT_EQ(call_tiling(bad), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("not a compiled kernel shape"), std::string::npos);
  bad = t;
  bad.swap16 = true;  // M = 4
  EXPECT_EQ(call_tiling(bad), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("swap16"), std::string::npos);
  bad = t;
  bad.swap32 = true;  // M = 4
  EXPECT_EQ(call_tiling(bad), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("swap32"), std::string::npos);
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
  for (const test::w4a16::TilingCase& c : test::w4a16::v4_config_cases()) {
    std::string why;
    EXPECT_TRUE(w4::tiling_is_valid(c.t, c.M, c.N, c.K, c.group, h200, &why)) << c.why << ": " << why;
  }
  for (const test::w4a16::TilingCase& c : test::w4a16::wgmma_cases()) {
    std::string why;
    EXPECT_TRUE(w4::tiling_is_valid(c.t, c.M, c.N, c.K, c.group, h200, &why)) << c.why << ": " << why;
    w4::Tiling bad = c.t;
    bad.warps_n = 2, bad.warps_k = 4;
    EXPECT_FALSE(w4::tiling_is_valid(bad, c.M, c.N, c.K, c.group, h200, &why)) << c.why;
    EXPECT_NE(why.find("wgmma"), std::string::npos) << why;
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
  // Variant choice: v4 for decode sizes, v2 above, v4 again for M = 17..32 with swap32 on (the default
  // kSwap32ByDefault); and the default tiling carries swap32 exactly there.
  for (int M = 1; M <= 64; ++M) {
    const bool s32_range = M >= 17 && M <= 32;
    EXPECT_EQ(w4::choose_variant(M, false), M <= 16 ? Variant::v4 : Variant::v2) << M;
    EXPECT_EQ(w4::choose_variant(M, true), M <= 32 ? Variant::v4 : Variant::v2) << M;
    EXPECT_EQ(w4::choose_variant(M), w4::choose_variant(M, w4::kSwap32ByDefault)) << M;
    EXPECT_EQ(w4::choose_variant(M, false, true), M <= 32 ? Variant::v4 : Variant::v2) << M;
    EXPECT_EQ(w4::choose_tiling(M, 4096, 4096, 128, h200).swap32, w4::kSwap32ByDefault && s32_range) << M;
  }

  // The decode target: Llama-3.1-8B gate_up at M = 1 must fill the 132 SMs.
  const w4::Tiling t = w4::choose_tiling(1, 28672, 4096, 128, h200);
  EXPECT_GE(int64_t{28672} / (32 * t.warps_n) * t.splits, h200.sm_count)
      << w4::describe_tiling(t, 1, 28672, 4096, 128, h200);
}

// Every sweep configuration gives launchable v4 tilings with its own (warps, stages, swap16) for M <= 16, the
// default tiling with its swap32 for M = 17..32 and the default tiling above; the default configuration is the
// default tiling.
TEST(GemmW4A16Host, V4ConfigTilingsAreLaunchable) {
  const w4::DeviceLimits h200;
  const std::vector<NK> shapes = {{256, 256},    {768, 4096},   {4096, 4096},  {6144, 4096},  {4096, 14336},
                                  {28672, 4096}, {10240, 8192}, {8192, 8192},  {57344, 8192}, {8192, 28672},
                                  {32, 128},     {96, 4096},    {960, 576},    {576, 1536}};
  for (const w4::NamedV4Config& c : w4::v4_sweep_configs()) {
    for (const NK& s : shapes) {
      for (int group : {32, 64, 128}) {
        for (int M = 1; M <= 40; ++M) {
          if (cuda::gemm_w4a16_can_implement(M, s.N, s.K, group, ScaleType::BF16, nullptr) != cudaSuccess) continue;
          w4::Tiling t = w4::choose_tiling(M, s.N, s.K, group, h200, c.config);
          t.variant = Variant::v4;
          SCOPED_TRACE(testing::Message() << c.name << ": " << w4::describe_tiling(t, M, s.N, s.K, group, h200));
          const bool wgmma = c.config.wgmma && M <= w4::kWgMaxM && (s.N / 32) % w4::kWgWarps == 0;
          ASSERT_EQ(t.wgmma, wgmma);
          if (wgmma) {
            std::string why;
            ASSERT_TRUE(w4::tiling_is_valid(t, M, s.N, s.K, group, h200, &why)) << why;
            ASSERT_EQ(t.warps, w4::kWarps);
            ASSERT_EQ(t.warps_n % w4::kWgWarps, 0);
            ASSERT_FALSE(t.swap16 || t.swap32);
            ASSERT_EQ(t.stream_x, c.config.stream_x && s.N % 256 == 0);
            if (t.stream_x) ASSERT_EQ(t.warps_k, 1);
            ASSERT_EQ(t.stages, t.stream_x ? c.config.stream_stages : w4::kStages);
            continue;
          }
          if (M > 16) {
            w4::Tiling d = w4::choose_tiling(M, s.N, s.K, group, h200);
            d.variant = Variant::v4;
            d.swap32 = c.config.swap32 && M <= 32;
            ASSERT_EQ(t, d) << "a config changes only swap32 for M > 16";
            std::string why;
            ASSERT_TRUE(w4::tiling_is_valid(t, M, s.N, s.K, group, h200, &why)) << why;
            continue;
          }
          std::string why;
          ASSERT_TRUE(w4::tiling_is_valid(t, M, s.N, s.K, group, h200, &why)) << why;
          ASSERT_EQ(t.warps, c.config.warps);
          ASSERT_EQ(t.stages, c.config.stages);
          ASSERT_EQ(t.swap16, c.config.swap16 && M >= 9);
          ASSERT_FALSE(t.swap32);
          ASSERT_EQ(t.warps_n * t.warps_k, t.warps);
        }
      }
    }
  }
  // The default configuration is the library's tiling of old, shape for shape.
  for (const NK& s : shapes)
    for (int M = 1; M <= 64; ++M)
      if (cuda::gemm_w4a16_can_implement(M, s.N, s.K, 128, ScaleType::BF16, nullptr) == cudaSuccess)
        ASSERT_EQ(w4::choose_tiling(M, s.N, s.K, 128, h200, w4::V4Config{}), w4::choose_tiling(M, s.N, s.K, 128, h200));
  ASSERT_EQ(w4::v4_sweep_configs().front().config, w4::V4Config{});
}

// The measured per-shape table (gemm_w4a16_tuned.h): every entry is a compiled sweep configuration whose tiling is
// valid at every M of its bucket, buckets of one shape do not overlap, and the lookup returns it exactly there (and
// nothing for another group, another device, or M past 16).
TEST(GemmW4A16Host, TunedTableEntriesAreSweepConfigsWithValidTilings) {
  const w4::DeviceLimits h200;
  int count = 0;
  const w4::TunedV4Entry* entries = w4::tuned_v4_entries(&count);
  ASSERT_GT(count, 0);
  const std::vector<w4::NamedV4Config> sweep = w4::v4_sweep_configs();
  for (int i = 0; i < count; ++i) {
    const w4::TunedV4Entry& e = entries[i];
    SCOPED_TRACE(testing::Message() << "entry " << i << ": N " << e.N << " K " << e.K << " M " << e.m_lo << ".."
                                    << e.m_hi << " " << e.name);
    ASSERT_TRUE(w4::v4_kernel_compiled(e.warps, e.stages));
    ASSERT_GE(e.m_lo, 1);
    ASSERT_LE(e.m_lo, e.m_hi);
    ASSERT_LE(e.m_hi, w4::kV4DefaultMaxM);
    if (e.stream_x) ASSERT_TRUE(w4::wg_stream_stages_ok(e.stages));
    bool named = false;
    w4::V4Config unsplit = w4::tuned_config(e);
    EXPECT_EQ(unsplit.splits, e.splits);
    unsplit.splits = 0;  // in-step screens add K slices to a sweep configuration
    for (const w4::NamedV4Config& c : sweep) named = named || (std::string(c.name) == e.name && c.config == unsplit);
    EXPECT_TRUE(named) << "the entry's config, K slices aside, is the sweep's config of the same name";
    EXPECT_FALSE(w4::tuned_config(e) == w4::V4Config{}) << "a listed entry changes the configuration";
    for (int j = 0; j < i; ++j)
      if (entries[j].N == e.N && entries[j].K == e.K)
        EXPECT_TRUE(e.m_hi < entries[j].m_lo || e.m_lo > entries[j].m_hi) << "overlaps entry " << j;
    for (int M = e.m_lo; M <= e.m_hi; ++M) {
      ASSERT_EQ(cuda::gemm_w4a16_can_implement(M, e.N, e.K, 128, ScaleType::BF16, nullptr), cudaSuccess);
      w4::Tiling t = w4::choose_tiling(M, e.N, e.K, 128, h200, w4::tuned_config(e));
      t.variant = Variant::v4;
      std::string why;
      EXPECT_TRUE(w4::tiling_is_valid(t, M, e.N, e.K, 128, h200, &why)) << "M " << M << ": " << why;
      if (e.splits > 0) EXPECT_EQ(t.splits, e.splits) << "M " << M << ": the entry's K slices are what runs";
      EXPECT_EQ(w4::find_tuned_v4(M, e.N, e.K, 128, h200), &e) << "M " << M;
      EXPECT_EQ(w4::find_tuned_v4(M, e.N, e.K, 64, h200), nullptr) << "measured with group 128 only";
      w4::DeviceLimits other = h200;
      other.sm_count = 114;  // an H100 PCIe
      EXPECT_EQ(w4::find_tuned_v4(M, e.N, e.K, 128, other), nullptr) << "measured on 132 SMs only";
    }
  }
  EXPECT_EQ(w4::find_tuned_v4(17, 6144, 4096, 128, h200), nullptr);
  EXPECT_EQ(w4::find_tuned_v4(1, 256, 256, 128, h200), nullptr);
}

// The M = 17..32 table: streamed warpgroup tilings valid at every M of their bucket, no overlaps, found exactly there.
TEST(GemmW4A16Host, TunedWg32EntriesHaveValidStreamedTilings) {
  const w4::DeviceLimits h200;
  int count = 0;
  const w4::TunedWg32Entry* entries = w4::tuned_wg32_entries(&count);
  ASSERT_GT(count, 0);
  for (int i = 0; i < count; ++i) {
    const w4::TunedWg32Entry& e = entries[i];
    SCOPED_TRACE(testing::Message() << "entry " << i << ": N " << e.N << " K " << e.K << " M " << e.m_lo << ".."
                                    << e.m_hi);
    ASSERT_GE(e.m_lo, w4::kSwap32MinM);
    ASSERT_LE(e.m_lo, e.m_hi);
    ASSERT_LE(e.m_hi, w4::kWgMaxM);
    ASSERT_TRUE(w4::wg_stream_stages_ok(e.stream_stages));
    for (int j = 0; j < i; ++j)
      if (entries[j].N == e.N && entries[j].K == e.K)
        EXPECT_TRUE(e.m_hi < entries[j].m_lo || e.m_lo > entries[j].m_hi) << "overlaps entry " << j;
    for (int M = e.m_lo; M <= e.m_hi; ++M) {
      w4::V4Config c;
      c.wgmma = c.stream_x = true;
      c.stream_stages = e.stream_stages, c.ctas_per_sm = e.ctas_per_sm, c.splits = e.splits;
      w4::Tiling t = w4::choose_tiling(M, e.N, e.K, 128, h200, c);
      t.variant = Variant::v4;
      std::string why;
      EXPECT_TRUE(w4::tiling_is_valid(t, M, e.N, e.K, 128, h200, &why)) << "M " << M << ": " << why;
      EXPECT_TRUE(t.wgmma && t.stream_x) << "M " << M;
      EXPECT_EQ(t.stages, e.stream_stages) << "M " << M;
      if (e.splits > 0) EXPECT_EQ(t.splits, e.splits) << "M " << M;
      EXPECT_EQ(w4::find_tuned_wg32(M, e.N, e.K, 128, h200), &e) << "M " << M;
      EXPECT_EQ(w4::find_tuned_wg32(M, e.N, e.K, 64, h200), nullptr) << "measured with group 128 only";
      w4::DeviceLimits other = h200;
      other.sm_count = 114;
      EXPECT_EQ(w4::find_tuned_wg32(M, e.N, e.K, 128, other), nullptr) << "measured on 132 SMs only";
    }
    if (e.m_lo > w4::kSwap32MinM) EXPECT_EQ(w4::find_tuned_wg32(e.m_lo - 1, e.N, e.K, 128, h200), nullptr);
  }
}

// The per-shape cluster row limits: each raises the rule's kClusterMaxRows within what the cluster instances cover,
// lists its shape once, and applies only where it was measured (group 128, the table's device); other shapes keep the
// rule's limit.
TEST(GemmW4A16Host, TunedClusterRowsEntriesRaiseTheRuleWhereMeasured) {
  const w4::DeviceLimits h200;
  int count = 0;
  const w4::TunedClusterRowsEntry* entries = w4::tuned_cluster_rows_entries(&count);
  ASSERT_GT(count, 0);
  for (int i = 0; i < count; ++i) {
    const w4::TunedClusterRowsEntry& e = entries[i];
    SCOPED_TRACE(testing::Message() << "entry " << i << ": N " << e.N << " K " << e.K);
    EXPECT_GT(e.max_rows, w4::kClusterMaxRows);
    EXPECT_LE(e.max_rows, w4::kClusterLimitRows);
    for (int j = 0; j < i; ++j) EXPECT_FALSE(entries[j].N == e.N && entries[j].K == e.K) << "same shape as entry " << j;
    EXPECT_EQ(w4::tuned_cluster_max_rows(e.N, e.K, 128, h200), e.max_rows);
    EXPECT_EQ(w4::tuned_cluster_max_rows(e.N, e.K, 64, h200), w4::kClusterMaxRows) << "measured with group 128 only";
    w4::DeviceLimits other = h200;
    other.sm_count = 114;
    EXPECT_EQ(w4::tuned_cluster_max_rows(e.N, e.K, 128, other), w4::kClusterMaxRows) << "measured on 132 SMs only";
  }
  // The 70B shapes lost 9-10 % with the raised limit (docs/results.md, twenty-ninth session) and the 8B qkv GEMM's
  // epilogue never takes clusters: none of them is listed.
  for (const auto& [N, K] : {std::pair{6144, 4096}, {8192, 8192}, {57344, 8192}, {8192, 28672}, {10240, 8192}})
    EXPECT_EQ(w4::tuned_cluster_max_rows(N, K, 128, h200), w4::kClusterMaxRows) << "N " << N << " K " << K;
}

// The plain-launch entries: well-formed, on the warpgroup path's rows (M = 17..32), apply only where measured (group 128,
// the table's device), and the 70B down projection, which lost with it, is not listed.
TEST(GemmW4A16Host, TunedPlainLaunchEntriesApplyWhereMeasured) {
  const w4::DeviceLimits h200;
  int count = 0;
  const w4::TunedPlainLaunchEntry* entries = w4::tuned_plain_launch_entries(&count);
  ASSERT_GT(count, 0);
  for (int i = 0; i < count; ++i) {
    const w4::TunedPlainLaunchEntry& e = entries[i];
    SCOPED_TRACE(testing::Message() << "entry " << i << ": N " << e.N << " K " << e.K);
    EXPECT_GE(e.m_lo, 17);
    EXPECT_LE(e.m_lo, e.m_hi);
    EXPECT_LE(e.m_hi, 32);
    EXPECT_EQ(w4::find_tuned_plain_launch(e.m_lo, e.N, e.K, 128, h200), &e);
    EXPECT_EQ(w4::find_tuned_plain_launch(e.m_hi, e.N, e.K, 128, h200), &e);
    EXPECT_EQ(w4::find_tuned_plain_launch(e.m_lo - 1, e.N, e.K, 128, h200), nullptr) << "below the range";
    EXPECT_EQ(w4::find_tuned_plain_launch(e.m_lo, e.N, e.K, 64, h200), nullptr) << "measured with group 128 only";
    w4::DeviceLimits other = h200;
    other.sm_count = 114;
    EXPECT_EQ(w4::find_tuned_plain_launch(e.m_lo, e.N, e.K, 128, other), nullptr) << "measured on 132 SMs only";
  }
  for (int M : {25, 32}) EXPECT_EQ(w4::find_tuned_plain_launch(M, 8192, 28672, 128, h200), nullptr) << "M " << M;
}

// ctas_per_sm and splits do what they say where the shape allows it.
TEST(GemmW4A16Host, V4ConfigOccupancyAndSplits) {
  const w4::DeviceLimits h200;
  struct Big {
    int N, K;
  };
  for (const Big& s : {Big{6144, 4096}, Big{4096, 4096}, Big{28672, 4096}, Big{4096, 14336}, Big{10240, 8192},
                       Big{57344, 8192}}) {
    for (int M : {1, 4, 8}) {
      for (int ctas : {1, 2, 3}) {
        w4::V4Config c;
        c.ctas_per_sm = ctas;
        const w4::Tiling t = w4::choose_tiling(M, s.N, s.K, 128, h200, c);
        SCOPED_TRACE(w4::describe_tiling(t, M, s.N, s.K, 128, h200));
        const int64_t smem = w4::smem_layout(t, s.K, 128).total;
        EXPECT_GE(h200.smem_per_sm / (smem + 1024), ctas) << "ctas_per_sm = " << ctas;
        EXPECT_GE(int64_t{s.N} / (32 * t.warps_n) * t.splits, int64_t{ctas} * h200.sm_count) << ctas;
      }
    }
  }
  for (int splits : {1, 2, 5, 16}) {
    w4::V4Config c;
    c.splits = splits;
    EXPECT_EQ(w4::choose_tiling(1, 4096, 14336, 128, h200, c).splits, splits);
  }
  w4::V4Config c;
  c.splits = 64;  // K = 512 has 4 groups of 128: clamped
  EXPECT_LE(w4::choose_tiling(1, 256, 512, 128, h200, c).splits, 4);
}

// V4Config::warps_n: honoured where N / 32 and the CTA's warps allow it (every warp of the CTA on that many column
// blocks, the rest of them along K), the model's choice otherwise.
TEST(GemmW4A16Host, V4ConfigForcedWarpsN) {
  const w4::DeviceLimits h200;
  w4::V4Config c;
  c.warps = 24;
  c.stages = 8;
  c.warps_n = 1;
  w4::Tiling t = w4::choose_tiling(1, 4096, 14336, 128, h200, c);  // 8B down: 128 CTAs of 24 K warps
  EXPECT_EQ(t.warps, 24);
  EXPECT_EQ(t.warps_n, 1);
  EXPECT_EQ(t.warps_k, 24);
  EXPECT_EQ(t.splits, 1);
  t.variant = Variant::v4;
  std::string why;
  EXPECT_TRUE(w4::tiling_is_valid(t, 1, 4096, 14336, 128, h200, &why)) << why;
  for (int n : {1, 2, 4, 8}) {  // the 24-warp CTA with each warps_n it can have, on a shape where all fit
    c.warps_n = n;
    t = w4::choose_tiling(1, 28672, 4096, 128, h200, c);
    EXPECT_EQ(t.warps_n, n);
    EXPECT_EQ(t.warps_n * t.warps_k, 24);
  }
  // 16 does not divide 24, and N = 96 has three column blocks: both ignored, the model's tiling instead.
  c.warps_n = 16;
  w4::V4Config free = c;
  free.warps_n = 0;
  EXPECT_EQ(w4::choose_tiling(1, 28672, 4096, 128, h200, c), w4::choose_tiling(1, 28672, 4096, 128, h200, free));
  c.warps = 8;
  c.stages = 16;
  c.warps_n = 2;
  free = c;
  free.warps_n = 0;
  EXPECT_EQ(w4::choose_tiling(1, 96, 4096, 128, h200, c), w4::choose_tiling(1, 96, 4096, 128, h200, free));
  // The default config still gives the tilings it always gave (warps_n = 0 is the model's choice).
  EXPECT_EQ(w4::choose_tiling(1, 4096, 14336, 128, h200, w4::V4Config{}), w4::choose_tiling(1, 4096, 14336, 128, h200));
}

TEST(GemmW4A16Host, V4ConfigRejections) {
  const w4::DeviceLimits h200;
  w4::Tiling t = w4::choose_tiling(12, 4096, 4096, 128, h200);
  t.variant = Variant::v4;
  ASSERT_TRUE(w4::tiling_is_valid(t, 12, 4096, 4096, 128, h200, nullptr));
  struct Bad {
    w4::Tiling t;
    int M;
    const char* needle;
  };
  std::vector<Bad> bad(6, Bad{t, 12, ""});
  bad[0].t.stages = 64, bad[0].needle = "not a compiled kernel shape";
  bad[1].t.warps = 4, bad[1].t.warps_k = 4 / t.warps_n, bad[1].needle = "not a compiled kernel shape";
  bad[2].t.warps = 16, bad[2].t.warps_k = 16 / t.warps_n, bad[2].t.variant = Variant::v2, bad[2].needle = "need variant v4";
  bad[3].t.swap16 = true, bad[3].t.variant = Variant::v2, bad[3].needle = "swap16";
  bad[4].t = w4::choose_tiling(8, 4096, 4096, 128, h200), bad[4].t.variant = Variant::v4, bad[4].t.swap16 = true,
  bad[4].M = 8, bad[4].needle = "swap16";
  bad[5].t.warps = 16, bad[5].needle = "warps_n * warps_k must be warps = 16";  // warps_k not scaled
  for (const Bad& b : bad) {
    std::string why;
    EXPECT_FALSE(w4::tiling_is_valid(b.t, b.M, 4096, 4096, 128, h200, &why)) << b.needle;
    EXPECT_NE(why.find(b.needle), std::string::npos) << "'" << why << "' lacks '" << b.needle << "'";
  }
  // M > 16 runs the default shape only, v4 included.
  w4::Tiling big = w4::choose_tiling(17, 4096, 4096, 128, h200);
  big.variant = Variant::v4;
  big.stages = 32;
  std::string why;
  EXPECT_FALSE(w4::tiling_is_valid(big, 17, 4096, 4096, 128, h200, &why));
  EXPECT_NE(why.find("M <= 16"), std::string::npos) << why;
  big.stages = w4::kStages;
  big.swap16 = true;
  EXPECT_FALSE(w4::tiling_is_valid(big, 17, 4096, 4096, 128, h200, &why));
  EXPECT_NE(why.find("swap16"), std::string::npos) << why;
}

// swap32 outside its range or variant is refused with a sentence naming it; with swap32 on, choose_tiling gives it
// to M = 17..32 only (a launchable v4 tiling, otherwise the default one), on every shape the library serves.
TEST(GemmW4A16Host, Swap32TilingsAndRejections) {
  const w4::DeviceLimits h200;
  w4::V4Config on;
  on.swap32 = true;
  struct Bad {
    int M;
    Variant v;
    bool swap16;
    const char* needle;
  };
  for (const Bad& b : {Bad{8, Variant::v4, false, "M = 8"}, Bad{16, Variant::v4, false, "M = 16"},
                       Bad{33, Variant::v4, false, "M = 33"}, Bad{24, Variant::v2, false, "variant v2"},
                       Bad{24, Variant::v4, true, "swap16 off"}}) {
    w4::Tiling t = w4::choose_tiling(b.M, 4096, 4096, 128, h200);
    t.variant = b.v;
    t.swap32 = true;
    t.swap16 = b.swap16;
    std::string why;
    EXPECT_FALSE(w4::tiling_is_valid(t, b.M, 4096, 4096, 128, h200, &why)) << b.needle;
    EXPECT_NE(why.find("swap32"), std::string::npos) << "'" << why << "'";
    EXPECT_NE(why.find(b.needle), std::string::npos) << "'" << why << "' lacks '" << b.needle << "'";
  }
  const std::vector<NK> shapes = {{256, 256},   {768, 4096},   {4096, 4096}, {6144, 4096}, {28672, 4096},
                                  {4096, 14336}, {57344, 8192}, {960, 576},   {576, 1152}};
  for (const NK& s : shapes) {
    for (int group : {32, 64, 128}) {
      for (int M = 1; M <= 64; ++M) {
        if (cuda::gemm_w4a16_can_implement(M, s.N, s.K, group, ScaleType::BF16, nullptr) != cudaSuccess) continue;
        w4::Tiling t = w4::choose_tiling(M, s.N, s.K, group, h200, on);
        SCOPED_TRACE(w4::describe_tiling(t, M, s.N, s.K, group, h200));
        const bool s32 = M >= 17 && M <= 32;
        ASSERT_EQ(t.swap32, s32);
        t.variant = w4::choose_variant(M, true);
        ASSERT_EQ(t.variant, M <= 32 ? Variant::v4 : Variant::v2);
        std::string why;
        ASSERT_TRUE(w4::tiling_is_valid(t, M, s.N, s.K, group, h200, &why)) << why;
        if (s32) {
          ASSERT_NE(w4::describe_tiling(t, M, s.N, s.K, group, h200).find(M <= 24 ? "swap32x3" : "swap32x4"),
                    std::string::npos);
          ASSERT_EQ(w4::swap_tiles(t.rows8, t.swap16, t.swap32, t.rows), M <= 24 ? 3 : 4);
        }
      }
    }
  }
}

// parse_v4_config on a fake environment.
std::vector<std::pair<std::string, std::string>> g_fake_env;
const char* fake_getenv(const char* name) {
  for (const auto& [k, v] : g_fake_env)
    if (k == name) return v.c_str();
  return nullptr;
}

TEST(GemmW4A16Host, TunedExtraEntriesFromEnvironment) {
  std::string warnings;
  EXPECT_TRUE(w4::parse_tuned_extra(nullptr, &warnings).empty());
  EXPECT_TRUE(w4::parse_tuned_extra("", &warnings).empty());
  EXPECT_TRUE(warnings.empty()) << warnings;

  const std::vector<w4::ExtraTunedEntry> e =
      w4::parse_tuned_extra("4096:4096:1:2:16:16:0:1:0,6144:4096:6:8:8:16:2:0:3", &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings;
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].N, 4096);
  EXPECT_EQ(e[0].K, 4096);
  EXPECT_EQ(e[0].m_lo, 1);
  EXPECT_EQ(e[0].m_hi, 2);
  EXPECT_EQ(e[0].config.warps, 16);
  EXPECT_EQ(e[0].config.stages, 16);
  EXPECT_EQ(e[0].config.warps_n, 1);
  EXPECT_EQ(e[0].config.splits, 0);
  EXPECT_EQ(e[1].N, 6144);
  EXPECT_EQ(e[1].m_lo, 6);
  EXPECT_EQ(e[1].m_hi, 8);
  EXPECT_EQ(e[1].config.ctas_per_sm, 2);
  EXPECT_EQ(e[1].config.splits, 3);
  w4::V4Config rest = e[1].config;  // everything the entry does not name stays at its default
  rest.warps = w4::kWarps, rest.stages = w4::kStages, rest.ctas_per_sm = 0, rest.splits = 0;
  EXPECT_EQ(rest, w4::V4Config{});

  // A tenth field, the path: 1 is the warpgroup path with streamed activations (the table's wgmma_sx), 0 is v4.
  const std::vector<w4::ExtraTunedEntry> p =
      w4::parse_tuned_extra("28672:4096:9:16:8:16:0:0:2:1,4096:4096:9:16:16:16:0:1:0:0", &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings;
  ASSERT_EQ(p.size(), 2u);
  EXPECT_TRUE(p[0].config.wgmma);
  EXPECT_TRUE(p[0].config.stream_x);
  EXPECT_EQ(p[0].config.stream_stages, 16);
  EXPECT_EQ(p[0].config.splits, 2);
  EXPECT_FALSE(p[1].config.wgmma);
  EXPECT_FALSE(p[1].config.stream_x);
  EXPECT_EQ(p[1].config.warps, 16);

  // Malformed, an empty M range, an uncompiled (warps, stages), out-of-range counts, N = 0: each skipped with a
  // sentence; the good one stays.
  warnings.clear();
  const std::vector<w4::ExtraTunedEntry> f =
      w4::parse_tuned_extra("4096:4096:1:2:16:16:0:1,4096:4096:3:2:8:16:0:0:0,4096:4096:1:2:12:16:0:0:0,"
                            "4096:4096:1:2:16:16:0:1:0x,8192:8192:1:1:24:8:0:0:0,4096:4096:1:2:8:16:-1:0:0,"
                            "4096:4096:1:2:8:16:0:0:65,0:4096:1:2:8:16:0:0:0,4096:4096:1:2:8:8:0:0:0:2,"
                            "4096:4096:1:2:16:16:0:0:0:1,4096:4096:1:2:8:8:0:0:0:1x,4096:4096:1:2:8:8:0:0:0:",
                            &warnings);
  ASSERT_EQ(f.size(), 1u) << warnings;
  EXPECT_EQ(f[0].N, 8192);
  EXPECT_EQ(f[0].config.warps, 24);
  for (const char* needle : {"'4096:4096:1:2:16:16:0:1' is not", "'4096:4096:3:2:8:16:0:0:0' has m_lo",
                             "'4096:4096:1:2:12:16:0:0:0' names a (warps, stages) pair",
                             "'4096:4096:1:2:16:16:0:1:0x' is not", "'4096:4096:1:2:8:16:-1:0:0' has ctas_per_sm",
                             "'4096:4096:1:2:8:16:0:0:65' has ctas_per_sm", "'0:4096:1:2:8:16:0:0:0' has N or K",
                             "'4096:4096:1:2:8:8:0:0:0:2' has a path", "'4096:4096:1:2:16:16:0:0:0:1' names the warpgroup",
                             "'4096:4096:1:2:8:8:0:0:0:1x' is not", "'4096:4096:1:2:8:8:0:0:0:' is not"})
    EXPECT_NE(warnings.find(needle), std::string::npos) << "'" << warnings << "' lacks '" << needle << "'";
}

// FT_W4A16_CLUSTER_ROWS_EXTRA: per-shape row limits of the cluster rule, in order; a malformed or out-of-range entry is
// skipped with a sentence naming it, and the others still count.
TEST(GemmW4A16Host, ClusterRowsExtraEntriesFromEnvironment) {
  std::string warnings;
  EXPECT_TRUE(w4::parse_cluster_rows_extra(nullptr, &warnings).empty());
  EXPECT_TRUE(w4::parse_cluster_rows_extra("", &warnings).empty());
  EXPECT_TRUE(warnings.empty()) << warnings;

  const std::string lowest = std::to_string(w4::kClusterMinRows - 1), highest = std::to_string(w4::kClusterLimitRows);
  const std::vector<w4::ClusterRowsEntry> e =
      w4::parse_cluster_rows_extra(("57344:8192:24,4096:4096:" + lowest + ",8192:28672:" + highest).c_str(), &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings;
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].N, 57344);
  EXPECT_EQ(e[0].K, 8192);
  EXPECT_EQ(e[0].max_rows, 24);
  EXPECT_EQ(e[1].max_rows, w4::kClusterMinRows - 1);
  EXPECT_EQ(e[2].N, 8192);
  EXPECT_EQ(e[2].K, 28672);
  EXPECT_EQ(e[2].max_rows, w4::kClusterLimitRows);

  const std::string too_low = std::to_string(w4::kClusterMinRows - 2);
  const std::string too_high = std::to_string(w4::kClusterLimitRows + 1);
  for (const std::string& bad : {std::string("4096:4096"), std::string("4096:4096:24:1"), std::string("4096:x:24"),
                                 std::string("0:4096:24"), "4096:4096:" + too_low, "4096:4096:" + too_high}) {
    SCOPED_TRACE(bad);
    warnings.clear();
    const std::vector<w4::ClusterRowsEntry> r =
        w4::parse_cluster_rows_extra((bad + ",28672:4096:20").c_str(), &warnings);
    ASSERT_EQ(r.size(), 1u) << "the good entry after the bad one still counts";
    EXPECT_EQ(r[0].N, 28672);
    EXPECT_EQ(r[0].max_rows, 20);
    EXPECT_NE(warnings.find("FT_W4A16_CLUSTER_ROWS_EXTRA: '" + bad + "'"), std::string::npos) << warnings;
  }
}

// FT_W4A16_PLAIN_LAUNCH: shape and row ranges launched without programmatic serialisation, in order; a malformed entry is
// skipped with a sentence naming it, and the others still count.
TEST(GemmW4A16Host, PlainLaunchEntriesFromEnvironment) {
  std::string warnings;
  EXPECT_TRUE(w4::parse_plain_launch(nullptr, &warnings).empty());
  EXPECT_TRUE(w4::parse_plain_launch("", &warnings).empty());
  EXPECT_TRUE(warnings.empty()) << warnings;

  const std::vector<w4::ShapeRange> e = w4::parse_plain_launch("4096:14336:25:32,,8192:28672:7:7", &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings;
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].N, 4096);
  EXPECT_EQ(e[0].K, 14336);
  EXPECT_EQ(e[0].m_lo, 25);
  EXPECT_EQ(e[0].m_hi, 32);
  EXPECT_EQ(e[1].N, 8192);
  EXPECT_EQ(e[1].K, 28672);
  EXPECT_EQ(e[1].m_lo, 7);
  EXPECT_EQ(e[1].m_hi, 7);

  for (const std::string bad : {"4096:14336:25", "4096:14336:25:32:1", "4096:x:1:2", "0:4096:1:2", "4096:4096:0:2",
                                "4096:4096:9:8"}) {
    SCOPED_TRACE(bad);
    warnings.clear();
    const std::vector<w4::ShapeRange> r = w4::parse_plain_launch((bad + ",28672:4096:17:24").c_str(), &warnings);
    ASSERT_EQ(r.size(), 1u) << "the good entry after the bad one still counts";
    EXPECT_EQ(r[0].N, 28672);
    EXPECT_EQ(r[0].m_lo, 17);
    EXPECT_EQ(r[0].m_hi, 24);
    EXPECT_NE(warnings.find("FT_W4A16_PLAIN_LAUNCH: '" + bad + "'"), std::string::npos) << warnings;
  }
}

TEST(GemmW4A16Host, V4ConfigFromEnvironment) {
  std::string warnings;
  g_fake_env = {};
  EXPECT_EQ(w4::parse_v4_config(fake_getenv, &warnings), w4::V4Config{});
  EXPECT_TRUE(warnings.empty()) << warnings;

  g_fake_env = {{"FT_W4A16_V4_WARPS", "16"}, {"FT_W4A16_V4_CTAS_PER_SM", "1"}, {"FT_W4A16_SPLITK", "4"},
                {"FT_W4A16_SWAP16", "1"}};
  w4::V4Config c = w4::parse_v4_config(fake_getenv, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings;
  EXPECT_EQ(c.warps, 16);
  EXPECT_EQ(c.stages, w4::kStages);
  EXPECT_EQ(c.ctas_per_sm, 1);
  EXPECT_EQ(c.splits, 4);
  EXPECT_TRUE(c.swap16);

  g_fake_env = {{"FT_W4A16_V4_STAGES", "32"}};
  c = w4::parse_v4_config(fake_getenv, &warnings);
  EXPECT_EQ(c.stages, 32);
  EXPECT_EQ(c.warps, w4::kWarps);
  EXPECT_EQ(c.swap32, w4::kSwap32ByDefault);

  for (bool on : {false, true}) {
    g_fake_env = {{"FT_W4A16_SWAP32", on ? "1" : "0"}};
    c = w4::parse_v4_config(fake_getenv, &warnings);
    EXPECT_TRUE(warnings.empty()) << warnings;
    EXPECT_EQ(c.swap32, on);
    w4::V4Config want;
    want.swap32 = on;
    EXPECT_EQ(c, want);
  }

  // The streamed warpgroup ring: 8 or 16 slots; its tiling carries the ring as its stages, at M = 17..32 too.
  g_fake_env = {{"FT_W4A16_WGMMA", "1"}, {"FT_W4A16_STREAM_X", "1"}, {"FT_W4A16_STREAM_STAGES", "16"}};
  c = w4::parse_v4_config(fake_getenv, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings;
  EXPECT_EQ(c.stream_stages, w4::kWgStreamDeepStages);
  for (int M : {1, 16, 17, 32}) {
    const w4::DeviceLimits h200;
    w4::Tiling t = w4::choose_tiling(M, 28672, 4096, 128, h200, c);
    t.variant = Variant::v4;
    SCOPED_TRACE(w4::describe_tiling(t, M, 28672, 4096, 128, h200));
    EXPECT_TRUE(t.wgmma && t.stream_x);
    EXPECT_EQ(t.stages, w4::kWgStreamDeepStages);
    std::string why;
    EXPECT_TRUE(w4::tiling_is_valid(t, M, 28672, 4096, 128, h200, &why)) << why;
    // The 16-slot ring needs more shared memory than the 8-slot one: 8 more weight slots, 4 more panels.
    w4::Tiling t8 = t;
    t8.stages = w4::kWgStreamStages;
    EXPECT_EQ(w4::smem_layout(t, 4096, 128).total - w4::smem_layout(t8, 4096, 128).total,
              int64_t{8} * w4::kWarps * w4::kWarpSize * 16 + 4 * w4::wg_stream_panel_bytes(M));
    t.stages = 32;  // a compiled v4 ring, but not a streamed one
    EXPECT_FALSE(w4::tiling_is_valid(t, M, 28672, 4096, 128, h200, &why));
    EXPECT_NE(why.find("stream_x"), std::string::npos) << why;
  }
  for (const char* bad : {"12", "32"}) {
    warnings.clear();
    g_fake_env = {{"FT_W4A16_STREAM_STAGES", bad}};
    c = w4::parse_v4_config(fake_getenv, &warnings);
    EXPECT_EQ(c, w4::V4Config{});
    EXPECT_NE(warnings.find(std::string("FT_W4A16_STREAM_STAGES=") + bad), std::string::npos) << warnings;
  }
  warnings.clear();

  g_fake_env = {{"FT_W4A16_V4_WARPS", "24"}, {"FT_W4A16_V4_STAGES", "8"}, {"FT_W4A16_V4_WARPS_N", "1"}};
  c = w4::parse_v4_config(fake_getenv, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings;
  EXPECT_EQ(c.warps, 24);
  EXPECT_EQ(c.stages, 8);
  EXPECT_EQ(c.warps_n, 1);

  // Not compiled, out of range, not a number: each ignored with a sentence naming the variable.
  g_fake_env = {{"FT_W4A16_V4_WARPS", "12"}, {"FT_W4A16_SPLITK", "65"}, {"FT_W4A16_V4_CTAS_PER_SM", "two"},
                {"FT_W4A16_SWAP16", "yes"}, {"FT_W4A16_SWAP32", "2"}, {"FT_W4A16_V4_WARPS_N", "17"}};
  c = w4::parse_v4_config(fake_getenv, &warnings);
  EXPECT_EQ(c, w4::V4Config{});
  for (const char* needle : {"FT_W4A16_V4_WARPS", "FT_W4A16_SPLITK=65", "FT_W4A16_V4_CTAS_PER_SM=two",
                             "FT_W4A16_SWAP16=yes", "FT_W4A16_SWAP32=2", "FT_W4A16_V4_WARPS_N=17"})
    EXPECT_NE(warnings.find(needle), std::string::npos) << "'" << warnings << "' lacks '" << needle << "'";
  g_fake_env = {};
}

}  // namespace
