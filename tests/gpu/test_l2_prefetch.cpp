// l2_prefetch_stripes (futransformer/cuda/l2_prefetch.h): the lines the kernel prefetches are exactly the host
// twin's selection (through the test-only mark buffer: poisoned to 0xFF, cleared to 0, then 1 per prefetched line),
// for periods and tails that do and do not divide the line count; the data under a prefetch is unchanged; bad
// arguments are rejected with a message naming the parameter. The L2Prefetch*Host tests need no device.
#include "futransformer/cuda/l2_prefetch.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace {

using futransformer::test::DeviceBuffer;
namespace cu = futransformer::cuda;

struct Case {
  int64_t bytes;
  int keep, period;
  int max_blocks = 0;  // 0: the default grid
  int threads = 0;     // 0: 256 per CTA
};

TEST(L2PrefetchGpu, PrefetchesExactlyTheStripe) {
  FT_REQUIRE_CUDA_DEVICE();
  const Case cases[] = {{128 * 1000, 5, 16}, {128 * 999 + 17, 8, 16}, {128 * 4096, 16, 16}, {128 * 3, 1, 7},
                        {128 * 70000 + 1, 3, 11}, {1, 1, 1}, {128 * 70000, 8, 16, 1}, {128 * 50000 + 5, 5, 16, 7},
                        {128 * 30000 + 3, 6, 16, 4, 32}, {128 * 20000, 16, 16, 0, 96}};
  for (const Case& c : cases) {
    SCOPED_TRACE("bytes " + std::to_string(c.bytes) + " keep " + std::to_string(c.keep) + " period " +
                 std::to_string(c.period) + " max_blocks " + std::to_string(c.max_blocks) + " threads " + std::to_string(c.threads));
    const int64_t lines = (c.bytes + cu::kL2LineBytes - 1) / cu::kL2LineBytes;
    std::mt19937 rng(static_cast<uint32_t>(c.bytes + c.keep));
    std::vector<uint8_t> data(static_cast<size_t>(lines) * cu::kL2LineBytes);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    DeviceBuffer<uint8_t> d_data(data);
    DeviceBuffer<uint8_t> mark(static_cast<size_t>(lines) + 64);  // 64 guard entries past the last line
    ASSERT_EQ(mark.poison(), cudaSuccess);
    ASSERT_EQ(cudaMemset(mark.p, 0, static_cast<size_t>(lines)), cudaSuccess);
    ASSERT_EQ(cu::l2_prefetch_stripes(d_data.p, c.bytes, c.keep, c.period, nullptr, mark.p, c.max_blocks, c.threads), cudaSuccess)
        << cu::l2_prefetch_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> got = mark.download();
    int64_t wrong = 0, selected = 0;
    for (int64_t i = 0; i < lines; ++i) {
      const bool want = cu::l2_prefetch_line_selected(i, c.keep, c.period);
      selected += want;
      wrong += got[static_cast<size_t>(i)] != (want ? 1 : 0);
    }
    EXPECT_EQ(wrong, 0) << "lines marked against the twin's selection (" << selected << " of " << lines << ")";
    EXPECT_GT(selected, 0);
    for (size_t i = static_cast<size_t>(lines); i < got.size(); ++i) ASSERT_EQ(got[i], 0xFF) << "guard entry " << i;
    EXPECT_EQ(d_data.download(), data) << "a prefetch changed the data";
  }
}

TEST(L2PrefetchGpu, WithoutMarkRunsInAStream) {
  FT_REQUIRE_CUDA_DEVICE();
  DeviceBuffer<uint8_t> d(1 << 20);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  EXPECT_EQ(cu::l2_prefetch_stripes(d.p, 1 << 20, 6, 16, s), cudaSuccess) << cu::l2_prefetch_last_error();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

// Rejections happen before any device call, so they run without a GPU.
TEST(L2PrefetchHost, RejectsBadArguments) {
  alignas(256) static char buf[1024];
  const auto expect = [](cudaError_t e, const std::string& needle) {
    EXPECT_EQ(e, cudaErrorInvalidValue);
    EXPECT_NE(std::string(cu::l2_prefetch_last_error()).find(needle), std::string::npos)
        << cu::l2_prefetch_last_error();
  };
  expect(cu::l2_prefetch_stripes(buf, -1, 1, 2, nullptr), "bytes must be >= 0");
  expect(cu::l2_prefetch_stripes(buf, 1024, 1, 0, nullptr), "period must be in [1, ");
  expect(cu::l2_prefetch_stripes(buf, 1024, 1, cu::kL2PrefetchMaxPeriod + 1, nullptr), "period must be in [1, ");
  expect(cu::l2_prefetch_stripes(buf, 1024, 3, 2, nullptr), "keep must be in [0, period = 2]");
  expect(cu::l2_prefetch_stripes(buf, 1024, -1, 2, nullptr), "keep must be in [0, period = 2]");
  expect(cu::l2_prefetch_stripes(buf, 1024, 1, 2, nullptr, nullptr, -1), "max_blocks must be in [0, 264]");
  expect(cu::l2_prefetch_stripes(buf, 1024, 1, 2, nullptr, nullptr, cu::kL2PrefetchMaxBlocks + 1),
         "max_blocks must be in [0, 264]");
  expect(cu::l2_prefetch_stripes(buf, 1024, 1, 2, nullptr, nullptr, 0, 48), "threads must be 0 or a multiple of 32");
  expect(cu::l2_prefetch_stripes(buf, 1024, 1, 2, nullptr, nullptr, 0, 512), "threads must be 0 or a multiple of 32");
  expect(cu::l2_prefetch_stripes(nullptr, 1024, 1, 2, nullptr), "128-byte aligned");
  expect(cu::l2_prefetch_stripes(buf + 64, 1024, 1, 2, nullptr), "128-byte aligned");
  // Nothing to do is not an error (and touches no pointer).
  EXPECT_EQ(cu::l2_prefetch_stripes(nullptr, 0, 1, 2, nullptr), cudaSuccess);
  EXPECT_EQ(cu::l2_prefetch_stripes(nullptr, 1024, 0, 2, nullptr), cudaSuccess);
}

TEST(L2PrefetchHost, StripeSelection) {
  int kept = 0;
  for (int64_t i = 0; i < 160; ++i) kept += cu::l2_prefetch_line_selected(i, 6, 16);
  EXPECT_EQ(kept, 60);
  EXPECT_TRUE(cu::l2_prefetch_line_selected(16, 6, 16));
  EXPECT_TRUE(cu::l2_prefetch_line_selected(21, 6, 16));
  EXPECT_FALSE(cu::l2_prefetch_line_selected(22, 6, 16));
  EXPECT_FALSE(cu::l2_prefetch_line_selected(31, 6, 16));
}

}  // namespace
