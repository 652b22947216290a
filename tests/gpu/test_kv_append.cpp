// GPU tests of the KV-cache append and the int4-hadamard key anchor (include/futransformer/cuda/kv_append.h)
// against their CPU twins formats::kv_encode_token and formats::kv_key_anchor: byte for byte over the whole
// 0xFF-poisoned page pool (written bytes equal, every other byte still 0xFF), anchors bit for bit. Plus host-only
// checks of the argument contract. Device tests report SKIPPED without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "futransformer/cuda/kv_append.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/kv_cache.h"
#include "gpu_test_util.h"

namespace {

using namespace futransformer;
using formats::KvFormat;
using formats::KvPart;
using test::DeviceBuffer;

constexpr KvFormat kAllFormats[] = {KvFormat::BF16, KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD};
constexpr int kPageTokens = static_cast<int>(formats::kKvPageTokens);
constexpr float kOutlierGain = 30.0f;  // outlier channels: N(0,1) x 30, half of them around a consistent offset
constexpr int kAnchors = 3;            // anchor vectors per KV head in the append tests

// BF16 rows shaped like a fused QKV projection output: [Q (2 n_kv heads) | K (n_kv) | V (n_kv) | 8 spare].
struct Qkv {
  int rows = 0, n_kv = 0, head_dim = 0, row_stride = 0, k_offset = 0, v_offset = 0;
  std::vector<uint16_t> bits;  // [rows][row_stride]

  uint16_t& at(int r, int offset, int h, int j) {
    return bits[static_cast<size_t>(r) * row_stride + offset + static_cast<size_t>(h) * head_dim + j];
  }
  // One head vector widened to fp32 (exact), as the engine would hand it to kv_encode_token.
  std::vector<float> head(int r, int offset, int h) const {
    std::vector<float> x(static_cast<size_t>(head_dim));
    for (int j = 0; j < head_dim; ++j)
      x[static_cast<size_t>(j)] =
          bf16_to_f32(bits[static_cast<size_t>(r) * row_stride + offset + static_cast<size_t>(h) * head_dim + j]);
    return x;
  }
};

// Random N(0,1) rows with outlier channels; every 7th row (from row 3) has an all-zero K of head 0 and V of the
// last head, which exercises the unit-scale rules (int4 s == 0, fp8 amax == 0).
Qkv make_qkv(int rows, int n_kv, int head_dim, uint32_t seed) {
  Qkv q;
  q.rows = rows;
  q.n_kv = n_kv;
  q.head_dim = head_dim;
  q.k_offset = 2 * n_kv * head_dim;
  q.v_offset = 3 * n_kv * head_dim;
  q.row_stride = 4 * n_kv * head_dim + 8;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  q.bits.resize(static_cast<size_t>(rows) * q.row_stride);
  for (uint16_t& b : q.bits) b = f32_to_bf16(nd(rng));
  const int outliers[] = {3, head_dim / 2 + 1, head_dim - 5};
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < n_kv; ++h) {
      // K: two channels around a consistent offset (what the anchor removes), one zero-mean; V: one zero-mean.
      q.at(r, q.k_offset, h, outliers[0]) = f32_to_bf16(kOutlierGain * (nd(rng) * 0.2f + 2.0f));
      q.at(r, q.k_offset, h, outliers[1]) = f32_to_bf16(-kOutlierGain * (nd(rng) * 0.2f + 1.5f));
      q.at(r, q.k_offset, h, outliers[2]) = f32_to_bf16(kOutlierGain * nd(rng));
      q.at(r, q.v_offset, h, outliers[1]) = f32_to_bf16(kOutlierGain * nd(rng));
    }
    if (r % 7 == 3) {
      for (int j = 0; j < head_dim; ++j) {
        q.at(r, q.k_offset, 0, j) = 0;
        q.at(r, q.v_offset, n_kv - 1, j) = 0x8000;  // -0: the sign of zero must not leak into codes or scales
      }
    }
  }
  return q;
}

// Where each row goes: distinct random (page, slot) pairs; every 9th row (from row 4) is padding (page -1).
struct Placement {
  int n_pages = 0;
  std::vector<int32_t> page, slot, anchor;
};

