// GPU tests of the W4A16 GEMM's fused epilogues (gemm_w4a16_residual, gemm_w4a16_swiglu and the internal
// gemm_w4a16_epilogue_with_tiling) against the unfused chain they replace, run on the device on the same inputs:
// gemm_w4a16 (BF16 y) followed by add_residual_bf16 or swiglu_bf16. The fused epilogues accumulate exactly as the
// plain GEMM and round at the same points, so the comparison is bit for bit (no tolerance). Every tiling path is
// reached: v4 swapped (M <= 8), v4 swapped two-tile (swap16), three/four-tile (swap32, M = 17..32), v4 and v2 16-row
// tiles (one to four), each with one K
// slice (epilogue in the GEMM kernel) and with split-K (epilogue in the reduce kernel). Outputs and the split-K
// workspace are NaN-poisoned before each launch. Split-K finished inside clusters is checked against the reduce kernel
// (ClusterSplitKEqualsReduceKernel). gemm_w4a16_residual_rmsnorm (the residual epilogue, then the RMSNorm of its
// rows; with a split K one fused reduce + norm kernel) against gemm_w4a16_residual + rmsnorm_bf16, bit for bit.
// The plain GEMM itself is checked against the CPU twin in
// test_gemm_w4a16.cpp; here the residual chain is also checked against the host's fp32 add of its BF16 y.
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

#include "cuda/gemm_w4a16_heuristics.h"
#include "cuda/gemm_w4a16_internal.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "gpu_test_util.h"
#include "w4a16_cases.h"
#include "w4a16_wg_tilings.h"

