// Shared pieces of the GPU tests of the qkv GEMM + attention prologue launchers (test_gemm_w4a16_qkv.cpp,
// test_gemm_w4a16_norm.cpp): a bit-for-bit comparison that names the first differing element, the per-row metadata
// of one case (positions, page cells, anchors) and the poisoned outputs of one side.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "gpu_test_util.h"
#include "ref/ops.h"

namespace futransformer::test {

// Index of the first element whose bytes differ (0 when the sizes differ), -1 when all are equal.
template <typename T>
int64_t first_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace futransformer::test

// Bitwise comparison of two host vectors that prints the first difference, not both arrays.
#define EXPECT_SAME_BITS(got, want, what)                                                                  \
  do {                                                                                                     \
    const int64_t at_ = ::futransformer::test::first_mismatch(got, want);                                  \
    EXPECT_EQ(at_, -1) << (what) << " differs first at element " << at_ << " (of " << (got).size() << ")"; \
  } while (0)

namespace futransformer::test {

struct QkvShape {
  int n_heads, n_kv, head_dim;
};

constexpr int kQkvCaseAnchors = 3;  // key-anchor entries of a case's anchor table

// Host metadata of one case: positions (row 0 at 0, the rest uniform below max_position), distinct random (page,
// slot) cells with every 5th row from row 4 a padding row (page -1), an anchor index per row (-1 for every 4th from
// row 2) into kQkvCaseAnchors fp16 anchors per KV head, and the RoPE frequencies. Draws from rng in that order.
struct QkvCaseMeta {
  std::vector<int32_t> positions, page, slot, anchor;
  std::vector<float> inv_freq;
  std::vector<uint16_t> anchors;
  int n_pages = 0;
};

inline QkvCaseMeta make_qkv_case_meta(const QkvShape& s, int M, std::mt19937& rng, int max_position,
                                      double rope_theta) {
  constexpr int kPageTokens = static_cast<int>(formats::kKvPageTokens);
  QkvCaseMeta in;
  std::uniform_int_distribution<int> pos(0, max_position - 1);
  for (int r = 0; r < M; ++r) in.positions.push_back(r == 0 ? 0 : pos(rng));
  in.inv_freq = ref::rope_inv_freq(s.head_dim, rope_theta, RopeScaling{});
  in.n_pages = (M + kPageTokens - 1) / kPageTokens + 2;
  std::vector<int32_t> cells(static_cast<size_t>(in.n_pages) * kPageTokens);
  std::iota(cells.begin(), cells.end(), 0);
  std::shuffle(cells.begin(), cells.end(), rng);
  for (int r = 0; r < M; ++r) {
    const int32_t cell = cells[static_cast<size_t>(r)];
    in.page.push_back(r % 5 == 4 ? -1 : cell / kPageTokens);
    in.slot.push_back(cell % kPageTokens);
    in.anchor.push_back(r % 4 == 2 ? -1 : static_cast<int32_t>(rng() % kQkvCaseAnchors));
  }
  std::normal_distribution<float> nd(0.0f, 0.3f);
  in.anchors.resize(static_cast<size_t>(kQkvCaseAnchors) * s.n_kv * s.head_dim);
  for (uint16_t& a : in.anchors) a = f32_to_f16(nd(rng));
  return in;
}

// One side's outputs (qkv, q_out, the page pool, the split-K workspace), poisoned.
struct QkvCaseOutputs {
  DeviceBuffer<uint16_t> qkv, q_out;
  DeviceBuffer<uint8_t> pool, ws;
  QkvCaseOutputs(size_t qkv_elems, size_t q_elems, size_t pool_bytes, size_t ws_bytes)
      : qkv(qkv_elems), q_out(q_elems), pool(pool_bytes), ws(ws_bytes) {
    EXPECT_EQ(qkv.poison(), cudaSuccess);
    EXPECT_EQ(q_out.poison(), cudaSuccess);
    EXPECT_EQ(pool.poison(), cudaSuccess);
    EXPECT_EQ(ws.poison(), cudaSuccess);
  }
};

}  // namespace futransformer::test