Placement make_placement(int rows, uint32_t seed) {
  Placement p;
  p.n_pages = (rows + kPageTokens - 1) / kPageTokens + 2;
  std::mt19937 rng(seed);
  std::vector<int32_t> cells(static_cast<size_t>(p.n_pages) * kPageTokens);
  std::iota(cells.begin(), cells.end(), 0);
  std::shuffle(cells.begin(), cells.end(), rng);
  for (int r = 0; r < rows; ++r) {
    const bool padding = r % 9 == 4;
    p.page.push_back(padding ? -1 : cells[static_cast<size_t>(r)] / kPageTokens);
    p.slot.push_back(cells[static_cast<size_t>(r)] % kPageTokens);
    p.anchor.push_back(r % 4 == 2 ? -1 : static_cast<int32_t>(rng() % kAnchors));  // -1: no anchor
  }
  return p;
}

size_t pool_bytes(const formats::KvPageLayout& L, int n_pages, int n_kv) {
  return static_cast<size_t>(n_pages) * n_kv * static_cast<size_t>(L.page_bytes);
}

// The CPU twin: kv_encode_token of every row into a 0xFF pool.
std::vector<uint8_t> cpu_append(KvFormat f, const Qkv& q, const Placement& p, const std::vector<uint16_t>& anchors) {
  const formats::KvPageLayout L = formats::kv_page_layout(f, q.head_dim);
  std::vector<uint8_t> pool(pool_bytes(L, p.n_pages, q.n_kv), 0xFF);
  for (int r = 0; r < q.rows; ++r) {
    if (p.page[static_cast<size_t>(r)] < 0) continue;
    for (int h = 0; h < q.n_kv; ++h) {
      uint8_t* page = pool.data() + (static_cast<size_t>(p.page[static_cast<size_t>(r)]) * q.n_kv + h) * L.page_bytes;
      std::span<const uint16_t> anchor;
      if (f == KvFormat::INT4_HADAMARD && p.anchor[static_cast<size_t>(r)] >= 0) {
        anchor = std::span<const uint16_t>(anchors).subspan(
            (static_cast<size_t>(p.anchor[static_cast<size_t>(r)]) * q.n_kv + h) * q.head_dim, q.head_dim);
      }
      formats::kv_encode_token(L, page, p.slot[static_cast<size_t>(r)], KvPart::K, q.head(r, q.k_offset, h), anchor);
      formats::kv_encode_token(L, page, p.slot[static_cast<size_t>(r)], KvPart::V, q.head(r, q.v_offset, h));
    }
  }
  return pool;
}

// The CPU anchor of rows [first, first + count), head h: kv_key_anchor (int4-hadamard) of the raw keys.
std::vector<uint16_t> cpu_anchor(const Qkv& q, int first, int count, int h) {
  std::vector<float> keys;
  for (int t = 0; t < count; ++t) {
    const std::vector<float> k = q.head(first + t, q.k_offset, h);
    keys.insert(keys.end(), k.begin(), k.end());
  }
  return formats::kv_key_anchor(KvFormat::INT4_HADAMARD, keys, count, q.head_dim);
}

// kAnchors anchors per head: anchor 0 from the first rows (as the engine's first chunk would give), 1 and 2
// random fp16 of N(0, 3^2).
std::vector<uint16_t> make_anchors(const Qkv& q, uint32_t seed) {
  std::vector<uint16_t> a(static_cast<size_t>(kAnchors) * q.n_kv * q.head_dim);
  for (int h = 0; h < q.n_kv; ++h) {
    const std::vector<uint16_t> c = cpu_anchor(q, 0, std::min(q.rows, 7), h);
    std::copy(c.begin(), c.end(), a.begin() + static_cast<ptrdiff_t>(h) * q.head_dim);
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t i = static_cast<size_t>(q.n_kv) * q.head_dim; i < a.size(); ++i) a[i] = f32_to_f16(nd(rng));
  return a;
}