namespace {

using namespace futransformer;
using formats::Int4MmaRows;
using formats::Int4Weight;
using formats::ScaleType;
using test::DeviceBuffer;
using test::w4a16::random_weight;
using test::w4a16::random_x;
namespace w4 = futransformer::cuda::w4a16;

const std::vector<int> kMs = {1, 3, 8, 9, 16, 17, 24, 25, 31, 32, 64};
constexpr int kSplitK = 3;  // K slices of the split-K runs (the shapes below have at least 4 groups)

struct Packed {
  DeviceBuffer<uint32_t> words;
  DeviceBuffer<uint16_t> scales;
  Packed(const Int4Weight& w, Int4MmaRows rows)
      : words(formats::repack_int4_for_mma(w, rows)), scales(formats::repack_int4_scales_for_mma(w, rows)) {}
};

const char* variant_name(w4::Variant v) { return v == w4::Variant::v4 ? "v4" : "v2"; }

std::string describe(const w4::Tiling& t) {
  return std::string(variant_name(t.variant)) + (t.rows8 ? " rows8" : "") + (t.swap16 ? " swap16" : "") +
         (t.swap32 ? " swap32" : "") +
         " m_tiles " + std::to_string(t.m_tiles) + " warps_n " + std::to_string(t.warps_n) + " warps_k " +
         std::to_string(t.warps_k) + " splits " + std::to_string(t.splits);
}

// The tilings one M runs: v4 and v2 on the default tiling, for M = 9..16 the swapped two-tile path and for
// M = 17..32 the swapped three/four-tile path, each with one K slice and with kSplitK. Every one must be launchable
// on an H200 (the shapes are chosen so).
std::vector<w4::Tiling> tilings_for(int M, int N, int K, int group, ScaleType st) {
  std::vector<w4::Tiling> bases;
  w4::Tiling t;
  EXPECT_EQ(cuda::gemm_w4a16_plan_config(M, N, K, group, st, w4::V4Config{}, &t), cudaSuccess);
  for (w4::Variant v : {w4::Variant::v4, w4::Variant::v2}) {
    t.variant = v;
    if (v == w4::Variant::v2) t.swap32 = false;  // a v4-only path (kSwap32ByDefault)
    bases.push_back(t);
  }
  if (M >= w4::kSwap32MinM && M <= w4::kSwap32MaxM) {
    w4::V4Config c;
    c.swap32 = !w4::kSwap32ByDefault;  // the path the default tiling above does not run
    EXPECT_EQ(cuda::gemm_w4a16_plan_config(M, N, K, group, st, c, &t), cudaSuccess);
    EXPECT_EQ(t.swap32, c.swap32);
    bases.push_back(t);
  }
  if (M >= 9 && M <= 16) {
    w4::V4Config c;
    c.swap16 = true;
    EXPECT_EQ(cuda::gemm_w4a16_plan_config(M, N, K, group, st, c, &t), cudaSuccess);
    EXPECT_TRUE(t.swap16);
    bases.push_back(t);
  }
  // The warpgroup path (M <= 32, N a multiple of 128), staged and streamed (N a multiple of 256), where the shape
  // allows it: its accumulators go through the same stores.
  for (const w4::Tiling& wg : test::wg_planned_tilings(M, N, K, group, st)) bases.push_back(wg);
  std::vector<w4::Tiling> out;
  for (w4::Tiling b : bases) {
    for (int splits : {1, kSplitK}) {
      b.splits = splits;
      std::string why;
      EXPECT_TRUE(w4::tiling_is_valid(b, M, N, K, group, w4::DeviceLimits{}, &why)) << describe(b) << ": " << why;
      out.push_back(b);
    }
  }
  return out;
}

size_t workspace_for(const w4::Tiling* t, int M, int N, int K) {
  size_t bytes = cuda::gemm_w4a16_workspace_bytes(M, N, K);
  if (t) bytes = std::max<size_t>(bytes, static_cast<size_t>(w4::workspace_bytes_for(*t, M, N)));
  return bytes;
}

const __nv_bfloat16* bf(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
__nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// Plain GEMM into a poisoned BF16 y (the library's tiling when t is null).
void plain_gemm(const w4::Tiling* t, const Packed& p, const Int4Weight& w, const DeviceBuffer<uint16_t>& x, int M,
                DeviceBuffer<uint16_t>& y) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), group = static_cast<int>(w.group);
  const size_t ws_bytes = workspace_for(t, M, N, K);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  ASSERT_EQ(ws.poison(), cudaSuccess);
  ASSERT_EQ(y.poison(), cudaSuccess);
  const cudaError_t e =
      t ? cuda::gemm_w4a16_with_tiling(*t, bf(x.p), p.words.p, p.scales.p, bf(y.p), M, N, K, group,
                                       w.spec.scale_type, ws.p, ws_bytes, nullptr)
        : cuda::gemm_w4a16(bf(x.p), p.words.p, p.scales.p, bf(y.p), M, N, K, group, w.spec.scale_type, ws.p,
                           ws_bytes, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Fused GEMM + epilogue into `out` (the library's tiling and public launcher when t is null).
void fused_gemm(const w4::Tiling* t, w4::Epilogue ep, const Packed& p, const Int4Weight& w,
                const DeviceBuffer<uint16_t>& x, int M, void* out) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), group = static_cast<int>(w.group);
  const size_t ws_bytes = workspace_for(t, M, N, K);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  ASSERT_EQ(ws.poison(), cudaSuccess);
  const ScaleType st = w.spec.scale_type;
  cudaError_t e;
  if (t) {
    e = cuda::gemm_w4a16_epilogue_with_tiling(*t, ep, bf(x.p), p.words.p, p.scales.p, out, M, N, K, group, st, ws.p,
                                              ws_bytes, nullptr);
  } else if (ep == w4::Epilogue::residual_f32) {
    e = cuda::gemm_w4a16_residual(bf(x.p), p.words.p, p.scales.p, static_cast<float*>(out), M, N, K, group, st, ws.p,
                                  ws_bytes, nullptr);
  } else {
    e = cuda::gemm_w4a16_swiglu(bf(x.p), p.words.p, p.scales.p, static_cast<__nv_bfloat16*>(out), M, N, K, group, st,
                                ws.p, ws_bytes, nullptr);
  }
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::vector<float> random_residual(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> r(n);
  for (float& v : r) v = dist(rng);
  return r;
}

uint32_t f32_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// residual_f32 on tiling t (or the public launcher): fused == gemm then add_residual_bf16, bit for bit, and both ==
// the host's fp32 add of the plain GEMM's BF16 output.
void check_residual(const w4::Tiling* t, const Packed& p, const Int4Weight& w, int M, uint32_t seed) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols);
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << w.group << " scales "
                                  << (w.spec.scale_type == ScaleType::F16 ? "fp16" : "bf16") << " tiling "
                                  << (t ? describe(*t) : std::string("library")));
  const DeviceBuffer<uint16_t> x(random_x(M, K, seed));
  const std::vector<float> r0 = random_residual(static_cast<size_t>(M) * N, seed + 1);

  DeviceBuffer<uint16_t> y(static_cast<size_t>(M) * N);
  plain_gemm(t, p, w, x, M, y);
  DeviceBuffer<float> unfused(r0);
  ASSERT_EQ(cuda::add_residual_bf16(unfused.p, bf(y.p), M, N, nullptr), cudaSuccess);
  DeviceBuffer<float> fused(r0);
  fused_gemm(t, w4::Epilogue::residual_f32, p, w, x, M, fused.p);

  const std::vector<uint16_t> yh = y.download();
  const std::vector<float> a = unfused.download(), b = fused.download();
  for (size_t i = 0; i < a.size(); ++i) {
    const float want = r0[i] + bf16_to_f32(yh[i]);  // one IEEE fp32 rounding on the host
    ASSERT_FALSE(std::isnan(b[i])) << "element " << i << " (row " << i / N << ", col " << i % N << ")";
    ASSERT_EQ(f32_bits(a[i]), f32_bits(want))
        << "unfused chain, element " << i << ": " << a[i] << " vs host " << want;
    ASSERT_EQ(f32_bits(b[i]), f32_bits(a[i]))
        << "fused residual, row " << i / N << " col " << i % N << ": " << b[i] << " vs unfused " << a[i];
  }
}

