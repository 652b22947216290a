// The W4A16 chain (src/cuda/w4a16_chain.h): host checks of its contract and its job dealing, and GPU runs against
// the CPU twin stage by stage. The twin of stage s is formats::gemm_w4a16_reference on the activations the stage
// reads — built on the host from the GPU's own y_{s-1} (so an error in one stage is reported there, not compounded)
// — with the tolerances of the v4 GEMM (w4a16_cases.h). Device tests report SKIPPED without a Hopper GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/w4a16_chain.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "gpu_test_util.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4Weight;
using formats::ScaleType;
using test::DeviceBuffer;
namespace w4 = futransformer::cuda::w4a16;
using w4::ChainInput;
using w4::ChainStage;

// A swiglu stage's activations come from the SFU's exponential and reciprocal on the GPU (ops::silu_mul, within
// 2^-21 of exact) and from exact arithmetic here, both rounded to BF16: an element may round to the neighbouring BF16
// value, at most 2^-8 of itself apart. Summed over k that moves y[m, n] by at most 2^-8 of sum_k |x_k w_nk|.
constexpr double kSwigluInputRounding = 1.0 / 256.0;

ChainStage stage(int N, int K, int group, ChainInput input, int offset = 0, int delay_ns = 0) {
  ChainStage s;
  s.N = N;
  s.K = K;
  s.group = group;
  s.input = input;
  s.input_offset = offset;
  s.delay_ns = delay_ns;
  // Aligned stand-ins for the host checks; the device tests set real pointers.
  alignas(16) static unsigned char dummy[16];
  s.w = dummy;
  s.scales = dummy;
  s.y = reinterpret_cast<__nv_bfloat16*>(dummy);
  return s;
}

std::string refusal(const std::vector<ChainStage>& stages, int M) {
  std::string why;
  const cudaError_t e = w4::w4a16_chain_can_implement(stages, M, &why);
  return e == cudaSuccess ? std::string("accepted") : why;
}

TEST(W4A16ChainHost, AcceptsTheLlamaLayerChain) {
  std::vector<ChainStage> s = {stage(6144, 4096, 128, ChainInput::first),
                               stage(4096, 4096, 128, ChainInput::previous, 0, 3000),
                               stage(28672, 4096, 128, ChainInput::previous),
                               stage(4096, 14336, 128, ChainInput::swiglu)};
  EXPECT_EQ(refusal(s, 1), "accepted");
  EXPECT_EQ(refusal(s, 2), "accepted");
  EXPECT_NE(refusal(s, 3).find("stage 3: M * K = 43008"), std::string::npos) << refusal(s, 3);
}