// Names the first differing byte of two pools: page id, KV head, region and slot.
std::string describe_mismatch(const formats::KvPageLayout& L, int n_kv, const std::vector<uint8_t>& got,
                              const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const int64_t page = static_cast<int64_t>(i) / L.page_bytes, off = static_cast<int64_t>(i) % L.page_bytes;
    std::string region = "padding";
    for (int p = 1; p >= 0; --p) {
      const char* part = p ? "V" : "K";
      const int64_t code_end = L.codes[p] + L.page_tokens * L.code_row_bytes;
      if (off >= L.codes[p] && off < code_end) {
        region = std::string(part) + " codes, slot " + std::to_string((off - L.codes[p]) / L.code_row_bytes) +
                 " byte " + std::to_string((off - L.codes[p]) % L.code_row_bytes);
        break;
      }
      if (L.format == KvFormat::FP8 && off >= L.scales[p] && off < L.scales[p] + L.page_tokens * 4) {
        region = std::string(part) + " scale, slot " + std::to_string((off - L.scales[p]) / 4);
        break;
      }
      if (L.groups > 0 && off >= L.scales[p] && off < L.scales[p] + L.page_tokens * L.groups * 2) {
        region = std::string(part) + " scales, slot " + std::to_string((off - L.scales[p]) / 2 / L.groups) +
                 " group " + std::to_string((off - L.scales[p]) / 2 % L.groups);
        break;
      }
      if (L.groups > 0 && off >= L.zeros[p] && off < L.zeros[p] + L.page_tokens * L.groups) {
        region = std::string(part) + " zeros, slot " + std::to_string((off - L.zeros[p]) / L.groups) + " group " +
                 std::to_string((off - L.zeros[p]) % L.groups);
        break;
      }
    }
    return "byte " + std::to_string(i) + " (page id " + std::to_string(page / n_kv) + ", KV head " +
           std::to_string(page % n_kv) + ", " + region + "): got " + std::to_string(got[i]) + ", want " +
           std::to_string(want[i]);
  }
  return "";
}

struct DeviceRows {
  DeviceBuffer<uint16_t> qkv;
  DeviceBuffer<int32_t> page, slot, anchor;
  DeviceRows(const Qkv& q, const Placement& p) : qkv(q.bits), page(p.page), slot(p.slot), anchor(p.anchor) {}
};

cudaError_t gpu_append(KvFormat f, const Qkv& q, const DeviceRows& d, const uint16_t* anchors, uint8_t* pool,
                       cudaStream_t stream = nullptr) {
  return cuda::kv_append(f, reinterpret_cast<const __nv_bfloat16*>(d.qkv.p), q.row_stride, q.k_offset, q.v_offset,
                         q.rows, q.n_kv, q.head_dim, d.page.p, d.slot.p, anchors, d.anchor.p, pool, stream);
}

void check_append(KvFormat f, int head_dim, int rows, int n_kv, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(f) << " head_dim " << head_dim << " rows " << rows
                                  << " n_kv_heads " << n_kv << " seed " << seed);
  const Qkv q = make_qkv(rows, n_kv, head_dim, seed);
  const Placement p = make_placement(rows, seed + 1);
  const std::vector<uint16_t> anchors = make_anchors(q, seed + 2);
  const std::vector<uint8_t> want = cpu_append(f, q, p, anchors);

  const formats::KvPageLayout L = formats::kv_page_layout(f, head_dim);
  const DeviceRows d(q, p);
  DeviceBuffer<uint16_t> d_anchors(anchors);
  DeviceBuffer<uint8_t> pool(want.size());
  ASSERT_EQ(pool.poison(), cudaSuccess);
  const cudaError_t e = gpu_append(f, q, d, d_anchors.p, pool.p);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::kv_append_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> got = pool.download();
  // ASSERT_TRUE, not ASSERT_EQ: gtest would print both pools in full.
  ASSERT_TRUE(got == want) << describe_mismatch(L, n_kv, got, want);
  // The comparison above cannot pass vacuously: the twin wrote bytes (rows > 0 always has a non-padding row 0).
  ASSERT_NE(std::count(want.begin(), want.end(), uint8_t{0xFF}), static_cast<ptrdiff_t>(want.size()));
}

TEST(KvAppendGpu, EveryFormatMatchesKvEncodeTokenByteForByte) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 1000;
  for (KvFormat f : kAllFormats) {
    for (int head_dim : {64, 128}) {
      for (int rows : {1, 5, 64, 130}) check_append(f, head_dim, rows, 2, seed += 10);
    }
  }
}