// swiglu_bf16 on tiling t (or the public launcher): fused on the interleaved packing == gemm on the canonical packing
// then swiglu_bf16, bit for bit. Also: the plain GEMM on the interleaved packing gives, column for column, the plain
// GEMM's output on the canonical one (what makes the first comparison exact; a failure here says the accumulation
// depends on a column's position).
void check_swiglu(const w4::Tiling* t, const Packed& canon, const Packed& inter_p, const Int4Weight& w, int M,
                  uint32_t seed) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), inter = N / 2;
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << w.group << " scales "
                                  << (w.spec.scale_type == ScaleType::F16 ? "fp16" : "bf16") << " tiling "
                                  << (t ? describe(*t) : std::string("library")));
  const DeviceBuffer<uint16_t> x(random_x(M, K, seed));

  DeviceBuffer<uint16_t> y(static_cast<size_t>(M) * N);
  plain_gemm(t, canon, w, x, M, y);
  DeviceBuffer<uint16_t> unfused(static_cast<size_t>(M) * inter);
  ASSERT_EQ(unfused.poison(), cudaSuccess);
  ASSERT_EQ(cuda::swiglu_bf16(bf(y.p), bf(unfused.p), M, inter, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  DeviceBuffer<uint16_t> fused(static_cast<size_t>(M) * inter);
  ASSERT_EQ(fused.poison(), cudaSuccess);
  fused_gemm(t, w4::Epilogue::swiglu_bf16, inter_p, w, x, M, fused.p);

  const std::vector<uint16_t> yc = y.download(), a = unfused.download(), b = fused.download();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(bf16_to_f32(a[i]))) << "unfused SwiGLU element " << i << " not written";
    ASSERT_EQ(b[i], a[i]) << "fused SwiGLU, row " << i / inter << " col " << i % inter << ": " << bf16_to_f32(b[i])
                          << " vs unfused " << bf16_to_f32(a[i]);
  }
  if (t) {
    DeviceBuffer<uint16_t> yi(static_cast<size_t>(M) * N);
    plain_gemm(t, inter_p, w, x, M, yi);
    const std::vector<uint16_t> yih = yi.download();
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n)
        ASSERT_EQ(yih[static_cast<size_t>(m) * N + n],
                  yc[static_cast<size_t>(m) * N + static_cast<size_t>(w4::swiglu_source_row(n, inter))])
            << "plain GEMM on the interleaved packing, row " << m << " packed column " << n;
  }
}

struct NK {
  int N, K;
};

TEST(GemmW4A16EpilogueGpu, ResidualMatchesGemmThenAddResidual) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 100;
  for (const NK& s : {NK{1024, 1024}, NK{576, 512}}) {
    for (int group : {128, 64}) {
      for (ScaleType st : {ScaleType::BF16, ScaleType::F16}) {
        const Int4Weight w = random_weight(s.N, s.K, group, st, ++seed);
        const Packed p(w, Int4MmaRows::canonical);
        for (int M : kMs) {
          for (const w4::Tiling& t : tilings_for(M, s.N, s.K, group, st)) check_residual(&t, p, w, M, ++seed);
          check_residual(nullptr, p, w, M, ++seed);
        }
      }
    }
  }
}

