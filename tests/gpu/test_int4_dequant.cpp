// GPU tests of the INT4 → BF16 dequantisation of packed W4A16 weights (cuda::int4_dequant_bf16) and of the CUDA
// engine's large-M INT4 projection path built on it (DeviceLinear with GemmContext::int4_dequant_min_rows):
//  - the kernel against its CPU twin (formats::int4_dequantize_bf16_mma_order), bit for bit: groups 32/64/128, FP16
//    and BF16 scales, canonical and SwiGLU-interleaved packings, packed and canonical output rows, K tails that leave
//    warps of the last CTA column idle, and an 8B-sized weight; outputs NaN-poisoned before each launch;
//  - the launcher's refusals (no device needed);
//  - DeviceLinear::forward at M >= the threshold against the CPU GEMM on the BF16-rounded weights (fp64 sums; bound:
//    cuBLAS's fp32 accumulation and the BF16 output rounding) and against the exact INT4 weights (plus the weight
//    rounding, 2^-9 relative); below the threshold and with the threshold 0 it is still the W4A16 GEMM bit for bit;
//    forward_residual / forward_swiglu on that path equal forward + add_residual_bf16 / swiglu_bf16 bit for bit.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/engine/device_linear.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/cuda/int4_dequant.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/int4_mma.h"
#include "gpu_test_util.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using cuda::Int4DequantRows;
using formats::Int4MmaRows;
using formats::Int4Weight;
using formats::ScaleType;
using test::DeviceBuffer;
using test::w4a16::random_weight;
using test::w4a16::random_x;

__nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
const __nv_bfloat16* bf(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

const char* packing_name(Int4MmaRows r) { return r == Int4MmaRows::canonical ? "canonical" : "interleaved"; }

// --- the kernel ------------------------------------------------------------------------------------------------

struct Shape {
  int N, K, group;
};

void expect_kernel_matches_twin(const Shape& sh, ScaleType st, uint32_t seed) {
  const Int4Weight w = random_weight(sh.N, sh.K, sh.group, st, seed);
  for (Int4MmaRows packing : {Int4MmaRows::canonical, Int4MmaRows::swiglu_interleaved}) {
    const DeviceBuffer<uint32_t> words(formats::repack_int4_for_mma(w, packing));
    const DeviceBuffer<uint16_t> scales(formats::repack_int4_scales_for_mma(w, packing));
    for (Int4DequantRows rows : {Int4DequantRows::packed, Int4DequantRows::canonical}) {
      SCOPED_TRACE(testing::Message() << sh.N << " x " << sh.K << " group " << sh.group
                                      << (st == ScaleType::BF16 ? " BF16" : " F16") << " scales, packing "
                                      << packing_name(packing) << ", output rows "
                                      << (rows == Int4DequantRows::packed ? "packed" : "canonical"));
      DeviceBuffer<uint16_t> out(static_cast<size_t>(sh.N) * sh.K);
      ASSERT_EQ(out.poison(), cudaSuccess);
      ASSERT_EQ(cuda::int4_dequant_bf16(words.p, scales.p, bf(out.p), sh.N, sh.K, sh.group, st, packing, rows,
                                        nullptr),
                cudaSuccess)
          << cuda::int4_dequant_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> got = out.download();
      const std::vector<uint16_t> want = formats::int4_dequantize_bf16_mma_order(
          w, rows == Int4DequantRows::canonical ? Int4MmaRows::canonical : packing);
      size_t poisoned = 0, first_diff = got.size();
      for (size_t i = 0; i < got.size(); ++i) {
        poisoned += got[i] == 0xFFFF;
        if (got[i] != want[i] && first_diff == got.size()) first_diff = i;
      }
      EXPECT_EQ(poisoned, 0u) << "elements left at the NaN poison";
      ASSERT_EQ(first_diff, got.size()) << "first difference at row " << first_diff / sh.K << " col "
                                        << first_diff % sh.K << ": got 0x" << std::hex << got[first_diff]
                                        << ", want 0x" << want[first_diff];
    }
  }
}

TEST(Int4DequantGpu, BitExactAgainstTheTwin) {
  FT_REQUIRE_CUDA_DEVICE();
  // K = 32, 96, 320: the only / last CTA column has 1, 3 and 2 of its 8 warps busy; 512 and 768: whole columns.
  const Shape shapes[] = {{32, 32, 32}, {64, 96, 32}, {96, 320, 32}, {96, 320, 64}, {160, 256, 64},
                          {64, 512, 128}, {1536, 256, 64}, {256, 768, 128}, {32, 384, 128}};
  uint32_t seed = 100;
  for (const Shape& sh : shapes)
    for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) expect_kernel_matches_twin(sh, st, ++seed);
}

