// Generic paged decode attention: every index map and the split choice, as plain C++ shared by the kernel
// (src/cuda/attention_generic.cuh), its launcher and the CPU emulation test
// (tests/cpu/test_attention_generic_emulation.cpp), so the three cannot drift apart.
//
// A key or value row (formats::KvPageLayout::code_row_bytes) is cut into 16-byte chunks, the unit of one uint4
// load: 8 BF16 channels, or 32 INT4 channels = exactly one scale group (formats::kKvInt4Group), so a chunk needs
// one scale and one zero-point.
#pragma once

#include <cstdint>

#include "cuda/host_device.h"

namespace futransformer::cuda::attn_generic {

constexpr int kThreads = 128;
constexpr int kPageTokens = 64;                         // formats::kKvPageTokens
constexpr int kLanesPerToken = kThreads / kPageTokens;  // score phase: lanes 2t, 2t + 1 share token t
constexpr int kChunkBytes = 16;
constexpr int kMaxHeadDim = 512;
constexpr int kMaxSplits = 8;  // the portable thread-block cluster size
// CTAs per (sequence, query head): a long sequence alone on the GPU would otherwise stream through one SM, so
// it is split across up to a cluster's worth of CTAs; once batch · n_heads clusters already fill the machine
// (about two waves of an H200's 132 SMs), more splits only add empty CTAs. The split is by pages, so a sequence
// shorter than max_pages_per_seq leaves the later ranks without work.
constexpr int64_t kTargetCtas = 256;

template <bool kInt4>
struct Format {
  static constexpr int kChunkChannels = kInt4 ? 32 : 8;
  // The thread groups' partial outputs at the end: pv_groups(chunks) · head_dim floats with
  // head_dim = chunks · kChunkChannels, at most kThreads · kChunkChannels (checked on the host for every head_dim).
  static constexpr int kReduceFloats = kThreads * kChunkChannels;
};

// Where the regions of a page are (formats::kv_page_layout computes them on the host).
struct PageGeometry {
  int row_bytes;                      // code bytes per token
  int groups_per_token;               // INT4 scale groups per token (head_dim / 32); 0 for BF16
  int codes[2], scales[2], zeros[2];  // byte offsets in the page, [0] = K, [1] = V
};

FT_HD int splits_for(int batch, int n_heads, int max_pages_per_seq) {
  const int64_t heads = int64_t{batch} * n_heads;
  const int64_t want = (kTargetCtas + heads - 1) / heads;
  const int64_t cap = max_pages_per_seq < kMaxSplits ? max_pages_per_seq : kMaxSplits;
  return static_cast<int>(want < 1 ? 1 : want > cap ? cap : want);
}

// seq_lens[b] as the kernel uses it: clamped to the block table, a negative value is an empty sequence.
FT_HD int clamped_len(int seq_len, int max_pages_per_seq) {
  const int64_t cap = int64_t{max_pages_per_seq} * kPageTokens;
  return seq_len < 0 ? 0 : seq_len > cap ? static_cast<int>(cap) : seq_len;
}

// The pages [begin, end) of a sequence of n_pages that cluster rank `rank` of `splits` attends over:
// contiguous runs of ceil(n_pages / splits) pages in rank order (later ranks may get none).
struct PageRange {
  int begin, end;
};
FT_HD PageRange pages_of_rank(int n_pages, int splits, int rank) {
  const int per = (n_pages + splits - 1) / splits;
  const int64_t b = int64_t{rank} * per;
  const int begin = b < n_pages ? static_cast<int>(b) : n_pages;
  const int end = begin + per < n_pages ? begin + per : n_pages;
  return {begin, end};
}

// P·V phase: thread tid owns chunk tid % chunks of the tokens tid / chunks + i · groups of every page; threads
// with tid / chunks >= groups idle. More groups than the page's tokens would idle anyway.
FT_HD int pv_groups(int chunks) {
  const int g = kThreads / chunks;
  return g < kPageTokens ? g : kPageTokens;
}

// Byte offsets inside a page: the chunk of a token's row, and (INT4) its scale (fp16) and zero-point (u8).
FT_HD int chunk_offset(const PageGeometry& g, int part, int slot, int chunk) {
  return g.codes[part] + slot * g.row_bytes + chunk * kChunkBytes;
}
FT_HD int scale_offset(const PageGeometry& g, int part, int slot, int chunk) {
  return g.scales[part] + (slot * g.groups_per_token + chunk) * 2;
}
FT_HD int zero_offset(const PageGeometry& g, int part, int slot, int chunk) {
  return g.zeros[part] + slot * g.groups_per_token + chunk;
}

// The channels of one chunk (its four little-endian 32-bit words), decoded to fp32 exactly as
// formats::kv_decode_token does. BF16: word j holds channel 2j in its low half. INT4: byte j holds channel 2j in
// its low nibble, 2j + 1 in its high one; value = float(u − z) · s is exact in fp32 (a 5-bit integer times an
// 11-bit significand), so no rounding or contraction can differ from the CPU. BF16 ignores s and z.
template <bool kInt4>
FT_HD void decode_chunk_words(const uint32_t (&w)[4], float s, int z, float (&x)[Format<kInt4>::kChunkChannels]) {
  if constexpr (!kInt4) {
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = w[j] << 16, hi = w[j] & 0xffff0000u;
      __builtin_memcpy(&x[2 * j], &lo, 4);
      __builtin_memcpy(&x[2 * j + 1], &hi, 4);
    }
  } else {
    for (int j = 0; j < 16; ++j) {
      const uint32_t byte = (w[j / 4] >> (8 * (j % 4))) & 0xffu;
      x[2 * j] = static_cast<float>(static_cast<int>(byte & 0xfu) - z) * s;
      x[2 * j + 1] = static_cast<float>(static_cast<int>(byte >> 4) - z) * s;
    }
  }
}

}  // namespace futransformer::cuda::attn_generic