TEST(GemmW4A16EpilogueGpu, SwiGluMatchesGemmThenSwiGlu) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 200;
  for (const NK& s : {NK{1024, 1024}, NK{96, 512}}) {  // inter 512 and 48 (three 16-column runs)
    for (int group : {128, 64}) {
      for (ScaleType st : {ScaleType::BF16, ScaleType::F16}) {
        const Int4Weight w = random_weight(s.N, s.K, group, st, ++seed);
        const Packed canon(w, Int4MmaRows::canonical), inter_p(w, Int4MmaRows::swiglu_interleaved);
        for (int M : kMs) {
          for (const w4::Tiling& t : tilings_for(M, s.N, s.K, group, st))
            check_swiglu(&t, canon, inter_p, w, M, ++seed);
          check_swiglu(nullptr, canon, inter_p, w, M, ++seed);
        }
      }
    }
  }
}

// An 8B-sized decode shape at M = 1 (the library's tiling, whatever split it picks): gate|up 4096 -> 2 x 14336 and
// down 14336 -> 4096 as the engine runs them.
TEST(GemmW4A16EpilogueGpu, LlamaDecodeShapes) {
  FT_REQUIRE_CUDA_DEVICE();
  const Int4Weight gu = random_weight(2 * 14336, 4096, 128, ScaleType::F16, 301);
  const Packed canon(gu, Int4MmaRows::canonical), inter_p(gu, Int4MmaRows::swiglu_interleaved);
  const Int4Weight down = random_weight(4096, 14336, 128, ScaleType::F16, 302);
  const Packed dp(down, Int4MmaRows::canonical);
  for (int M : {1, 4, 16}) {
    check_swiglu(nullptr, canon, inter_p, gu, M, 310 + M);
    check_residual(nullptr, dp, down, M, 330 + M);
  }
}