TEST(KvAppendGpu, OtherHeadDimsAndLlamaHeadCount) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 2000;
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    for (int head_dim : {32, 96, 160, 192, 256}) check_append(f, head_dim, 37, 3, seed += 10);
  }
  for (int head_dim : {16, 80, 256}) check_append(KvFormat::FP8, head_dim, 37, 3, seed += 10);
  for (int head_dim : {8, 40, 200}) check_append(KvFormat::BF16, head_dim, 37, 3, seed += 10);
  for (KvFormat f : kAllFormats) check_append(f, 128, 130, 8, seed += 10);
}

// f32_to_bf16 quiets a signalling NaN; the BF16 cache (the only format that accepts non-finite values) must too.
TEST(KvAppendGpu, Bf16KeepsInfAndQuietsNaNAsTheCpu) {
  FT_REQUIRE_CUDA_DEVICE();
  Qkv q = make_qkv(3, 2, 64, 77);
  q.at(0, q.k_offset, 0, 1) = 0x7F81;  // signalling NaN
  q.at(0, q.k_offset, 1, 2) = 0xFF81;
  q.at(1, q.v_offset, 0, 3) = 0x7FC0;  // quiet NaN
  q.at(2, q.v_offset, 1, 4) = 0xFF80;  // -inf
  const Placement p = make_placement(3, 78);
  const std::vector<uint8_t> want = cpu_append(KvFormat::BF16, q, p, {});
  const DeviceRows d(q, p);
  DeviceBuffer<uint8_t> pool(want.size());
  ASSERT_EQ(pool.poison(), cudaSuccess);
  ASSERT_EQ(gpu_append(KvFormat::BF16, q, d, nullptr, pool.p), cudaSuccess) << cuda::kv_append_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> got = pool.download();
  EXPECT_TRUE(got == want) << describe_mismatch(formats::kv_page_layout(KvFormat::BF16, 64), 2, got, want);
}

// Sequences of chunks of 1, 7 and 100 tokens (and one with keys so large that the mean saturates fp16), written
// to shuffled anchor slots; a sequence with no tokens or a negative anchor index writes nothing.
void check_anchors(int head_dim, int n_kv, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "head_dim " << head_dim << " n_kv_heads " << n_kv << " seed " << seed);
  Qkv q = make_qkv(120, n_kv, head_dim, seed);
  // Rows 113..115: keys around ±2e5, so some rotated channel means lie beyond fp16's 65504.
  for (int r = 113; r < 116; ++r) {
    for (int h = 0; h < n_kv; ++h) {
      for (int j = 0; j < head_dim; ++j) {
        q.at(r, q.k_offset, h, j) = f32_to_bf16((j % 3 == 0 ? -2e5f : 2e5f) + 1000.0f * static_cast<float>(r));
      }
    }
  }
  const std::vector<int32_t> first = {5, 6, 13, 0, 113, 0};
  const std::vector<int32_t> count = {1, 7, 100, 0, 3, 4};
  const std::vector<int32_t> index = {2, 0, 3, 1, 5, -1};
  constexpr int kSlots = 7;  // slots 1 (count 0), 4 and 6 (never named) must keep their poison
  std::vector<uint16_t> want(static_cast<size_t>(kSlots) * n_kv * head_dim, 0xFFFF);
  bool saturated = false;
  for (size_t s = 0; s < first.size(); ++s) {
    if (count[s] <= 0 || index[s] < 0) continue;
    for (int h = 0; h < n_kv; ++h) {
      const std::vector<uint16_t> c = cpu_anchor(q, first[s], count[s], h);
      for (uint16_t b : c) saturated |= (b & 0x7FFF) == 0x7BFF;
      std::copy(c.begin(), c.end(), want.begin() + (static_cast<ptrdiff_t>(index[s]) * n_kv + h) * head_dim);
    }
  }
  ASSERT_TRUE(saturated) << "the large-key sequence should saturate some channel to ±65504";

  DeviceBuffer<uint16_t> qkv(q.bits);
  DeviceBuffer<int32_t> d_first(first), d_count(count), d_index(index);
  DeviceBuffer<uint16_t> anchors(want.size());
  ASSERT_EQ(anchors.poison(), cudaSuccess);
  const cudaError_t e = cuda::kv_key_anchor_compute(reinterpret_cast<const __nv_bfloat16*>(qkv.p), q.row_stride,
                                                    q.k_offset, n_kv, head_dim, static_cast<int>(first.size()),
                                                    d_first.p, d_count.p, d_index.p, anchors.p, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::kv_append_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = anchors.download();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "anchor slot " << i / head_dim / n_kv << " KV head " << i / head_dim % n_kv
                               << " channel " << i % head_dim;
  }
}

