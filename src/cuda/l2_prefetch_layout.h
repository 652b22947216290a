// Which bytes the L2 prefetch kernel asks for: the ranges trimmed inward to 16-byte boundaries (the bulk prefetch's
// alignment; a range's partial first and last words are left out rather than reading past an allocation), cut into
// kL2PrefetchPieceBytes pieces, piece p of a range kept when p % period < keep. Pieces are numbered across the ranges
// in order; the kernel's threads take them grid-stride. Host and device share this, so the CPU tests check the
// pieces the kernel issues.
#pragma once

#include <cstdint>

#include "futransformer/cuda/l2_prefetch.h"

#ifdef __CUDACC__
#define FT_L2P_HD __host__ __device__
#else
#define FT_L2P_HD
#endif

namespace futransformer::cuda::l2p {

struct Args {
  uint64_t begin[kL2PrefetchMaxRanges] = {};  // 16-byte aligned
  uint64_t bytes[kL2PrefetchMaxRanges] = {};  // a multiple of 16
  int period[kL2PrefetchMaxRanges] = {};
  int keep[kL2PrefetchMaxRanges] = {};
  int64_t first_piece[kL2PrefetchMaxRanges + 1] = {};  // range r holds pieces first_piece[r] .. first_piece[r + 1] - 1
  int n = 0;
  FT_L2P_HD int64_t pieces() const { return first_piece[n]; }
};

// The trimmed ranges (the caller validated them with l2_prefetch_can_implement).
inline Args make_args(std::span<const L2PrefetchRange> ranges) {
  Args a;
  a.n = static_cast<int>(ranges.size());
  for (int r = 0; r < a.n; ++r) {
    const uint64_t p = reinterpret_cast<uint64_t>(ranges[r].ptr);
    const uint64_t b = (p + 15) & ~uint64_t{15}, e = (p + ranges[r].bytes) & ~uint64_t{15};
    a.begin[r] = b;
    a.bytes[r] = e > b ? e - b : 0;
    a.period[r] = ranges[r].period;
    a.keep[r] = ranges[r].keep;
    a.first_piece[r + 1] = a.first_piece[r] + static_cast<int64_t>((a.bytes[r] + kL2PrefetchPieceBytes - 1) /
                                                                    kL2PrefetchPieceBytes);
  }
  return a;
}

struct Piece {
  uint64_t addr = 0;
  uint32_t bytes = 0;  // 0: not prefetched
};

// Piece i (0 <= i < a.pieces()).
FT_L2P_HD inline Piece piece(const Args& a, int64_t i) {
  int r = 0;
  while (r + 1 < a.n && i >= a.first_piece[r + 1]) ++r;
  const int64_t p = i - a.first_piece[r];
  Piece out;
  if (p % a.period[r] >= a.keep[r]) return out;
  const uint64_t off = static_cast<uint64_t>(p) * kL2PrefetchPieceBytes;
  out.addr = a.begin[r] + off;
  const uint64_t left = a.bytes[r] - off;
  out.bytes = static_cast<uint32_t>(left < kL2PrefetchPieceBytes ? left : kL2PrefetchPieceBytes);
  return out;
}

}  // namespace futransformer::cuda::l2p

#undef FT_L2P_HD