// One launch on tiling t with epilogue ep (store_bf16: the plain GEMM) into a poisoned `out` (residual_f32: r0 first)
// and a poisoned workspace; returns the output's bytes and sets *ws_untouched to whether every workspace byte is
// still the poison.
std::vector<unsigned char> run_on_tiling(const w4::Tiling& t, w4::Epilogue ep, const Packed& p, const Int4Weight& w,
                                         const DeviceBuffer<uint16_t>& x, int M, const std::vector<float>& r0,
                                         bool* ws_untouched) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), group = static_cast<int>(w.group);
  const size_t ws_bytes = workspace_for(&t, M, N, K);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  EXPECT_EQ(ws.poison(), cudaSuccess);
  const size_t out_bytes = ep == w4::Epilogue::residual_f32 ? static_cast<size_t>(M) * N * 4
                           : ep == w4::Epilogue::swiglu_bf16 ? static_cast<size_t>(M) * N
                                                              : static_cast<size_t>(M) * N * 2;
  DeviceBuffer<unsigned char> out(out_bytes);
  if (ep == w4::Epilogue::residual_f32) {
    EXPECT_EQ(cudaMemcpy(out.p, r0.data(), out_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    EXPECT_EQ(out.poison(), cudaSuccess);
  }
  const cudaError_t e =
      ep == w4::Epilogue::store_bf16
          ? cuda::gemm_w4a16_with_tiling(t, bf(x.p), p.words.p, p.scales.p, reinterpret_cast<__nv_bfloat16*>(out.p),
                                         M, N, K, group, w.spec.scale_type, ws.p, ws_bytes, nullptr)
          : cuda::gemm_w4a16_epilogue_with_tiling(t, ep, bf(x.p), p.words.p, p.scales.p, out.p, M, N, K, group,
                                                  w.spec.scale_type, ws.p, ws_bytes, nullptr);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<unsigned char> wsh = ws.download();
  *ws_untouched = std::all_of(wsh.begin(), wsh.end(), [](unsigned char b) { return b == 0xFF; });
  return out.download();
}

// Split-K finished inside thread-block clusters (gemm_w4a16_cluster.cuh) against the reduce kernel it replaces, on the
// same tilings: for each M and each slice count, every path tilings_for reaches, the three epilogues, clusters off then
// on under the rule's limits (max_rows, max_splits): the same output bytes. The reduce-kernel path writes the fp32
// workspace; the cluster path leaves it untouched (still poisoned), which shows it ran. Up to kMaxClusterSplits slices
// the cluster path must run exactly where w4a16::cluster_reduce_applies; a larger (non-portable) cluster may be
// refused by the device (cudaOccupancyMaxActiveClusters), and then the reduce kernel runs: only the bytes are checked.
void check_cluster_against_reduce(int N, int K, ScaleType st, uint32_t seed, const std::vector<int>& Ms,
                                  const std::vector<int>& slice_counts, int max_rows, int max_splits) {
  struct Restore {
    ~Restore() {
      cuda::set_gemm_w4a16_cluster_reduce(-1);
      cuda::set_gemm_w4a16_cluster_limits(0, 0);
    }
  } restore;
  cuda::set_gemm_w4a16_cluster_limits(max_rows, max_splits);
  const int group = 128;
  const Int4Weight w = random_weight(N, K, group, st, ++seed);
  const Packed canon(w, Int4MmaRows::canonical), inter_p(w, Int4MmaRows::swiglu_interleaved);
  for (int M : Ms) {
    const DeviceBuffer<uint16_t> x(random_x(M, K, ++seed));
    const std::vector<float> r0 = random_residual(static_cast<size_t>(M) * N, ++seed);
    std::vector<w4::Tiling> bases;
    for (const w4::Tiling& t : tilings_for(M, N, K, group, st))
      if (t.splits == 1) bases.push_back(t);
    for (w4::Tiling t : bases) {
      for (int splits : slice_counts) {
        t.splits = splits;
        if (!w4::tiling_is_valid(t, M, N, K, group, w4::DeviceLimits{}, nullptr)) continue;
        const bool applies = w4::cluster_reduce_applies(t, M, K, group, max_rows, max_splits);
        for (w4::Epilogue ep : {w4::Epilogue::store_bf16, w4::Epilogue::residual_f32, w4::Epilogue::swiglu_bf16}) {
          SCOPED_TRACE(testing::Message() << "M " << M << " scales " << (st == ScaleType::F16 ? "fp16" : "bf16")
                                          << " epilogue " << static_cast<int>(ep) << " tiling " << describe(t));
          const Packed& p = ep == w4::Epilogue::swiglu_bf16 ? inter_p : canon;
          bool ws_untouched = false;
          cuda::set_gemm_w4a16_cluster_reduce(0);
          const std::vector<unsigned char> want = run_on_tiling(t, ep, p, w, x, M, r0, &ws_untouched);
          EXPECT_FALSE(ws_untouched) << "the reduce-kernel path should write its partial sums";
          cuda::set_gemm_w4a16_cluster_reduce(1);
          const std::vector<unsigned char> got = run_on_tiling(t, ep, p, w, x, M, r0, &ws_untouched);
          if (splits <= w4::kMaxClusterSplits) {
            EXPECT_EQ(ws_untouched, applies) << "the cluster path (and only it) leaves the workspace untouched";
          } else if (applies && !ws_untouched) {
            std::printf("note: the device refused a cluster of %d for %s; the reduce kernel ran\n", splits,
                        describe(t).c_str());
          }
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i << " of the output";
        }
      }
    }
  }
}

// The rule as measured: 2, 3 and 8 slices at M = 9..16 on v4 swap16 and 16-row, v2 and the warpgroup path, both scale
// types; at M = 8 and 17 the reduce kernel stays.
TEST(GemmW4A16EpilogueGpu, ClusterSplitKEqualsReduceKernel) {
  FT_REQUIRE_CUDA_DEVICE();
  for (ScaleType st : {ScaleType::F16, ScaleType::BF16})
    check_cluster_against_reduce(1024, 1024, st, st == ScaleType::F16 ? 700 : 750, {8, 9, 12, 16, 17}, {2, 3, 8},
                                 w4::kClusterMaxRows, w4::kMaxClusterSplits);
}

// The limits raised as a measurement would raise them (FT_W4A16_CLUSTER_MAX_ROWS=32, FT_W4A16_CLUSTER_MAX_SPLITS=16):
// the M = 17..32 instances (v4 16-row with two tiles, swap32, v2, the warpgroup path with three and four tiles) and
// clusters of 16 slices (K = 2048: 16 groups).
TEST(GemmW4A16EpilogueGpu, ClusterSplitKRaisedLimitsEqualsReduceKernel) {
  FT_REQUIRE_CUDA_DEVICE();
  check_cluster_against_reduce(1024, 2048, ScaleType::F16, 800, {9, 16, 17, 24, 32}, {2, 8, 16},
                               w4::kClusterLimitRows, w4::kClusterLimitSplits);
}

// The checks of the output pointer run before anything touches the device: a rejected call names the parameter.
// gemm_w4a16_residual_rmsnorm on tiling t (or the public launcher): residual and y equal gemm_w4a16_residual (same
// tiling) followed by rmsnorm_bf16, bit for bit — with a split K the fused reduce + norm kernel, otherwise the GEMM and
// the norm kernel. y and the workspace poisoned first.
void check_residual_rmsnorm(const w4::Tiling* t, const Packed& p, const Int4Weight& w, int M, uint32_t seed) {
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols), group = static_cast<int>(w.group);
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << w.group << " tiling "
                                  << (t ? describe(*t) : std::string("library")));
  constexpr float kEps = 1e-5f;
  const DeviceBuffer<uint16_t> x(random_x(M, K, seed));
  const std::vector<float> r0 = random_residual(static_cast<size_t>(M) * N, seed + 1);
  std::vector<float> nw = random_residual(static_cast<size_t>(N), seed + 2);
  for (float& v : nw) v = 1.0f + 0.25f * v;  // a norm weight around 1
  const DeviceBuffer<float> norm_weight(nw);

  DeviceBuffer<float> r_want(r0);
  fused_gemm(t, w4::Epilogue::residual_f32, p, w, x, M, r_want.p);
  DeviceBuffer<uint16_t> y_want(static_cast<size_t>(M) * N);
  ASSERT_EQ(y_want.poison(), cudaSuccess);
  ASSERT_EQ(cuda::rmsnorm_bf16(r_want.p, norm_weight.p, bf(y_want.p), M, N, kEps, nullptr), cudaSuccess);

  DeviceBuffer<float> r_got(r0);
  DeviceBuffer<uint16_t> y_got(static_cast<size_t>(M) * N);
  ASSERT_EQ(y_got.poison(), cudaSuccess);
  const size_t ws_bytes = workspace_for(t, M, N, K);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  ASSERT_EQ(ws.poison(), cudaSuccess);
  const ScaleType st = w.spec.scale_type;
  const cudaError_t e =
      t ? cuda::gemm_w4a16_residual_rmsnorm_with_tiling(*t, bf(x.p), p.words.p, p.scales.p, r_got.p, M, N, K, group,
                                                        st, norm_weight.p, kEps, bf(y_got.p), ws.p, ws_bytes, nullptr)
        : cuda::gemm_w4a16_residual_rmsnorm(bf(x.p), p.words.p, p.scales.p, r_got.p, M, N, K, group, st,
                                            norm_weight.p, kEps, bf(y_got.p), ws.p, ws_bytes, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> ra = r_want.download(), rb = r_got.download();
  for (size_t i = 0; i < ra.size(); ++i)
    ASSERT_EQ(f32_bits(rb[i]), f32_bits(ra[i])) << "residual, row " << i / N << " col " << i % N;
  const std::vector<uint16_t> ya = y_want.download(), yb = y_got.download();
  for (size_t i = 0; i < ya.size(); ++i) {
    ASSERT_FALSE(std::isnan(bf16_to_f32(ya[i]))) << "reference norm element " << i << " not written";
    ASSERT_EQ(yb[i], ya[i]) << "normed row " << i / N << " col " << i % N << ": " << bf16_to_f32(yb[i]) << " vs "
                            << bf16_to_f32(ya[i]);
  }
}