TEST(KvAnchorGpu, MatchesKvKeyAnchorBitForBit) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 3000;
  for (int head_dim : {64, 128, 32, 96, 192, 256}) check_anchors(head_dim, 2, seed += 10);
  check_anchors(128, 8, seed += 10);
}

// Prefill-length chunks: many rounds of the kernel's 32-row blocks, a chunk one row past a whole block and one short
// of it, so partial last blocks and partial last rounds are exercised. One channel carries keys whose sum depends on
// the order of the fp64 additions (kv_key_anchor's blocks, not token order).
TEST(KvAnchorGpu, LongChunksMatchKvKeyAnchorBitForBit) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 3500;
  for (int head_dim : {64, 128, 256, 96}) {
    // head_dim 96 also gets an odd row stride: the kernel's 2-byte-load path.
    const bool unaligned = head_dim == 96;
    SCOPED_TRACE(testing::Message() << "head_dim " << head_dim << (unaligned ? " (unaligned rows)" : ""));
    const int n_kv = head_dim == 256 ? 2 : 3;
    Qkv q = make_qkv(1200, n_kv, head_dim, seed += 10);
    if (unaligned) {
      constexpr int kExtra = 3;  // elements: rows only 2-byte aligned
      std::vector<uint16_t> bits(static_cast<size_t>(q.rows) * (q.row_stride + kExtra), 0);
      for (int r = 0; r < q.rows; ++r)
        std::copy(q.bits.begin() + static_cast<ptrdiff_t>(r) * q.row_stride,
                  q.bits.begin() + static_cast<ptrdiff_t>(r + 1) * q.row_stride,
                  bits.begin() + static_cast<ptrdiff_t>(r) * (q.row_stride + kExtra));
      q.bits = std::move(bits);
      q.row_stride += kExtra;
    }
    // Sequence 0, KV head 0, channel 5: +2^60 opens block 0 and -2^60 block 1, the rest of both blocks is 1. In
    // token order block 0's ones vanish into 2^60 and block 1's survive; by blocks both vanish and the sums cancel.
    for (int r = 0; r < 64; ++r) q.at(r, q.k_offset, 0, 5) = f32_to_bf16(r == 0 ? 0x1p60f : r == 32 ? -0x1p60f : 1.0f);
    const std::vector<int32_t> first = {0, 1037, 1102}, count = {1037, 65, 63}, index = {2, 0, 1};
    std::vector<uint16_t> want(3 * static_cast<size_t>(n_kv) * head_dim);
    for (size_t s = 0; s < first.size(); ++s) {
      for (int h = 0; h < n_kv; ++h) {
        const std::vector<uint16_t> c = cpu_anchor(q, first[s], count[s], h);
        std::copy(c.begin(), c.end(), want.begin() + (static_cast<ptrdiff_t>(index[s]) * n_kv + h) * head_dim);
      }
    }
    DeviceBuffer<uint16_t> qkv(q.bits);
    DeviceBuffer<int32_t> d_first(first), d_count(count), d_index(index);
    DeviceBuffer<uint16_t> anchors(want.size());
    ASSERT_EQ(anchors.poison(), cudaSuccess);
    ASSERT_EQ(cuda::kv_key_anchor_compute(reinterpret_cast<const __nv_bfloat16*>(qkv.p), q.row_stride, q.k_offset,
                                          n_kv, head_dim, 3, d_first.p, d_count.p, d_index.p, anchors.p, nullptr),
              cudaSuccess)
        << cuda::kv_append_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> got = anchors.download();
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "anchor slot " << i / head_dim / n_kv << " KV head " << i / head_dim % n_kv
                                 << " channel " << i % head_dim;
    }
  }
}

