// rotate_heads_bf16 (src/cuda/engine/engine_kernels.h) against its CPU twin, bit for bit: each head of each row
// widened to fp32, formats::hadamard_blocks with the same block (that function's stage order and final scale
// multiply), rounded once to BF16 (f32_to_bf16: round to nearest even). Every fp32 operation of the twin is a
// single IEEE operation, so the kernel must give the same bits. Shapes cover the three kernels: 16-byte lanes
// (head_dim 16 · 2^k up to 512, 16-byte aligned rows), the 32-channel register layout (other multiples of 32 up to
// 256, or rows not 16-byte aligned) and shared memory (head_dim 80, 1024),
// decode-sized and prefill-sized row counts (2048, 4097: a partial last CTA), a strided source (the fused q|k|v
// rows) and the in-place un-rotation of the attention output. Inputs are fresh seeded random BF16 values, the
// output buffer is NaN-poisoned before every launch and guarded past its end.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/engine/engine_kernels.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/hadamard.h"
#include "gpu_test_util.h"

namespace {

using namespace futransformer;

struct RotateCase {
  int rows, n_heads, head_dim, block, src_row_stride;  // src_row_stride 0: in place (stride = n_heads * head_dim)
};

// The twin: dst[r, h, :] = bf16(H_block · float(src[r * stride + h * head_dim + :])).
std::vector<uint16_t> twin(const std::vector<uint16_t>& src, const RotateCase& c, int stride) {
  std::vector<uint16_t> out(static_cast<size_t>(c.rows) * c.n_heads * c.head_dim);
  std::vector<float> v(static_cast<size_t>(c.head_dim));
  for (int r = 0; r < c.rows; ++r) {
    for (int h = 0; h < c.n_heads; ++h) {
      const uint16_t* s = &src[static_cast<size_t>(r) * stride + static_cast<size_t>(h) * c.head_dim];
      for (int j = 0; j < c.head_dim; ++j) v[j] = bf16_to_f32(s[j]);
      if (c.block > 1) formats::hadamard_blocks(v.data(), c.head_dim, c.block);
      uint16_t* d = &out[(static_cast<size_t>(r) * c.n_heads + h) * c.head_dim];
      for (int j = 0; j < c.head_dim; ++j) d[j] = f32_to_bf16(v[j]);
    }
  }
  return out;
}

void check_case(const RotateCase& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << c.rows << " heads " << c.n_heads << " head_dim " << c.head_dim
                                  << " block " << c.block << " stride " << c.src_row_stride);
  const bool in_place = c.src_row_stride == 0;
  const int width = c.n_heads * c.head_dim;
  const int stride = in_place ? width : c.src_row_stride;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<uint16_t> src(static_cast<size_t>(c.rows) * stride);
  for (uint16_t& b : src) b = f32_to_bf16(dist(rng));
  const std::vector<uint16_t> want = twin(src, c, stride);

  const size_t n = want.size(), guard = 64;
  test::DeviceBuffer<uint16_t> d_src(src.size() + guard);
  ASSERT_EQ(d_src.poison(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_src.p, src.data(), src.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  test::DeviceBuffer<uint16_t> d_dst(n + guard);
  ASSERT_EQ(d_dst.poison(), cudaSuccess);
  uint16_t* dst = in_place ? d_src.p : d_dst.p;
  ASSERT_EQ(cuda::rotate_heads_bf16(reinterpret_cast<const __nv_bfloat16*>(d_src.p), stride,
                                    reinterpret_cast<__nv_bfloat16*>(dst), c.rows, c.n_heads, c.head_dim, c.block,
                                    nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = in_place ? d_src.download() : d_dst.download();
  size_t bad = 0, first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      if (bad++ == 0) first_bad = i;
    }
  }
  EXPECT_EQ(bad, 0u) << "first mismatch at element " << first_bad << " (row " << first_bad / width << ")";
  for (size_t i = n; i < n + guard; ++i) ASSERT_EQ(got[i], 0xFFFFu) << "wrote past the last row at " << i;
}

TEST(RotateHeadsBf16, BitExactAgainstCpuHadamard) {
  FT_REQUIRE_CUDA_DEVICE();
  const RotateCase cases[] = {
      // Llama shapes: the query gather from q|k|v rows (32 q + 2 x 8 KV heads) and the in-place un-rotation.
      {1, 32, 128, 128, 48 * 128},
      {3, 32, 128, 128, 0},
      {17, 32, 128, 128, 48 * 128},
      {2048, 32, 128, 128, 0},
      {2048, 32, 128, 128, 48 * 128},
      {4097, 8, 128, 128, 0},  // items not a multiple of a CTA's heads
      // Smaller blocks (lane strides only), a block of 1 and 0 (copies), odd head counts.
      {64, 5, 128, 32, 0},
      {64, 3, 128, 16, 7 * 128},
      {33, 7, 64, 64, 0},
      {33, 7, 96, 32, 7 * 96 + 8},
      {9, 3, 128, 1, 0},
      {9, 3, 128, 0, 5 * 128},
      {65, 3, 256, 128, 0},  // 8 registers per lane
      {65, 3, 256, 256, 3 * 256 + 32},
      {5, 1, 32, 2, 0},
      {5, 2, 512, 128, 0},  // 32 lanes per head
      {7, 3, 16, 16, 0},    // 1 lane per head: register strides only
      {7, 3, 16, 8, 3 * 16 + 8},
      // The 32-channel register kernel: rows not on 16-byte boundaries, head_dim 160 (10 lanes of 16).
      {33, 5, 128, 128, 5 * 128 + 2},
      {2048, 4, 128, 128, 4 * 128 + 2},
      {9, 3, 160, 32, 0},
      // The shared-memory kernel: head_dim not a multiple of 32, or past 8 registers per lane.
      {17, 5, 80, 16, 0},
      {2048, 2, 80, 16, 2 * 80 + 16},
      {3, 2, 1024, 128, 0},
  };
  uint32_t seed = 1;
  for (const RotateCase& c : cases) check_case(c, ++seed);
}

TEST(RotateHeadsBf16Host, RefusesBadArgumentsBeforeAnyLaunch) {
  auto* src = reinterpret_cast<const __nv_bfloat16*>(uintptr_t{256});
  auto* dst = reinterpret_cast<__nv_bfloat16*>(uintptr_t{512});
  EXPECT_EQ(cuda::rotate_heads_bf16(nullptr, 128, dst, 1, 1, 128, 128, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::rotate_heads_bf16(src, 128, nullptr, 1, 1, 128, 128, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::rotate_heads_bf16(src, 127, dst, 1, 1, 128, 128, nullptr), cudaErrorInvalidValue);  // stride
  EXPECT_EQ(cuda::rotate_heads_bf16(src, 128, dst, 1, 1, 127, 1, nullptr), cudaErrorInvalidValue);    // odd head
  EXPECT_EQ(cuda::rotate_heads_bf16(src, 96, dst, 1, 1, 96, 64, nullptr), cudaErrorInvalidValue);    // block
  EXPECT_EQ(cuda::rotate_heads_bf16(src, 2048, dst, 1, 1, 2048, 1, nullptr), cudaErrorInvalidValue);  // > 1024
  // In place needs contiguous rows.
  EXPECT_EQ(cuda::rotate_heads_bf16(src, 256, const_cast<__nv_bfloat16*>(src), 2, 1, 128, 128, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::rotate_heads_bf16(src, 128, dst, 0, 1, 128, 128, nullptr), cudaSuccess);  // no rows: no launch
}

}  // namespace
