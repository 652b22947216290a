// GPU tests of the FP8 GEMM's residual epilogue (cuda::gemm_fp8_residual): residual += float(bf16(D)) in place must
// be bit-identical to gemm_fp8 into a BF16 buffer followed by add_residual_bf16 — the two kernels the engine ran
// before — on the same device and inputs. Shapes cover both tile widths the heuristic picks (128 and 192 columns),
// row and column tails, and one-row calls. SKIPPED without an sm_90 device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/gemm_fp8.h"
#include "gpu_test_util.h"

namespace {

using namespace futransformer;
using test::DeviceBuffer;

struct Shape {
  int M, N, K;
};

std::vector<uint8_t> random_codes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
  }
  for (uint8_t& c : v) {
    c &= 0xBF;  // exponent field <= 7: |code| <= 1.875, sums of thousands of products stay far from overflow
    if ((c & 0x7F) == 0x7F) c ^= 1;  // 0x7F / 0xFF are NaN
  }
  return v;
}

// residual_offset: floats the fused call's residual starts past a 256-byte aligned allocation (2: 8-byte aligned
// only, which keeps the 128-column tiles on gemm_fp8_kernel's own epilogue instead of the warp-specialised one).
void check_shape(const Shape& s, uint32_t seed, int residual_offset = 0) {
  SCOPED_TRACE(testing::Message() << "M " << s.M << " N " << s.N << " K " << s.K << " residual offset "
                                  << residual_offset);
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> a = random_codes(static_cast<size_t>(s.M) * s.K, rng);
  const std::vector<uint8_t> b = random_codes(static_cast<size_t>(s.N) * s.K, rng);
  std::mt19937 srng(seed);
  std::uniform_real_distribution<float> scale(0x1p-8f, 0x1p-4f);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<float> sa(static_cast<size_t>(s.M)), sb(static_cast<size_t>(s.N));
  for (float& v : sa) v = scale(srng);
  for (float& v : sb) v = scale(srng);
  std::vector<float> x(static_cast<size_t>(s.M) * s.N);
  for (float& v : x) v = nd(srng);

  DeviceBuffer<uint8_t> da(a), db(b);
  std::vector<float> x_padded(static_cast<size_t>(residual_offset), 0.0f);
  x_padded.insert(x_padded.end(), x.begin(), x.end());
  DeviceBuffer<float> dsa(sa), dsb(sb), want(x), got_buffer(x_padded);
  float* got_p = got_buffer.p + residual_offset;
  DeviceBuffer<uint16_t> d(static_cast<size_t>(s.M) * s.N);
  ASSERT_EQ(d.poison(), cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8(da.p, db.p, dsa.p, dsb.p, reinterpret_cast<__nv_bfloat16*>(d.p), s.M, s.N, s.K, nullptr),
            cudaSuccess)
      << cuda::gemm_fp8_last_error();
  ASSERT_EQ(cuda::add_residual_bf16(want.p, reinterpret_cast<const __nv_bfloat16*>(d.p), s.M, s.N, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::gemm_fp8_residual(da.p, db.p, dsa.p, dsb.p, got_p, s.M, s.N, s.K, nullptr), cudaSuccess)
      << cuda::gemm_fp8_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> w = want.download();
  std::vector<float> g = got_buffer.download();
  g.erase(g.begin(), g.begin() + residual_offset);
  size_t changed = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t wb, gb;
    std::memcpy(&wb, &w[i], 4);
    std::memcpy(&gb, &g[i], 4);
    ASSERT_EQ(gb, wb) << "row " << i / static_cast<size_t>(s.N) << " column " << i % static_cast<size_t>(s.N)
                      << ": fused " << g[i] << ", GEMM + add " << w[i];
    changed += w[i] != x[i];
  }
  // The GEMM must have contributed: most elements moved (a zero product leaves an element unchanged).
  EXPECT_GT(changed, w.size() / 2);
}

TEST(GemmFp8ResidualGpu, BitIdenticalToGemmThenResidualAdd) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 900;
  const Shape shapes[] = {{1, 8, 128},       {3, 136, 256},      {130, 200, 16},     {257, 4096, 4096},
                          {512, 6144, 4096}, {2049, 4096, 1040}, {640, 4104, 14336}};
  for (const Shape& s : shapes) check_shape(s, seed += 7);
  // An only 8-byte aligned residual takes the other epilogue at 128-column tiles: the same bits.
  for (const Shape& s : {Shape{257, 4096, 4096}, Shape{130, 200, 16}}) check_shape(s, seed += 7, 2);
}

TEST(GemmFp8ResidualHost, RejectsBadResidualPointers) {
  // Host checks run before any device query: a null or misaligned residual is refused with a message.
  float* misaligned = reinterpret_cast<float*>(uintptr_t{0x1004});
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(uintptr_t{0x1000});
  const float* scales = reinterpret_cast<const float*>(uintptr_t{0x1000});
  EXPECT_EQ(cuda::gemm_fp8_residual(codes, codes, scales, scales, nullptr, 4, 8, 128, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_fp8_last_error()).find("residual"), std::string::npos);
  EXPECT_EQ(cuda::gemm_fp8_residual(codes, codes, scales, scales, misaligned, 4, 8, 128, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_fp8_last_error()).find("8-byte"), std::string::npos);
  EXPECT_EQ(cuda::gemm_fp8_residual(codes, codes, scales, scales, misaligned, 4, 12, 128, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::gemm_fp8_last_error()).find("N = 12"), std::string::npos);
}

}  // namespace
