// cuda::l2_prefetch: rejected ranges get a message (no device needed); on the GPU the kernel runs on ranges of any
// alignment and share, inside and outside a CUDA graph, and leaves every byte as it was (it only reads).
#include "futransformer/cuda/l2_prefetch.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace {

namespace cuda = futransformer::cuda;
using futransformer::test::DeviceBuffer;

TEST(L2Prefetch, RejectsBadRanges) {
  std::string why;
  std::vector<cuda::L2PrefetchRange> five(5, cuda::L2PrefetchRange{&why, 16, 1, 1});
  EXPECT_EQ(cuda::l2_prefetch_can_implement(five, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("at most 4 ranges"), std::string::npos) << why;
  const cuda::L2PrefetchRange null_range{nullptr, 64, 1, 1};
  EXPECT_EQ(cuda::l2_prefetch(std::span(&null_range, 1), nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::l2_prefetch_last_error()).find("range 0 has 64 bytes at null"), std::string::npos)
      << cuda::l2_prefetch_last_error();
  const cuda::L2PrefetchRange bad_keep{&why, 64, 4, 5};
  EXPECT_EQ(cuda::l2_prefetch_can_implement(std::span(&bad_keep, 1), &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("keep <= period"), std::string::npos) << why;
  const cuda::L2PrefetchRange bad_period{&why, 64, 0, 0};
  EXPECT_EQ(cuda::l2_prefetch_can_implement(std::span(&bad_period, 1), &why), cudaErrorInvalidValue);
  const cuda::L2PrefetchRange empty{nullptr, 0, 1, 1};
  EXPECT_EQ(cuda::l2_prefetch_can_implement(std::span(&empty, 1), &why), cudaSuccess) << "an empty range is fine";
}

TEST(L2Prefetch, ReadsOnlyAndRunsInAGraph) {
  FT_REQUIRE_HOPPER();
  constexpr size_t kBytes = 3 * 1024 * 1024 + 77;
  std::mt19937 rng(3);
  std::vector<uint8_t> host(kBytes);
  for (uint8_t& b : host) b = static_cast<uint8_t>(rng());
  DeviceBuffer<uint8_t> buf(host);
  const uint8_t* p = buf.p;
  const cuda::L2PrefetchRange ranges[4] = {{p + 3, 1000003, 1, 1},
                                           {p + 1000100, 7, 1, 1},  // trims to nothing
                                           {p + 1000200, 1500000, 8, 3},
                                           {p + 2600000, kBytes - 2600000, 5, 5}};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  EXPECT_EQ(cuda::l2_prefetch(ranges, stream), cudaSuccess) << cuda::l2_prefetch_last_error();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cuda::l2_prefetch(ranges, stream), cudaSuccess) << cuda::l2_prefetch_last_error();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_EQ(buf.download(), host) << "the prefetch changed memory";
}

}  // namespace
