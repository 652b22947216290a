// The pieces the L2 prefetch kernel issues (cuda/l2_prefetch_layout.h, shared with the kernel): ranges trimmed inward
// to 16-byte boundaries, cut into 4 KB pieces, `keep` of every `period` kept, every kept byte inside its range and
// every byte of a fully kept trimmed range covered exactly once.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/l2_prefetch_layout.h"

namespace {

using futransformer::cuda::kL2PrefetchPieceBytes;
using futransformer::cuda::L2PrefetchRange;
namespace l2p = futransformer::cuda::l2p;

const void* at(uint64_t a) { return reinterpret_cast<const void*>(a); }

TEST(L2PrefetchLayout, PiecesTileTheTrimmedRanges) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::vector<L2PrefetchRange> ranges;
    uint64_t base = 0x7f0000000000ull + (rng() % 4096) * 64;
    for (int r = 0; r < n; ++r) {
      L2PrefetchRange x;
      const uint64_t start = base + rng() % 64;  // any alignment
      x.ptr = at(start);
      x.bytes = rng() % 5 == 0 ? rng() % 40 : rng() % (9 * kL2PrefetchPieceBytes);
      x.period = 1 + static_cast<int>(rng() % 8);
      x.keep = static_cast<int>(rng() % (x.period + 1));
      ranges.push_back(x);
      base = start + x.bytes + 4096 + rng() % 1000;  // ranges do not overlap
    }
    const l2p::Args a = l2p::make_args(ranges);
    ASSERT_EQ(a.n, n);
    for (int r = 0; r < n; ++r) {
      const uint64_t p = reinterpret_cast<uint64_t>(ranges[r].ptr);
      const uint64_t lo = (p + 15) / 16 * 16, hi = (p + ranges[r].bytes) / 16 * 16;
      const uint64_t want = hi > lo ? hi - lo : 0;
      EXPECT_EQ(a.bytes[r], want) << "range " << r;
      if (want == 0) {
        EXPECT_EQ(a.first_piece[r + 1], a.first_piece[r]);
        continue;
      }
      EXPECT_EQ(a.begin[r], lo);
      // Walk this range's pieces: kept ones tile [lo, hi) in order where kept, 16-byte aligned, at most 4 KB.
      uint64_t next = lo;
      int64_t kept = 0;
      for (int64_t i = a.first_piece[r]; i < a.first_piece[r + 1]; ++i) {
        const int64_t local = i - a.first_piece[r];
        const l2p::Piece pc = l2p::piece(a, i);
        const bool keep = local % ranges[r].period < ranges[r].keep;
        const uint64_t expect_addr = lo + static_cast<uint64_t>(local) * kL2PrefetchPieceBytes;
        ASSERT_LE(expect_addr, hi);
        const uint64_t expect_bytes = std::min<uint64_t>(kL2PrefetchPieceBytes, hi - expect_addr);
        if (!keep) {
          EXPECT_EQ(pc.bytes, 0u) << "piece " << local << " of range " << r << " is not kept";
        } else {
          ++kept;
          EXPECT_EQ(pc.addr, expect_addr);
          EXPECT_EQ(pc.bytes, expect_bytes);
          EXPECT_EQ(pc.addr % 16, 0u);
          EXPECT_EQ(pc.bytes % 16, 0u);
          EXPECT_GT(pc.bytes, 0u);
          EXPECT_GE(pc.addr, lo);
          EXPECT_LE(pc.addr + pc.bytes, hi);
        }
        next = expect_addr + expect_bytes;
      }
      EXPECT_EQ(next, hi) << "the pieces of range " << r << " end where it does";
      if (ranges[r].keep == ranges[r].period)
        EXPECT_EQ(kept, a.first_piece[r + 1] - a.first_piece[r]) << "a fully kept range keeps every piece";
    }
  }
}

TEST(L2PrefetchLayout, KeepsTheStatedShareEvenly) {
  // 40 pieces, 3 of every 8: pieces 0,1,2, 8,9,10, ... — 15 in all, never two gaps of more than 5 in a row.
  const L2PrefetchRange r{at(0x10000), 40ull * kL2PrefetchPieceBytes, 8, 3};
  const l2p::Args a = l2p::make_args(std::span(&r, 1));
  ASSERT_EQ(a.pieces(), 40);
  std::vector<int> kept;
  for (int i = 0; i < 40; ++i)
    if (l2p::piece(a, i).bytes != 0) kept.push_back(i);
  ASSERT_EQ(kept.size(), 15u);
  for (size_t k = 0; k < kept.size(); ++k) EXPECT_EQ(kept[k], static_cast<int>(k / 3 * 8 + k % 3));
}

}  // namespace