// Llama-3.1-8B's q|k|v (6144 x 4096): 16 x 192 CTAs, many waves.
TEST(Int4DequantGpu, BitExactAt8BShape) {
  FT_REQUIRE_CUDA_DEVICE();
  expect_kernel_matches_twin({6144, 4096, 128}, ScaleType::F16, 7);
}

TEST(Int4DequantHost, RefusesBadArgumentsBeforeAnyLaunch) {
  auto* w = reinterpret_cast<const uint32_t*>(uintptr_t{256});
  auto* s = reinterpret_cast<const uint16_t*>(uintptr_t{512});
  auto* out = reinterpret_cast<__nv_bfloat16*>(uintptr_t{1024});
  const auto F16 = ScaleType::F16;
  const auto canon = Int4MmaRows::canonical;
  const auto packed = Int4DequantRows::packed;
  struct Bad {
    const uint32_t* w;
    const uint16_t* s;
    __nv_bfloat16* out;
    int N, K, group;
    const char* mentions;
  };
  const Bad cases[] = {
      {w, s, out, 48, 64, 32, "N = 48"},
      {w, s, out, 0, 64, 32, "N = 0"},
      {w, s, out, (1 << 18) + 32, 64, 32, "N = "},
      {w, s, out, 64, 48, 16, "group = 16"},
      {w, s, out, 64, 96, 64, "K = 96"},
      {w, s, out, 64, 80, 32, "K = 80"},
      {nullptr, s, out, 64, 64, 32, "non-null"},
      {w, nullptr, out, 64, 64, 32, "non-null"},
      {w, s, nullptr, 64, 64, 32, "non-null"},
      {reinterpret_cast<const uint32_t*>(uintptr_t{260}), s, out, 64, 64, 32, "16-byte aligned"},
      {w, s, reinterpret_cast<__nv_bfloat16*>(uintptr_t{1032}), 64, 64, 32, "16-byte aligned"},
      {w, reinterpret_cast<const uint16_t*>(uintptr_t{513}), out, 64, 64, 32, "2-byte aligned"},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.mentions);
    EXPECT_EQ(cuda::int4_dequant_bf16(b.w, b.s, b.out, b.N, b.K, b.group, F16, canon, packed, nullptr),
              cudaErrorInvalidValue);
    EXPECT_NE(std::string(cuda::int4_dequant_last_error()).find(b.mentions), std::string::npos)
        << cuda::int4_dequant_last_error();
  }
  std::string why;
  EXPECT_EQ(cuda::int4_dequant_bf16_can_implement(4096, 14336, 128, &why), cudaSuccess) << why;
}

// --- DeviceLinear's large-M path ---------------------------------------------------------------------------------

// cuBLAS sums K products in fp32 (any order, possibly split over K): at most K rounding steps of 2^-24 relative to
// the running sum of magnitudes, then one BF16 rounding of the output; got and want (the fp64 sum rounded to BF16)
// may each sit half a BF16 step from the exact value.
constexpr double kBf16Step = 0x1p-8;
constexpr double kFp32Unit = 0x1p-24;
// Rounding every weight to BF16 moves each product by at most 2^-9 of its magnitude.
constexpr double kWeightRounding = 0x1p-9;
// Whole-tensor relative L2 against the exact INT4 weights: BF16 output rounding alone gives about 2e-3.
constexpr double kRelL2Tol = 1e-2;

constexpr int64_t kThreshold = 192;

struct Gemm {
  cublasHandle_t handle = nullptr;
  Gemm() { EXPECT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS); }
  ~Gemm() { cublasDestroy(handle); }
};