TEST(W4A16ChainHost, RejectsEachBadFieldNamingTheStage) {
  const std::vector<ChainStage> good = {stage(512, 512, 128, ChainInput::first),
                                        stage(256, 256, 64, ChainInput::previous, 256),
                                        stage(256, 64, 32, ChainInput::previous)};
  // 64 is not a multiple of the slot's 128 k.
  EXPECT_NE(refusal(good, 1).find("stage 2: K = 64"), std::string::npos) << refusal(good, 1);
  auto with = [&](int s, auto edit) {
    std::vector<ChainStage> v = {stage(512, 512, 128, ChainInput::first),
                                 stage(768, 256, 64, ChainInput::previous, 256),
                                 stage(256, 256, 32, ChainInput::swiglu, 256)};
    edit(v[s]);
    return refusal(v, 2);
  };
  EXPECT_EQ(with(0, [](ChainStage&) {}), "accepted");
  EXPECT_NE(with(1, [](ChainStage& s) { s.N = 100; }).find("stage 1: N = 100"), std::string::npos);
  EXPECT_NE(with(1, [](ChainStage& s) { s.group = 48; }).find("stage 1: group = 48"), std::string::npos);
  EXPECT_NE(with(0, [](ChainStage& s) { s.input = ChainInput::previous; }).find("stage 0: the first stage"),
            std::string::npos);
  EXPECT_NE(with(1, [](ChainStage& s) { s.input = ChainInput::first; }).find("stage 1: input"), std::string::npos);
  EXPECT_NE(with(1, [](ChainStage& s) { s.input_offset = 260; }).find("stage 1: reads previous columns [260, 516)"),
            std::string::npos);
  EXPECT_NE(with(1, [](ChainStage& s) { s.input_offset = 264; }).find("stage 1: reads previous columns [264, 520)"),
            std::string::npos);
  // swiglu reads 2 K columns: 256 + 512 = 768 fits the previous N of 768, 264 + 512 does not.
  EXPECT_NE(with(2, [](ChainStage& s) { s.input_offset = 264; }).find("stage 2: reads previous columns [264, 776)"),
            std::string::npos);
  EXPECT_NE(with(2, [](ChainStage& s) { s.w = nullptr; }).find("stage 2: a null weight"), std::string::npos);
  EXPECT_NE(with(2, [](ChainStage& s) { s.delay_ns = -1; }).find("stage 2: delay_ns = -1"), std::string::npos);
  EXPECT_NE(with(1, [](ChainStage& s) {
              s.y = reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<uintptr_t>(s.y) + 2);
            }).find("stage 1: weights, scales and output must be 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(refusal(good, 0).find("M = 0"), std::string::npos);
  EXPECT_NE(refusal(good, 9).find("M = 9"), std::string::npos);
  EXPECT_NE(refusal({}, 1).find("0 stages"), std::string::npos);
}

// Every 32-column block of every stage has exactly one CTA, and the rotation keeps each CTA's running total of blocks
// within one of every other's after each stage (the round-robin continues where the previous stage stopped).
TEST(W4A16ChainHost, DealsEveryBlockOnceAndBalancesAcrossStages) {
  const std::vector<int> blocks = {192, 128, 896, 128, 192, 128, 896, 128, 3, 1, 257};
  for (int ctas : {1, 5, 7, 132}) {
    SCOPED_TRACE("ctas " + std::to_string(ctas));
    std::vector<int64_t> total(ctas, 0);
    int64_t rot = 0;
    for (int nb : blocks) {
      std::vector<int> owner(nb, -1);
      for (int c = 0; c < ctas; ++c)
        for (int j = w4::chain_first_job(c, ctas, rot); j < nb; j += ctas) {
          ASSERT_EQ(owner[j], -1) << "block " << j << " dealt twice";
          owner[j] = c;
          ++total[c];
        }
      for (int j = 0; j < nb; ++j) ASSERT_NE(owner[j], -1) << "block " << j << " of a " << nb << "-block stage";
      rot = (rot + nb) % ctas;
      const auto [lo, hi] = std::minmax_element(total.begin(), total.end());
      EXPECT_LE(*hi - *lo, 1);
    }
  }
}

TEST(W4A16ChainHost, WorkspaceHoldsTheTableAndACounterPerStage) {
  EXPECT_EQ(w4::w4a16_chain_workspace_bytes(0), 0u);
  EXPECT_EQ(w4::w4a16_chain_workspace_bytes(1), (sizeof(ChainStage) + 15) / 16 * 16 + 4);
  EXPECT_EQ(w4::w4a16_chain_workspace_bytes(128), (128 * sizeof(ChainStage) + 15) / 16 * 16 + 128 * 4);
}

// ---- device ----------------------------------------------------------------------------------------------------

struct StageData {
  Int4Weight w;
  DeviceBuffer<uint32_t> packed;
  DeviceBuffer<uint16_t> scales;
  DeviceBuffer<uint16_t> y;
  StageData(Int4Weight q, int M)
      : w(std::move(q)),
        packed(formats::repack_int4_for_mma(w)),
        scales(formats::repack_int4_scales_for_mma(w)),
        y(static_cast<size_t>(M) * w.rows) {}
};

struct Spec {
  int N, K, group;
  ChainInput input;
  int offset, delay_ns;
};

double silu_times(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

// Runs the chain of `specs` with M rows, `ctas` CTAs (0: one per SM) and the producer's stages_ahead on fresh inputs into poisoned outputs, twice;
// checks each stage against its twin, both runs bit for bit equal, and every counter at the CTA count.
void run_and_check(const std::vector<Spec>& specs, int M, ScaleType st, int ctas, uint32_t seed,
                   int stages_ahead = w4::kChainAnyStagesAhead, w4::ChainCopies copies = w4::ChainCopies::bulk) {
  std::vector<std::unique_ptr<StageData>> data;
  std::vector<ChainStage> stages;
  for (size_t s = 0; s < specs.size(); ++s) {
    const Spec& p = specs[s];
    data.push_back(std::make_unique<StageData>(
        test::w4a16::random_weight(p.N, p.K, p.group, st, seed + 17 * static_cast<uint32_t>(s)), M));
    ChainStage c;
    c.w = data.back()->packed.p;
    c.scales = data.back()->scales.p;
    c.y = reinterpret_cast<__nv_bfloat16*>(data.back()->y.p);
    c.N = p.N;
    c.K = p.K;
    c.group = p.group;
    c.input = p.input;
    c.input_offset = p.offset;
    c.delay_ns = p.delay_ns;
    stages.push_back(c);
  }
  const std::vector<uint16_t> x0 = test::w4a16::random_x(M, specs[0].K, seed + 1000);
  DeviceBuffer<uint16_t> dx(x0);
  DeviceBuffer<unsigned char> ws(w4::w4a16_chain_workspace_bytes(static_cast<int>(stages.size())));
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const uint32_t expect_count = static_cast<uint32_t>(ctas > 0 ? ctas : sms);

  std::vector<std::vector<uint16_t>> first_run;
  for (int run = 0; run < 2; ++run) {
    for (auto& d : data) ASSERT_EQ(d->y.poison(), cudaSuccess);
    ASSERT_EQ(ws.poison(), cudaSuccess);
    std::string why;
    const cudaError_t e = w4::w4a16_chain(stages, reinterpret_cast<const __nv_bfloat16*>(dx.p), M, st, ws.p, ws.n,
                                          /*upload=*/true, ctas, stages_ahead, nullptr, &why, copies);
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << why;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<unsigned char> w = ws.download();
    const size_t counters_at = ws.n - stages.size() * 4;
    for (size_t s = 0; s < stages.size(); ++s) {
      uint32_t v = 0;
      std::memcpy(&v, w.data() + counters_at + 4 * s, 4);
      EXPECT_EQ(v, expect_count) << "counter of stage " << s;
    }
    if (run == 0) {
      for (auto& d : data) first_run.push_back(d->y.download());
      continue;
    }
    for (size_t s = 0; s < data.size(); ++s)
      ASSERT_EQ(data[s]->y.download(), first_run[s]) << "stage " << s << " differs between two launches";
  }

  // Stage by stage against the twin, from the GPU's own previous output.
  for (size_t s = 0; s < specs.size(); ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const Spec& p = specs[s];
    std::vector<uint16_t> x(static_cast<size_t>(M) * p.K);
    if (s == 0) {
      x = x0;
    } else {
      const std::vector<uint16_t>& prev = first_run[s - 1];
      const int prev_n = specs[s - 1].N;
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < p.K; ++k) {
          const size_t at = static_cast<size_t>(m) * prev_n + p.offset + k;
          uint16_t v = prev[at];
          if (p.input == ChainInput::swiglu)
            v = f32_to_bf16(static_cast<float>(silu_times(bf16_to_f32(prev[at]), bf16_to_f32(prev[at + p.K]))));
          x[static_cast<size_t>(m) * p.K + k] = v;
        }
    }
    std::vector<float> abs_dot;
    const std::vector<float> ref = formats::gemm_w4a16_reference(x, M, data[s]->w, &abs_dot);
    const std::vector<double> off = test::w4a16::offset_dot(x, M, data[s]->w);
    const std::vector<uint16_t>& y = first_run[s];
    double err2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double got = bf16_to_f32(y[i]);
      ASSERT_FALSE(std::isnan(got)) << "output " << i << " (row " << i / p.N << ", col " << i % p.N
                                    << ") not written";
      const double bound = test::w4a16::error_bound(w4::Variant::v4, ref[i], abs_dot[i], off[i]) +
                           (p.input == ChainInput::swiglu ? kSwigluInputRounding * abs_dot[i] : 0.0);
      ASSERT_LE(std::fabs(got - ref[i]), bound) << "row " << i / p.N << " col " << i % p.N << ": got " << got
                                                << ", ref " << ref[i];
      err2 += (got - ref[i]) * (got - ref[i]);
      ref2 += static_cast<double>(ref[i]) * ref[i];
    }
    ASSERT_GT(ref2, 0.0);
    EXPECT_LE(std::sqrt(err2 / ref2), test::w4a16::kRelL2Tol);
  }
}