// The engine's order on one stream: anchors of each sequence's first chunk, then the append of the same rows
// against them, with no synchronisation in between.
TEST(KvAnchorGpu, AnchorThenAppendOnOneStreamMatchesTheCpu) {
  FT_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 4000;
  for (int head_dim : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "head_dim " << head_dim);
    const Qkv q = make_qkv(130, 4, head_dim, seed += 10);
    Placement p = make_placement(130, seed + 1);
    const std::vector<int32_t> first = {0, 70}, count = {70, 60}, index = {1, 0};
    for (int r = 0; r < q.rows; ++r) p.anchor[static_cast<size_t>(r)] = r < 70 ? 1 : 0;
    std::vector<uint16_t> anchors(2 * static_cast<size_t>(q.n_kv) * head_dim);
    for (size_t s = 0; s < first.size(); ++s) {
      for (int h = 0; h < q.n_kv; ++h) {
        const std::vector<uint16_t> c = cpu_anchor(q, first[s], count[s], h);
        std::copy(c.begin(), c.end(), anchors.begin() + (static_cast<ptrdiff_t>(index[s]) * q.n_kv + h) * head_dim);
      }
    }
    const std::vector<uint8_t> want = cpu_append(KvFormat::INT4_HADAMARD, q, p, anchors);

    const DeviceRows d(q, p);
    DeviceBuffer<int32_t> d_first(first), d_count(count), d_index(index);
    DeviceBuffer<uint16_t> d_anchors(anchors.size());
    DeviceBuffer<uint8_t> pool(want.size());
    ASSERT_EQ(d_anchors.poison(), cudaSuccess);
    ASSERT_EQ(pool.poison(), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ASSERT_EQ(cuda::kv_key_anchor_compute(reinterpret_cast<const __nv_bfloat16*>(d.qkv.p), q.row_stride, q.k_offset,
                                          q.n_kv, head_dim, 2, d_first.p, d_count.p, d_index.p, d_anchors.p, stream),
              cudaSuccess)
        << cuda::kv_append_last_error();
    ASSERT_EQ(gpu_append(KvFormat::INT4_HADAMARD, q, d, d_anchors.p, pool.p, stream), cudaSuccess)
        << cuda::kv_append_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    EXPECT_TRUE(d_anchors.download() == anchors);
    const std::vector<uint8_t> got = pool.download();
    EXPECT_TRUE(got == want) << describe_mismatch(formats::kv_page_layout(KvFormat::INT4_HADAMARD, head_dim), q.n_kv,
                                                  got, want);
  }
}