// fp64 sums of x · w over K for BF16 bit patterns x [M, K] and w [N, K]: value and sum of magnitudes.
void reference_gemm(const std::vector<uint16_t>& x, int64_t M, const std::vector<float>& w, int64_t N, int64_t K,
                    std::vector<double>* y, std::vector<double>* abs) {
  y->assign(static_cast<size_t>(M * N), 0.0);
  abs->assign(y->size(), 0.0);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(xf[static_cast<size_t>(m * K + k)]) * w[static_cast<size_t>(n * K + k)];
        s += p;
        a += std::fabs(p);
      }
      (*y)[static_cast<size_t>(m * N + n)] = s;
      (*abs)[static_cast<size_t>(m * N + n)] = a;
    }
  }
}

struct LinearCase {
  int64_t N, K, group;
  ScaleType st;
};

// The context DeviceLinear gets from the engine: cuBLAS, the W4A16 split-K workspace, the scratch and a threshold.
struct Context {
  DeviceBuffer<uint8_t> ws, scratch;
  cuda::GemmContext g;
  Context(const cuda::DeviceLinear& l, cublasHandle_t h, int64_t threshold)
      : ws(std::max<size_t>(l.workspace_bytes(cuda::kW4A16MaxM), 16)),
        scratch(std::max<size_t>(l.dequant_scratch_bytes(), 16)) {
    g.cublas = h;
    g.workspace = ws.p;
    g.workspace_bytes = ws.n;
    g.stream = nullptr;
    g.int4_dequant_min_rows = threshold;
    g.dequant_scratch = scratch.p;
    g.dequant_scratch_bytes = scratch.n;
    EXPECT_EQ(scratch.poison(), cudaSuccess);
  }
};

// y = forward(x) on M rows, from a poisoned output.
std::vector<uint16_t> run_forward(const cuda::DeviceLinear& l, const DeviceBuffer<uint16_t>& x, int64_t M,
                                  const cuda::GemmContext& g) {
  DeviceBuffer<uint16_t> y(static_cast<size_t>(M * l.out_features()));
  EXPECT_EQ(y.poison(), cudaSuccess);
  l.forward(bf(x.p), M, y.p, false, g);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return y.download();
}