// Five stages through every input kind and group size: a first stage, a column window of it, a delayed swiglu
// stage, a wide stage, and a long-K one (24 slots per block: warps 0..7 take two, 8..15 one; M = 8 stages 24576
// activations of the 28672 a CTA holds).
std::vector<Spec> mixed_chain() {
  return {{1536, 512, 128, ChainInput::first, 0, 0},
          {2048, 1024, 64, ChainInput::previous, 512, 0},
          {512, 768, 32, ChainInput::swiglu, 256, 2000},
          {4096, 256, 128, ChainInput::previous, 256, 0},
          {256, 3072, 128, ChainInput::previous, 0, 0}};
}

class W4A16ChainGpu : public ::testing::TestWithParam<int> {};

TEST_P(W4A16ChainGpu, MatchesTheTwinEveryStageOnAllSms) {
  FT_REQUIRE_HOPPER();
  run_and_check(mixed_chain(), GetParam(), ScaleType::BF16, 0, 11u + GetParam());
}

// Five CTAs: many blocks per CTA, the producer far ahead across stages, every sub-ring reused many times.
TEST_P(W4A16ChainGpu, MatchesTheTwinWithFewCtas) {
  FT_REQUIRE_HOPPER();
  run_and_check(mixed_chain(), GetParam(), ScaleType::F16, 5, 23u + GetParam());
}