TEST(KvAppendGpu, RejectedCallsWriteNothing) {
  FT_REQUIRE_CUDA_DEVICE();
  const Qkv q = make_qkv(5, 2, 128, 5000);
  const Placement p = make_placement(5, 5001);
  const DeviceRows d(q, p);
  const formats::KvPageLayout L = formats::kv_page_layout(KvFormat::INT4_HADAMARD, 128);
  DeviceBuffer<uint8_t> pool(pool_bytes(L, p.n_pages, 2));
  ASSERT_EQ(pool.poison(), cudaSuccess);
  const auto* qkv = reinterpret_cast<const __nv_bfloat16*>(d.qkv.p);
  // No anchors for int4-hadamard.
  EXPECT_EQ(cuda::kv_append(KvFormat::INT4_HADAMARD, qkv, q.row_stride, q.k_offset, q.v_offset, 5, 2, 128, d.page.p,
                            d.slot.p, nullptr, d.anchor.p, pool.p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("key_anchors"), std::string::npos);
  // V slice past the row.
  EXPECT_EQ(cuda::kv_append(KvFormat::INT4, qkv, q.row_stride, q.k_offset, q.row_stride - 100, 5, 2, 128, d.page.p,
                            d.slot.p, nullptr, nullptr, pool.p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("v_offset"), std::string::npos);
  // Misaligned pool.
  EXPECT_EQ(cuda::kv_append(KvFormat::INT4, qkv, q.row_stride, q.k_offset, q.v_offset, 5, 2, 128, d.page.p, d.slot.p,
                            nullptr, nullptr, pool.p + 8, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("16-byte aligned"), std::string::npos);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint8_t b : pool.download()) ASSERT_EQ(b, 0xFF);
}

// --- Host-only: the argument contract (no device needed; every call below returns before any CUDA call). ---

TEST(KvAppendHost, CanImplementAcceptsTheSupportedShapes) {
  std::string why = "stale";
  EXPECT_EQ(cuda::kv_append_can_implement(KvFormat::INT4_HADAMARD, 64, 8, 128, 6144, 4096, 5120, &why), cudaSuccess)
      << why;
  EXPECT_EQ(why, "");
  EXPECT_EQ(cuda::kv_append_can_implement(KvFormat::INT4, 0, 1, 64, 192, 64, 128, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::kv_append_can_implement(KvFormat::INT4, 1, 2, 96, 192, 0, 0, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::kv_append_can_implement(KvFormat::INT4, 1, 1, 256, 512, 0, 256, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::kv_append_can_implement(KvFormat::FP8, 1, 1, 80, 160, 0, 80, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::kv_append_can_implement(KvFormat::BF16, 1, 1, 8, 16, 0, 8, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::kv_key_anchor_compute_can_implement(8, 128, 32, 6144, 4096, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::kv_key_anchor_compute_can_implement(1, 32, 0, 32, 0, &why), cudaSuccess) << why;
}

TEST(KvAppendHost, CanImplementNamesTheProblem) {
  struct Bad {
    KvFormat f;
    int rows, n_kv, head_dim, row_stride, k_offset, v_offset;
    const char* needle;
  };
  for (const Bad& b : {
           Bad{KvFormat::INT4, 1, 1, 48, 1024, 0, 0, "head_dim = 48"},
           Bad{KvFormat::INT4_HADAMARD, 1, 1, 16, 1024, 0, 0, "head_dim = 16"},
           Bad{KvFormat::FP8, 1, 1, 24, 1024, 0, 0, "head_dim = 24"},
           Bad{KvFormat::BF16, 1, 1, 12, 1024, 0, 0, "head_dim = 12"},
           Bad{KvFormat::BF16, 1, 1, 0, 1024, 0, 0, "head_dim = 0"},
           Bad{KvFormat::INT4, 1, 1, 288, 1024, 0, 0, "head_dim = 288"},
           Bad{static_cast<KvFormat>(7), 1, 1, 128, 1024, 0, 0, "unknown KV format"},
           Bad{KvFormat::INT4, 1, 0, 128, 1024, 0, 0, "n_kv_heads = 0"},
           Bad{KvFormat::INT4, -1, 1, 128, 1024, 0, 0, "rows = -1"},
           Bad{KvFormat::INT4, 1, 1, 128, 1024, -2, 0, "k_offset = -2"},
           Bad{KvFormat::INT4, 1, 2, 128, 512, 0, 257, "v_offset = 257"},
           Bad{KvFormat::INT4, 1, 2, 128, 255, 0, 0, "row_stride = 255"},
           Bad{KvFormat::INT4, 1 << 30, 8, 128, 1024, 0, 0, "too large"},
       }) {
    std::string why;
    EXPECT_EQ(cuda::kv_append_can_implement(b.f, b.rows, b.n_kv, b.head_dim, b.row_stride, b.k_offset, b.v_offset,
                                            &why),
              cudaErrorInvalidValue)
        << b.needle;
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' does not name " << b.needle;
    EXPECT_EQ(cuda::kv_append_can_implement(b.f, b.rows, b.n_kv, b.head_dim, b.row_stride, b.k_offset, b.v_offset,
                                            nullptr),
              cudaErrorInvalidValue);
  }
  struct BadAnchor {
    int n_kv, head_dim, n_seqs, row_stride, k_offset;
    const char* needle;
  };
  for (const BadAnchor& b : {
           BadAnchor{1, 80, 1, 1024, 0, "head_dim = 80"},
           BadAnchor{1, 512, 1, 1024, 0, "head_dim = 512"},
           BadAnchor{0, 128, 1, 1024, 0, "n_kv_heads = 0"},
           BadAnchor{70000, 128, 1, 1 << 30, 0, "n_kv_heads = 70000"},
           BadAnchor{9000, 128, 1, 1 << 30, 0, "n_kv_heads = 9000"},  // 8 CTAs per head: grid x past 65535
           BadAnchor{1, 128, -1, 1024, 0, "n_seqs = -1"},
           BadAnchor{1, 128, 70000, 1024, 0, "n_seqs = 70000"},
           BadAnchor{2, 128, 1, 1024, 800, "k_offset = 800"},
       }) {
    std::string why;
    EXPECT_EQ(cuda::kv_key_anchor_compute_can_implement(b.n_kv, b.head_dim, b.n_seqs, b.row_stride, b.k_offset, &why),
              cudaErrorInvalidValue)
        << b.needle;
    EXPECT_NE(why.find(b.needle), std::string::npos) << "message '" << why << "' does not name " << b.needle;
  }
}

// Host arrays stand in for device pointers: a refused call never dereferences them, and a call with rows == 0
// (or n_seqs == 0) succeeds without launching, so none of this needs a device.
TEST(KvAppendHost, LaunchersRefuseBadPointersBeforeTouchingTheDevice) {
  alignas(16) static uint8_t pool[64];
  alignas(16) static uint16_t qkv_bits[512];
  alignas(16) static int32_t ints[4];
  alignas(16) static uint16_t anchors[128];
  const auto* qkv = reinterpret_cast<const __nv_bfloat16*>(qkv_bits);
  auto append = [&](KvFormat f, const __nv_bfloat16* x, const int32_t* page, uint8_t* p, const uint16_t* a,
                    const int32_t* ra) {
    return cuda::kv_append(f, x, 512, 256, 384, 0, 1, 128, page, ints, a, ra, p, nullptr);
  };
  EXPECT_EQ(append(KvFormat::INT4, qkv, ints, pool, nullptr, nullptr), cudaSuccess) << cuda::kv_append_last_error();
  EXPECT_STREQ(cuda::kv_append_last_error(), "");
  EXPECT_EQ(append(KvFormat::INT4_HADAMARD, qkv, ints, pool, anchors, ints), cudaSuccess)
      << cuda::kv_append_last_error();

  EXPECT_EQ(append(KvFormat::INT4, nullptr, ints, pool, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("non-null"), std::string::npos);
  EXPECT_EQ(append(KvFormat::INT4, qkv, nullptr, pool, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(append(KvFormat::INT4, qkv, ints, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(append(KvFormat::INT4, qkv, ints, pool + 4, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("kv_pool 16-byte aligned"), std::string::npos);
  EXPECT_EQ(append(KvFormat::BF16, reinterpret_cast<const __nv_bfloat16*>(pool + 1), ints, pool, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("qkv 2-byte aligned"), std::string::npos);
  EXPECT_EQ(append(KvFormat::INT4_HADAMARD, qkv, ints, pool, anchors, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("row_anchor"), std::string::npos);
  EXPECT_EQ(append(KvFormat::INT4_HADAMARD, qkv, ints, pool, nullptr, ints), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("key_anchors"), std::string::npos);
  EXPECT_EQ(cuda::kv_append(KvFormat::INT4, qkv, 512, 256, 384, 0, 1, 100, ints, ints, nullptr, nullptr, pool, nullptr),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("head_dim = 100"), std::string::npos);

  auto anchor = [&](const int32_t* first, uint16_t* out, int n_seqs) {
    return cuda::kv_key_anchor_compute(qkv, 512, 256, 1, 128, n_seqs, first, ints, ints, out, nullptr);
  };
  EXPECT_EQ(anchor(ints, anchors, 0), cudaSuccess) << cuda::kv_append_last_error();
  EXPECT_STREQ(cuda::kv_append_last_error(), "");
  EXPECT_EQ(anchor(nullptr, anchors, 0), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("non-null"), std::string::npos);
  EXPECT_EQ(anchor(ints, nullptr, 0), cudaErrorInvalidValue);
  EXPECT_EQ(anchor(ints, reinterpret_cast<uint16_t*>(pool + 1), 0), cudaErrorInvalidValue);
  EXPECT_EQ(anchor(ints, anchors, -3), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cuda::kv_append_last_error()).find("n_seqs = -3"), std::string::npos);
}

}  // namespace