// The W4A16 GEMM launched directly on 64-row slices: what DeviceLinear ran for every M before the large-M path.
std::vector<uint16_t> w4a16_slices(const Int4Weight& w, const DeviceBuffer<uint16_t>& x, int64_t M) {
  const DeviceBuffer<uint32_t> words(formats::repack_int4_for_mma(w));
  const DeviceBuffer<uint16_t> scales(formats::repack_int4_scales_for_mma(w));
  const int N = static_cast<int>(w.rows), K = static_cast<int>(w.cols);
  DeviceBuffer<uint16_t> y(static_cast<size_t>(M * N));
  EXPECT_EQ(y.poison(), cudaSuccess);
  size_t ws_bytes = 16;
  for (int m = 1; m <= cuda::kW4A16MaxM; ++m) ws_bytes = std::max(ws_bytes, cuda::gemm_w4a16_workspace_bytes(m, N, K));
  DeviceBuffer<uint8_t> ws(ws_bytes);
  for (int64_t m0 = 0; m0 < M; m0 += cuda::kW4A16MaxM) {
    const int mc = static_cast<int>(std::min<int64_t>(cuda::kW4A16MaxM, M - m0));
    EXPECT_EQ(cuda::gemm_w4a16(bf(x.p) + m0 * K, words.p, scales.p, bf(y.p) + m0 * N, mc, N, K,
                               static_cast<int>(w.group), w.spec.scale_type, ws.p, ws.n, nullptr),
              cudaSuccess)
        << cuda::gemm_w4a16_last_error();
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return y.download();
}

class DeviceLinearDequant : public ::testing::TestWithParam<LinearCase> {};

TEST_P(DeviceLinearDequant, ForwardMatchesTheBf16WeightGemmAndKeepsTheW4A16PathBelowTheThreshold) {
  FT_REQUIRE_HOPPER();
  const LinearCase c = GetParam();
  const Int4Weight w = random_weight(c.N, c.K, c.group, c.st, 31);
  const formats::Int4Weight* parts[] = {&w};
  const cuda::DeviceLinear l = cuda::DeviceLinear::from_int4(parts, "test.proj");
  Gemm gemm;
  const Context on(l, gemm.handle, kThreshold), off(l, gemm.handle, 0);
  EXPECT_EQ(l.dequant_scratch_bytes(), static_cast<size_t>(c.N * c.K * 2));
  const std::vector<float> w_exact = formats::int4_dequantize(w);
  std::vector<float> w_bf16(w_exact.size());
  const std::vector<uint16_t> wb = formats::int4_dequantize_bf16_mma_order(w);
  for (size_t i = 0; i < wb.size(); ++i) w_bf16[i] = bf16_to_f32(wb[i]);

  for (int64_t M : {kThreshold - 1, kThreshold, int64_t{257}}) {
    SCOPED_TRACE(testing::Message() << "M " << M);
    const std::vector<uint16_t> xh = random_x(M, c.K, static_cast<uint32_t>(M));
    const DeviceBuffer<uint16_t> x(xh);
    EXPECT_EQ(l.dequant_path(M, on.g), M >= kThreshold);
    EXPECT_FALSE(l.dequant_path(M, off.g));
    const std::vector<uint16_t> y = run_forward(l, x, M, on.g);
    const std::vector<uint16_t> loop = w4a16_slices(w, x, M);
    // Threshold 0 (and M below it): the 64-row W4A16 launches exactly as before.
    EXPECT_EQ(run_forward(l, x, M, off.g), loop);
    if (M < kThreshold) {
      EXPECT_EQ(y, loop);
      continue;
    }
    EXPECT_NE(y, loop) << "the dequantise + cuBLAS path rounds weights to BF16: some output must differ";
    std::vector<double> ref_b, abs_b, ref_e, abs_e;
    reference_gemm(xh, M, w_bf16, c.N, c.K, &ref_b, &abs_b);
    reference_gemm(xh, M, w_exact, c.N, c.K, &ref_e, &abs_e);
    const double accum = static_cast<double>(c.K) * kFp32Unit;
    double num = 0, den = 0;
    int64_t bad_b = 0, bad_e = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double got = bf16_to_f32(y[i]);
      ASSERT_TRUE(std::isfinite(got)) << "element " << i;
      if (std::fabs(got - ref_b[i]) > kBf16Step * std::fabs(ref_b[i]) + accum * abs_b[i]) {
        if (bad_b++ < 5) ADD_FAILURE() << "vs BF16 weights: element " << i << " got " << got << " want " << ref_b[i];
      }
      if (std::fabs(got - ref_e[i]) > kBf16Step * std::fabs(ref_e[i]) + (accum + kWeightRounding) * abs_e[i]) {
        if (bad_e++ < 5) ADD_FAILURE() << "vs exact weights: element " << i << " got " << got << " want " << ref_e[i];
      }
      num += (got - ref_e[i]) * (got - ref_e[i]);
      den += ref_e[i] * ref_e[i];
    }
    EXPECT_EQ(bad_b, 0);
    EXPECT_EQ(bad_e, 0);
    EXPECT_LE(std::sqrt(num / den), kRelL2Tol);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeviceLinearDequant,
                         ::testing::Values(LinearCase{1536, 256, 64, ScaleType::F16},
                                           LinearCase{256, 768, 128, ScaleType::BF16},
                                           LinearCase{512, 320, 32, ScaleType::F16},
                                           LinearCase{4096, 4096, 128, ScaleType::F16}),
                         [](const auto& info) {
                           const LinearCase& c = info.param;
                           return std::to_string(c.N) + "x" + std::to_string(c.K) + "_g" + std::to_string(c.group) +
                                  (c.st == ScaleType::BF16 ? "_bf16" : "_f16");
                         });

// forward_residual and forward_swiglu on the dequantise + cuBLAS path: forward's BF16 output followed by the separate
// kernels, bit for bit (the residual also against the host's fp32 add). The SwiGLU weight is packed interleaved and
// dequantised to canonical rows, so its forward twin is the canonically packed weight's forward.
TEST(DeviceLinearDequantEpilogues, ResidualAndSwigluEqualForwardPlusTheSeparateOps) {
  FT_REQUIRE_HOPPER();
  Gemm gemm;
  const int64_t M = 230, inter = 768, hidden = 256;
  for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
    SCOPED_TRACE(st == ScaleType::BF16 ? "BF16 scales" : "F16 scales");
    // down-like residual projection: hidden x inter.
    const Int4Weight down = random_weight(hidden, inter, 64, st, 41);
    const formats::Int4Weight* down_parts[] = {&down};
    const cuda::DeviceLinear ld = cuda::DeviceLinear::from_int4(down_parts, "test.down");
    const Context cd(ld, gemm.handle, kThreshold);
    const std::vector<uint16_t> xd = random_x(M, inter, 5);
    const DeviceBuffer<uint16_t> x_down(xd);
    const std::vector<uint16_t> y = run_forward(ld, x_down, M, cd.g);
    std::vector<float> r0(static_cast<size_t>(M * hidden));
    std::mt19937 rng(6);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& v : r0) v = dist(rng);
    DeviceBuffer<float> residual(r0);
    DeviceBuffer<uint16_t> tmp(static_cast<size_t>(M * hidden));
    ASSERT_EQ(tmp.poison(), cudaSuccess);
    ld.forward_residual(bf(x_down.p), M, residual.p, bf(tmp.p), cd.g);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> r1 = residual.download();
    EXPECT_EQ(tmp.download(), y) << "the temp holds forward's output";
    for (size_t i = 0; i < r1.size(); ++i) ASSERT_EQ(r1[i], r0[i] + bf16_to_f32(y[i])) << "element " << i;
    EXPECT_THROW(ld.forward_residual(bf(x_down.p), M, residual.p, nullptr, cd.g), Error) << "no temp";

    // gate|up: 2 inter x hidden, packed interleaved for forward_swiglu, canonically for its twin.
    const Int4Weight gate = random_weight(inter, hidden, 64, st, 42), up = random_weight(inter, hidden, 64, st, 43);
    const formats::Int4Weight* gu[] = {&gate, &up};
    const cuda::DeviceLinear inter_l =
        cuda::DeviceLinear::from_int4(gu, "test.gate_up", Int4MmaRows::swiglu_interleaved);
    const cuda::DeviceLinear canon_l = cuda::DeviceLinear::from_int4(gu, "test.gate_up (canonical)");
    const Context ci(inter_l, gemm.handle, kThreshold), cc(canon_l, gemm.handle, kThreshold);
    const DeviceBuffer<uint16_t> x_gu(random_x(M, hidden, 8));
    const std::vector<uint16_t> gu_y = run_forward(canon_l, x_gu, M, cc.g);
    const DeviceBuffer<uint16_t> gu_dev(gu_y);
    DeviceBuffer<uint16_t> h_want(static_cast<size_t>(M * inter)), h(static_cast<size_t>(M * inter));
    DeviceBuffer<uint16_t> gu_tmp(static_cast<size_t>(M * 2 * inter));
    ASSERT_EQ(h_want.poison(), cudaSuccess);
    ASSERT_EQ(h.poison(), cudaSuccess);
    ASSERT_EQ(gu_tmp.poison(), cudaSuccess);
    ASSERT_EQ(cuda::swiglu_bf16(bf(gu_dev.p), bf(h_want.p), static_cast<int>(M), static_cast<int>(inter), nullptr),
              cudaSuccess);
    inter_l.forward_swiglu(bf(x_gu.p), M, bf(h.p), bf(gu_tmp.p), ci.g);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(gu_tmp.download(), gu_y) << "gate|up dequantised in canonical [gate | up] order";
    const std::vector<uint16_t> hv = h.download();
    EXPECT_EQ(hv, h_want.download());
    for (uint16_t v : hv) ASSERT_NE(v, 0xFFFF) << "an output left at the poison";
    EXPECT_THROW(inter_l.forward_swiglu(bf(x_gu.p), M, bf(h.p), bf(h.p), ci.g), Error) << "temp overlaps the output";
  }
}

// The path needs its scratch: a context without one is an Error naming the projection, not a launch.
TEST(DeviceLinearDequantEpilogues, MissingScratchIsAnError) {
  FT_REQUIRE_HOPPER();
  Gemm gemm;
  const Int4Weight w = random_weight(64, 128, 32, ScaleType::F16, 3);
  const formats::Int4Weight* parts[] = {&w};
  const cuda::DeviceLinear l = cuda::DeviceLinear::from_int4(parts, "test.small");
  Context c(l, gemm.handle, 8);
  c.g.dequant_scratch_bytes = l.dequant_scratch_bytes() - 16;
  const DeviceBuffer<uint16_t> x(random_x(16, 128, 1));
  DeviceBuffer<uint16_t> y(16 * 64);
  try {
    l.forward(bf(x.p), 16, y.p, false, c.g);
    ADD_FAILURE() << "accepted a short scratch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.small"), std::string::npos) << e.what();
  }
}

}  // namespace