// Widths with one float4 unit per thread (1024), two (8192: 1024 threads), and fewer units than a full CTA (576:
// 160 threads), each unsplit and split (tilings_for), plus the public launcher.
TEST(GemmW4A16EpilogueGpu, ResidualRmsnormMatchesResidualThenRmsnorm) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 500;
  for (const NK& s : {NK{1024, 1024}, NK{576, 512}, NK{8192, 512}}) {
    const Int4Weight w = random_weight(s.N, s.K, 128, ScaleType::BF16, ++seed);
    const Packed p(w, Int4MmaRows::canonical);
    for (int M : {1, 3, 8, 17, 32}) {
      for (const w4::Tiling& t : tilings_for(M, s.N, s.K, 128, ScaleType::BF16))
        check_residual_rmsnorm(&t, p, w, M, ++seed);
      check_residual_rmsnorm(nullptr, p, w, M, ++seed);
    }
  }
}

// The 8B o and down shapes at the batches where the library splits them (the engine's fused_residual_norm).
TEST(GemmW4A16EpilogueGpu, ResidualRmsnormLlamaShapes) {
  FT_REQUIRE_CUDA_DEVICE();
  const Int4Weight o = random_weight(4096, 4096, 128, ScaleType::F16, 541);
  const Int4Weight down = random_weight(4096, 14336, 128, ScaleType::F16, 542);
  const Packed op(o, Int4MmaRows::canonical), dp(down, Int4MmaRows::canonical);
  for (int M : {1, 8, 16, 32}) {
    check_residual_rmsnorm(nullptr, op, o, M, 550 + M);
    check_residual_rmsnorm(nullptr, dp, down, M, 590 + M);
  }
}