// The producer held to its consumers' stage (0) or one stage ahead: the same results.
TEST_P(W4A16ChainGpu, MatchesTheTwinWithTheProducerHeldBack) {
  FT_REQUIRE_HOPPER();
  run_and_check(mixed_chain(), GetParam(), ScaleType::BF16, 7, 37u + GetParam(), 0);
  run_and_check(mixed_chain(), GetParam(), ScaleType::BF16, 0, 41u + GetParam(), 1);
}

// Each consumer warp copying its own slots (cp.async, no producer warp): the same results.
TEST_P(W4A16ChainGpu, MatchesTheTwinWithWarpCopies) {
  FT_REQUIRE_HOPPER();
  run_and_check(mixed_chain(), GetParam(), ScaleType::F16, 0, 53u + GetParam(), w4::kChainAnyStagesAhead,
                w4::ChainCopies::warp);
  run_and_check(mixed_chain(), GetParam(), ScaleType::BF16, 5, 59u + GetParam(), w4::kChainAnyStagesAhead,
                w4::ChainCopies::warp);
}

INSTANTIATE_TEST_SUITE_P(Rows, W4A16ChainGpu, ::testing::Values(1, 2, 5, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return "M" + std::to_string(i.param); });

// The 8B layer's four GEMMs twice (qkv, o on the first 4096 columns, gate|up, SwiGLU into down): real sizes, so the
// ring runs ahead across stages of up to 58 MB.
TEST(W4A16ChainGpuShapes, Llama8BLayerTwice) {
  FT_REQUIRE_HOPPER();
  std::vector<Spec> s;
  for (int layer = 0; layer < 2; ++layer) {
    s.push_back({6144, 4096, 128, layer == 0 ? ChainInput::first : ChainInput::previous, 0, 0});
    s.push_back({4096, 4096, 128, ChainInput::previous, 0, 3000});
    s.push_back({28672, 4096, 128, ChainInput::previous, 0, 0});
    s.push_back({4096, 14336, 128, ChainInput::swiglu, 0, 0});
  }
  run_and_check(s, 1, ScaleType::BF16, 0, 101u);
  run_and_check(s, 2, ScaleType::BF16, 0, 103u, w4::kChainAnyStagesAhead, w4::ChainCopies::warp);
}

TEST(W4A16ChainGpuShapes, RefusesMoreCtasThanResident) {
  FT_REQUIRE_HOPPER();
  DeviceBuffer<uint16_t> y(256), x(256);
  DeviceBuffer<uint32_t> w(256 * 256 / 8);
  DeviceBuffer<uint16_t> sc(256 * 2);
  ChainStage c = stage(256, 256, 128, ChainInput::first);
  c.w = w.p;
  c.scales = sc.p;
  c.y = reinterpret_cast<__nv_bfloat16*>(y.p);
  const std::vector<ChainStage> stages = {c};
  DeviceBuffer<unsigned char> ws(w4::w4a16_chain_workspace_bytes(1));
  std::string why;
  EXPECT_EQ(w4::w4a16_chain(stages, reinterpret_cast<const __nv_bfloat16*>(x.p), 1, ScaleType::BF16, ws.p, ws.n,
                            true, 100000, w4::kChainAnyStagesAhead, nullptr, &why),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("cannot all be resident"), std::string::npos) << why;
  EXPECT_EQ(w4::w4a16_chain(stages, reinterpret_cast<const __nv_bfloat16*>(x.p), 1, ScaleType::BF16, ws.p, 4, true,
                            0, w4::kChainAnyStagesAhead, nullptr, &why),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("workspace"), std::string::npos) << why;
  EXPECT_EQ(w4::w4a16_chain(stages, reinterpret_cast<const __nv_bfloat16*>(x.p), 1, ScaleType::BF16, ws.p, ws.n, true,
                            0, -1, nullptr, &why),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("stages_ahead = -1"), std::string::npos) << why;
  EXPECT_EQ(w4::w4a16_chain(stages, reinterpret_cast<const __nv_bfloat16*>(x.p), 1, ScaleType::BF16, ws.p, ws.n, true,
                            0, 1, nullptr, &why, w4::ChainCopies::warp),
            cudaErrorInvalidValue);
  EXPECT_NE(why.find("warp copies run ahead"), std::string::npos) << why;
}

}  // namespace
