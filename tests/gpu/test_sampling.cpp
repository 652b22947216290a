// GPU sampler (futransformer/cuda/sampling.h) against its CPU twin sample_with_uniform: exact token equality on
// seeded random logits, ties and masked tokens, and the host-side argument checks (these need no device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "futransformer/cuda/sampling.h"
#include "futransformer/sampling.h"
#include "gpu/gpu_test_util.h"

namespace futransformer {
namespace {

using test::DeviceBuffer;

struct Case {
  int rows, vocab;
  float temperature;
  int top_k;
  float top_p;
};

// Runs the GPU sampler on logits [rows, vocab] with draws u and returns its tokens (out poisoned to -1 first, so a
// row it never writes would read as a rejection and fail the comparison).
std::vector<int32_t> gpu_sample(const std::vector<float>& logits, const std::vector<double>& u, const Case& c) {
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<double> d_u(u);
  DeviceBuffer<int32_t> d_out(static_cast<size_t>(c.rows));
  const size_t ws_bytes = c.temperature == 0.0f ? 0 : cuda::sample_rows_f32_workspace_bytes(c.rows, c.vocab);
  if (c.temperature != 0.0f) EXPECT_GT(ws_bytes, 0u);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  EXPECT_EQ(ws.poison(), cudaSuccess);
  EXPECT_EQ(d_out.poison(), cudaSuccess);
  EXPECT_EQ(cuda::sample_rows_f32(d_logits.p, d_u.p, d_out.p, c.rows, c.vocab, c.temperature, c.top_k, c.top_p, ws.p,
                                  ws_bytes, nullptr),
            cudaSuccess)
      << cuda::sampling_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d_out.download();
}

void expect_same_tokens(const std::vector<float>& logits, const std::vector<double>& u, const Case& c,
                        const std::string& what) {
  SamplingParams sp;
  sp.temperature = c.temperature;
  sp.top_k = c.top_k;
  sp.top_p = c.top_p;
  const auto got = gpu_sample(logits, u, c);
  ASSERT_EQ(got.size(), static_cast<size_t>(c.rows));
  for (int r = 0; r < c.rows; ++r) {
    const std::span<const float> row(logits.data() + static_cast<size_t>(r) * c.vocab, static_cast<size_t>(c.vocab));
    EXPECT_EQ(got[r], sample_with_uniform(row, sp, u[r]))
        << what << ": row " << r << " of " << c.rows << ", vocab " << c.vocab << ", T " << c.temperature << ", top_k "
        << c.top_k << ", top_p " << c.top_p;
  }
}

std::vector<double> draws(std::mt19937_64& rng, int rows) {
  std::vector<double> u(static_cast<size_t>(rows));
  for (double& x : u) x = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return u;
}

TEST(GpuSampling, MatchesTheCpuSamplerTokenForToken) {
  FT_REQUIRE_CUDA_DEVICE();
  std::mt19937 lrng(2024);
  std::mt19937_64 urng(17);
  const int rows_for[] = {1, 3, 17, 32};
  int which = 0;
  for (int vocab : {7, 1000, 49152, 128256}) {
    for (float t : {0.0f, 0.3f, 0.8f, 1.5f}) {
      for (int k : {0, 1, 40}) {
        for (float p : {1.0f, 0.95f, 0.5f}) {
          const Case c{rows_for[which++ % 4], vocab, t, k, p};
          // Logit spread like a language model's (a few units), some rows much wider.
          std::normal_distribution<float> d(0.0f, which % 3 == 0 ? 12.0f : 2.5f);
          std::vector<float> logits(static_cast<size_t>(c.rows) * vocab);
          for (float& x : logits) x = d(lrng);
          expect_same_tokens(logits, draws(urng, c.rows), c, "random");
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(GpuSampling, TiesMaskedTokensAndExtremeDraws) {
  FT_REQUIRE_CUDA_DEVICE();
  std::mt19937 lrng(9);
  std::mt19937_64 urng(10);
  for (int vocab : {7, 1000, 128256}) {
    for (float t : {0.0f, 0.3f, 1.5f}) {
      for (int k : {0, 1, 40}) {
        for (float p : {1.0f, 0.5f}) {
          const Case c{8, vocab, t, k, p};
          std::uniform_int_distribution<int> level(-3, 3);  // few distinct values: many exact ties
          std::vector<float> logits(static_cast<size_t>(c.rows) * vocab);
          for (size_t i = 0; i < logits.size(); ++i) logits[i] = i % 5 == 1 ? -INFINITY : float(level(lrng));
          for (int i = 0; i < vocab; ++i) logits[static_cast<size_t>(7) * vocab + i] = 1.0f;  // one row all equal
          auto u = draws(urng, c.rows);
          u[0] = 0.0;
          u[1] = std::nextafter(1.0, 0.0);
          u[2] = 0.5;
          expect_same_tokens(logits, u, c, "ties");
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(GpuSampling, RowsTheCpuRejectsGiveMinusOne) {
  FT_REQUIRE_CUDA_DEVICE();
  const int vocab = 300;
  std::vector<float> logits(static_cast<size_t>(4) * vocab, 0.5f);
  logits[10] = NAN;                                                      // row 0: a NaN
  for (int i = 0; i < vocab; ++i) logits[static_cast<size_t>(vocab) + i] = -INFINITY;  // row 1: all masked
  logits[static_cast<size_t>(2) * vocab + 5] = INFINITY;                 // row 2: +inf
  const std::vector<double> u = {0.5, 0.5, 0.5, 1.0};                    // row 3: a draw outside [0, 1)
  EXPECT_EQ(gpu_sample(logits, u, {4, vocab, 1.0f, 0, 1.0f}), (std::vector<int32_t>{-1, -1, -1, -1}));
  // Greedy rejects only the NaN row; an all -inf row gives 0 and +inf is a maximum (futransformer::argmax).
  EXPECT_EQ(gpu_sample(logits, u, {4, vocab, 0.0f, 0, 1.0f}), (std::vector<int32_t>{-1, 0, 5, 0}));
}

TEST(GpuSamplingHost, RejectsBadSizesParametersAndPointers) {
  std::string why;
  auto rejected = [&](int rows, int vocab, float t, int k, float p, const char* want) {
    why.clear();
    EXPECT_EQ(cuda::sample_rows_f32_can_implement(rows, vocab, t, k, p, &why), cudaErrorInvalidValue) << want;
    EXPECT_NE(why.find(want), std::string::npos) << why;
  };
  rejected(0, 10, 1.0f, 0, 1.0f, "rows = 0");
  rejected(65536, 10, 1.0f, 0, 1.0f, "rows = 65536");
  rejected(1, 0, 1.0f, 0, 1.0f, "vocab = 0");
  rejected(32768, 65536, 1.0f, 0, 1.0f, "rows * vocab = 2147483648");
  rejected(1, 10, -1.0f, 0, 1.0f, "temperature");
  rejected(1, 10, NAN, 0, 1.0f, "temperature");
  rejected(1, 10, INFINITY, 0, 1.0f, "temperature");
  rejected(1, 10, 1.0f, -1, 1.0f, "top_k = -1");
  rejected(1, 10, 1.0f, 0, 0.0f, "top_p");
  rejected(1, 10, 1.0f, 0, 1.5f, "top_p");
  rejected(1, 10, 1.0f, 0, NAN, "top_p");
  EXPECT_EQ(cuda::sample_rows_f32_can_implement(65535, 32768, 0.7f, 40, 0.9f, &why), cudaSuccess);
  EXPECT_EQ(cuda::sample_rows_f32_workspace_bytes(0, 10), 0u);

  // Launcher checks run before any CUDA call: fake device pointers are never dereferenced.
  auto* f = reinterpret_cast<const float*>(uintptr_t{4096});
  auto* d = reinterpret_cast<const double*>(uintptr_t{4096});
  auto* o = reinterpret_cast<int32_t*>(uintptr_t{8192});
  auto launch_rejected = [&](cudaError_t e, const char* want) {
    EXPECT_EQ(e, cudaErrorInvalidValue) << want;
    EXPECT_NE(std::string(cuda::sampling_last_error()).find(want), std::string::npos) << cuda::sampling_last_error();
  };
  launch_rejected(cuda::sample_rows_f32(f, d, o, 0, 10, 1.0f, 0, 1.0f, nullptr, 0, nullptr), "rows = 0");
  launch_rejected(cuda::sample_rows_f32(nullptr, d, o, 1, 10, 1.0f, 0, 1.0f, nullptr, 0, nullptr), "non-null");
  launch_rejected(cuda::sample_rows_f32(f, nullptr, o, 1, 10, 1.0f, 0, 1.0f, nullptr, 0, nullptr), "uniforms");
  launch_rejected(cuda::sample_rows_f32(f, d, nullptr, 1, 10, 0.0f, 0, 1.0f, nullptr, 0, nullptr), "non-null");
  launch_rejected(cuda::sample_rows_f32(f + 1, d, reinterpret_cast<int32_t*>(uintptr_t{8193}), 1, 10, 0.0f, 0, 1.0f,
                                        nullptr, 0, nullptr),
                  "aligned");
}

TEST(GpuSampling, ShortWorkspaceIsRejected) {
  FT_REQUIRE_CUDA_DEVICE();
  const size_t need = cuda::sample_rows_f32_workspace_bytes(2, 1000);
  ASSERT_GT(need, 0u);
  DeviceBuffer<float> logits(2000);
  DeviceBuffer<double> u(2);
  DeviceBuffer<int32_t> out(2);
  DeviceBuffer<unsigned char> ws(need);
  EXPECT_EQ(cuda::sample_rows_f32(logits.p, u.p, out.p, 2, 1000, 1.0f, 0, 1.0f, ws.p, need - 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::sampling_last_error()).find("workspace"), std::string::npos);
}

}  // namespace
}  // namespace futransformer