TEST(GemmW4A16EpilogueHost, ResidualRmsnormRejectsBadNormArguments) {
  alignas(16) static unsigned char storage[256];
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(storage);
  const auto* w = reinterpret_cast<const uint32_t*>(storage);
  const auto* s = reinterpret_cast<const uint16_t*>(storage);
  auto* r = reinterpret_cast<float*>(storage + 64);
  const auto* nw = reinterpret_cast<const float*>(storage + 128);
  auto* y = reinterpret_cast<__nv_bfloat16*>(storage + 192);
  const int M = 1, N = 256, K = 256, group = 128;
  const auto expect = [](cudaError_t e, const char* needle) {
    EXPECT_EQ(e, cudaErrorInvalidValue);
    EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find(needle), std::string::npos)
        << cuda::gemm_w4a16_last_error();
  };
  expect(cuda::gemm_w4a16_residual_rmsnorm(x, w, s, r, M, N, K, group, ScaleType::F16, nullptr, 1e-5f, y, nullptr, 0,
                                           nullptr),
         "gemm_w4a16_residual_rmsnorm: norm_weight must be non-null and 16-byte aligned");
  expect(cuda::gemm_w4a16_residual_rmsnorm(x, w, s, r, M, N, K, group, ScaleType::F16, nw + 1, 1e-5f, y, nullptr, 0,
                                           nullptr),
         "norm_weight must be non-null and 16-byte aligned");
  expect(cuda::gemm_w4a16_residual_rmsnorm(x, w, s, r, M, N, K, group, ScaleType::F16, nw, 1e-5f,
                                           reinterpret_cast<__nv_bfloat16*>(storage + 194), nullptr, 0, nullptr),
         "y non-null and 8-byte aligned");
  expect(cuda::gemm_w4a16_residual_rmsnorm(x, w, s, r, M, N, K, group, ScaleType::F16, nw, -1.0f, y, nullptr, 0,
                                           nullptr),
         "eps = ");
  expect(cuda::gemm_w4a16_residual_rmsnorm(x, w, s, r, M, N, K, group, ScaleType::F16, nw, 1e-5f,
                                           reinterpret_cast<__nv_bfloat16*>(r), nullptr, 0, nullptr),
         "y overlaps the residual");
  expect(cuda::gemm_w4a16_residual_rmsnorm(x, w, s, r, M, 8448, K, group, ScaleType::F16, nw, 1e-5f, y, nullptr, 0,
                                           nullptr),
         "N = 8448 exceeds the fused norm's 8192");
}

TEST(GemmW4A16EpilogueHost, RejectsBadOutputPointers) {
  alignas(16) static unsigned char storage[64];
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(storage);
  const auto* w = reinterpret_cast<const uint32_t*>(storage);
  const auto* s = reinterpret_cast<const uint16_t*>(storage);
  const int M = 1, N = 256, K = 256, group = 128;
  EXPECT_EQ(cuda::gemm_w4a16_residual(x, w, s, nullptr, M, N, K, group, ScaleType::F16, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("residual"), std::string::npos)
      << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(cuda::gemm_w4a16_residual(x, w, s, reinterpret_cast<float*>(storage + 8), M, N, K, group, ScaleType::F16,
                                      nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("16-byte"), std::string::npos)
      << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(cuda::gemm_w4a16_swiglu(x, w, s, reinterpret_cast<__nv_bfloat16*>(storage + 4), M, N, K, group,
                                    ScaleType::F16, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("h must be"), std::string::npos)
      << cuda::gemm_w4a16_last_error();
  EXPECT_EQ(cuda::gemm_w4a16_swiglu(x, w, s, reinterpret_cast<__nv_bfloat16*>(storage), M, 250, K, group,
                                    ScaleType::F16, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find("N = 250"), std::string::npos)
      << cuda::gemm_w4a16_last_error();
}

}  // namespace
