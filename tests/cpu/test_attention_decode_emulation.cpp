// CPU checks of the paged decode-attention kernel (src/cuda/attention_decode.cuh) that run without a GPU:
//  1. the page and stage geometry of src/cuda/attention_decode_layout.h equals formats::kv_page_layout, and the
//     stage copy schedule moves exactly the bytes of one 16-token tile, each stage byte once;
//  2. a lane-by-lane emulation of the kernel — cp.async stage fills (zero-fill for BF16 rows past the end),
//     ldmatrix / ldmatrix.trans addresses, prmt / lop3 / bf16x2 dequantisation, mma fragments, the online
//     softmax with its shuffles, P' packing, the warp merge, split partials and the combine — matches the CPU
//     twin (ref::paged_decode_attention) within the GPU test's tolerances and writes every output once.
// The mma / ldmatrix fragment tables below are written from the PTX ISA, independently of the layout header.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda/attention_decode_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "mma_m16n8k16_model.h"
#include "paged_kv_case.h"

namespace {

using namespace futransformer;
namespace attn = futransformer::cuda::attn;
using formats::KvFormat;
using test::PagedKvCase;

// --- PTX ISA: mma.m16n8k16 fragments ((row, col) of each register half of a lane) and warp primitives. ---
using namespace test::mma;
uint32_t sub_bf16x2(uint32_t a, uint32_t b) { return pack_bf16x2(lo_f(a) - lo_f(b), hi_f(a) - hi_f(b)); }
uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t x = a | (static_cast<uint64_t>(b) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
uint32_t nibbles_plus_128(uint32_t word, int shift) { return ((word >> shift) & attn::kNibbleMask) | attn::kBf16Magic; }
float half_to_float(uint32_t word, int half) { return f16_to_f32(static_cast<uint16_t>(half ? word >> 16 : word)); }
uint32_t load32(const std::vector<uint8_t>& m, int off) {
  uint32_t v;
  std::memcpy(&v, m.data() + off, 4);
  return v;
}
uint32_t load16(const std::vector<uint8_t>& m, int off) {
  return m[static_cast<size_t>(off)] | (m[static_cast<size_t>(off) + 1] << 8);
}

using Regs = std::array<std::array<uint32_t, 4>, 32>;
// ldmatrix.x4 (.trans): lanes 8j .. 8j + 7 address the rows of matrix j. Plain: lane l receives row l / 4,
// b16 columns 2 (l % 4) + {0, 1}. Transposed: rows 2 (l % 4) + {0, 1} of b16 column l / 4.
Regs ldmatrix_x4(const std::vector<uint8_t>& smem, const std::array<int, 32>& addr, bool trans) {
  Regs out{};
  for (int j = 0; j < 4; ++j) {
    for (int lane = 0; lane < 32; ++lane) {
      EXPECT_EQ(addr[static_cast<size_t>(lane)] % 16, 0);
      EXPECT_LE(addr[static_cast<size_t>(lane)] + 16, static_cast<int>(smem.size()));
      if (!trans) {
        out[lane][j] = load32(smem, addr[8 * j + lane / 4] + 4 * (lane % 4));
      } else {
        const int col = 2 * (lane / 4);
        out[lane][j] = load16(smem, addr[8 * j + 2 * (lane % 4)] + col) |
                       (load16(smem, addr[8 * j + 2 * (lane % 4) + 1] + col) << 16);
      }
    }
  }
  return out;
}

using Acc2 = std::array<std::array<float, 2>, 32>;
// mma.m16n8k16 bf16 with A rows 8..15 zero: d (row g, cols 2t, 2t + 1) += (A·B).
void mma_rows8(Acc2& d, const std::array<uint32_t, 32>& a0, const std::array<uint32_t, 32>& a2,
               const std::array<std::array<uint32_t, 2>, 32>& b) {
  float A[16][16] = {}, B[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int h = 0; h < 2; ++h) {
      RC rc = ptx_a(lane, 0, h);
      A[rc.r][rc.c] = h ? hi_f(a0[lane]) : lo_f(a0[lane]);
      rc = ptx_a(lane, 2, h);
      A[rc.r][rc.c] = h ? hi_f(a2[lane]) : lo_f(a2[lane]);
      for (int r = 0; r < 2; ++r) {
        const RC kn = ptx_b(lane, r, h);
        B[kn.r][kn.c] = h ? hi_f(b[lane][r]) : lo_f(b[lane][r]);
      }
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 2; ++i) {
      const RC rc = ptx_c(lane, i);
      double s = 0.0;
      for (int k = 0; k < 16; ++k) s += static_cast<double>(A[rc.r][k]) * B[k][rc.c];
      d[lane][i] += static_cast<float>(s);
    }
  }
}

// movmatrix.sync.aligned.m8n8.trans.b16 (PTX ISA): lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low,
// high half) of an 8 x 8 matrix; the result is the transpose in the same layout.
std::array<uint32_t, 32> movmatrix_trans(const std::array<uint32_t, 32>& x) {
  uint16_t M[8][8];
  for (int lane = 0; lane < 32; ++lane) {
    M[lane / 4][2 * (lane % 4)] = static_cast<uint16_t>(x[lane] & 0xffff);
    M[lane / 4][2 * (lane % 4) + 1] = static_cast<uint16_t>(x[lane] >> 16);
  }
  std::array<uint32_t, 32> out{};
  for (int lane = 0; lane < 32; ++lane)
    out[lane] = M[2 * (lane % 4)][lane / 4] | (static_cast<uint32_t>(M[2 * (lane % 4) + 1][lane / 4]) << 16);
  return out;
}

// --- 1. Geometry. ---

template <bool kInt4, int kD>
void check_geometry() {
  using Geo = attn::Geometry<kInt4, kD>;
  const formats::KvPageLayout L = formats::kv_page_layout(kInt4 ? KvFormat::INT4 : KvFormat::BF16, kD);
  SCOPED_TRACE(testing::Message() << (kInt4 ? "int4" : "bf16") << " head_dim " << kD);
  ASSERT_EQ(L.page_tokens, attn::kPageTokens);
  EXPECT_EQ(L.page_bytes, Geo::kPageBytes);
  EXPECT_EQ(L.code_row_bytes, Geo::kRowBytes);
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(L.codes[p], p * Geo::kPagePartBytes);
    if (kInt4) {
      EXPECT_EQ(L.scales[p], p * Geo::kPagePartBytes + Geo::kPageCodeBytes);
      EXPECT_EQ(L.zeros[p], p * Geo::kPagePartBytes + Geo::kPageCodeBytes + Geo::kPageScaleBytes);
    }
  }
  // Copy tile `tile` of a page of random bytes and check every stage byte against its meaning.
  std::mt19937 rng(kD + kInt4);
  std::vector<uint8_t> page(static_cast<size_t>(L.page_bytes));
  for (auto& v : page) v = static_cast<uint8_t>(rng());
  const int G = static_cast<int>(L.groups);
  for (int tile = 0; tile < attn::kTilesPerPage; ++tile) {
    const int slot0 = tile * attn::kTile;
    std::vector<uint8_t> stage(Geo::kStageBytes, 0);
    std::vector<int> written(Geo::kStageBytes, 0);
    for (int c = 0; c < Geo::kStageChunks; ++c) {
      const attn::ChunkCopy cc = attn::stage_chunk<kInt4, kD>(c, slot0);
      ASSERT_GE(cc.src, 0);
      ASSERT_LE(cc.src + 16, L.page_bytes);
      ASSERT_EQ(cc.src % 16, 0);
      ASSERT_GE(cc.dst, 0);
      ASSERT_LE(cc.dst + 16, Geo::kStageBytes);
      std::memcpy(&stage[static_cast<size_t>(cc.dst)], &page[static_cast<size_t>(cc.src)], 16);
      for (int i = 0; i < 16; ++i) ++written[static_cast<size_t>(cc.dst + i)];
    }
    for (int w : written) ASSERT_EQ(w, 1);
    for (int part = 0; part < 2; ++part) {
      for (int row = 0; row < attn::kTile; ++row) {
        for (int byte = 0; byte < Geo::kRowBytes; ++byte) {
          const int s =
              part * Geo::kStageCodeBytes + attn::stage_code_offset<Geo::kRowChunks>(row, byte / 16) + byte % 16;
          ASSERT_EQ(stage[static_cast<size_t>(s)],
                    page[static_cast<size_t>(L.codes[part] + (slot0 + row) * L.code_row_bytes + byte)]);
        }
        for (int i = 0; i < 2 * G; ++i) {  // scale bytes, then zero bytes
          ASSERT_EQ(stage[static_cast<size_t>(Geo::kStageScales + part * Geo::kStageScaleBytes + row * 2 * G + i)],
                    page[static_cast<size_t>(L.scales[part] + (slot0 + row) * 2 * G + i)]);
        }
        for (int i = 0; i < G; ++i) {
          ASSERT_EQ(stage[static_cast<size_t>(Geo::kStageZeros + part * Geo::kStageZeroBytes + row * G + i)],
                    page[static_cast<size_t>(L.zeros[part] + (slot0 + row) * G + i)]);
        }
      }
    }
  }
}

TEST(AttentionDecodeLayout, GeometryMatchesTheCanonicalPagesAndStagesCopyOneTile) {
  check_geometry<true, 128>();
  check_geometry<true, 64>();
  check_geometry<false, 128>();
  check_geometry<false, 64>();
}

// The kernel's INT4 copies (one source and one destination register per lane plus constants of the copy index, and
// a metadata chunk through stage_chunk) move exactly the chunks of the canonical schedule.
template <int kD>
void check_int4_copies() {
  using Copies = attn::Int4Copies<kD>;
  using Geo = attn::Geometry<true, kD>;
  SCOPED_TRACE(testing::Message() << "head_dim " << kD);
  ASSERT_EQ(Copies::kCodeCopies * attn::kWarpSize + Copies::kMetaChunks, Geo::kStageChunks);
  for (int slot0 = 0; slot0 < attn::kPageTokens; slot0 += attn::kTile) {
    for (int lane = 0; lane < attn::kWarpSize; ++lane) {
      for (int i = 0; i < Copies::kCodeCopies; ++i) {
        const attn::ChunkCopy cc = attn::stage_chunk<true, kD>(lane + attn::kWarpSize * i, slot0);
        ASSERT_EQ(Copies::code_src(lane, i, slot0), cc.src) << "lane " << lane << " copy " << i << " slot " << slot0;
        ASSERT_EQ(Copies::code_dst(lane, i), cc.dst) << "lane " << lane << " copy " << i;
        // The kernel adds copy 0's lane terms to constants of i.
        ASSERT_EQ(Copies::code_src(lane, 0, slot0) + Copies::code_src(0, i, 0) - Copies::code_src(0, 0, 0), cc.src);
        ASSERT_EQ(Copies::code_dst(lane, 0) + Copies::code_dst(0, i) - Copies::code_dst(0, 0), cc.dst);
      }
      if (lane < Copies::kMetaChunks) {  // src linear in slot0, as the kernel assumes
        const int c = 2 * Geo::kCodeChunksPerPart + lane;
        const attn::ChunkCopy c0 = attn::stage_chunk<true, kD>(c, 0), c1 = attn::stage_chunk<true, kD>(c, 1);
        const attn::ChunkCopy cs = attn::stage_chunk<true, kD>(c, slot0);
        ASSERT_EQ(c0.src + slot0 * (c1.src - c0.src), cs.src) << "metadata lane " << lane << " slot " << slot0;
        ASSERT_EQ(c0.dst, cs.dst);
      }
    }
  }
}

TEST(AttentionDecodeLayout, Int4LaneCopiesFollowTheStageSchedule) {
  check_int4_copies<128>();
  check_int4_copies<64>();
}

// How the stage codes meet the two hardware paths that touch them (stage_code_offset).
// - cp.async: a warp's 16-byte copies go out as whole-line L2 requests only where each 32-byte sector of the page
//   lands in 32 contiguous shared bytes in its own order (measured: the chunk-major stage, which split every sector,
//   had each sector requested twice). So: every sector stays whole, and each copy quarter warp (8 lanes, 128
//   contiguous page bytes) writes one aligned 128-byte block of shared memory (one wavefront, no bank conflict).
// - ldmatrix: a matrix is 8 rows of one 16-byte chunk; with sectors whole a chunk's 16-byte bank group is fixed
//   mod 2, so at most 4 of the 8 bank groups are reachable and 2-way is the least conflict possible.
// The chunk-major stage fails the first check, plain row-major the last (4- to 8-way).
constexpr int kBankGroups = 8;  // 128-byte wavefront / 16-byte accesses
constexpr int kQuarterWarp = 8;
constexpr int kSectorBytes = 32;
constexpr int kLineBytes = 128;
constexpr int kLeastLdmatrixWays = 2;

int max_bank_group_load(const std::array<int, kQuarterWarp>& offsets) {
  std::array<int, kBankGroups> load{};
  int worst = 0;
  for (int off : offsets) worst = std::max(worst, ++load[static_cast<size_t>((off / 16) % kBankGroups)]);
  return worst;
}

template <bool kInt4, int kD>
void check_stage_code_placement() {
  using Geo = attn::Geometry<kInt4, kD>;
  SCOPED_TRACE(testing::Message() << (kInt4 ? "INT4" : "BF16") << " head_dim " << kD);
  // Copies: stage chunk c (0 .. 2 kCodeChunksPerPart − 1) reads page bytes src .. src + 15 and writes dst.
  for (int c = 0; c < 2 * Geo::kCodeChunksPerPart; c += 2) {  // the two halves of one page sector
    const attn::ChunkCopy lo = attn::stage_chunk<kInt4, kD>(c, 0), hi = attn::stage_chunk<kInt4, kD>(c + 1, 0);
    ASSERT_EQ(lo.src % kSectorBytes, 0) << "chunk " << c;
    ASSERT_EQ(hi.src, lo.src + 16) << "chunk " << c;
    ASSERT_EQ(lo.dst % kSectorBytes, 0) << "sector of chunks " << c << ", " << c + 1 << " split in shared memory";
    ASSERT_EQ(hi.dst, lo.dst + 16) << "sector of chunks " << c << ", " << c + 1 << " split in shared memory";
  }
  for (int c0 = 0; c0 < 2 * Geo::kCodeChunksPerPart; c0 += kQuarterWarp) {
    std::array<int, kQuarterWarp> dst{};
    for (int j = 0; j < kQuarterWarp; ++j) {
      dst[static_cast<size_t>(j)] = attn::stage_chunk<kInt4, kD>(c0 + j, 0).dst;
      ASSERT_EQ(dst[static_cast<size_t>(j)] / kLineBytes, dst[0] / kLineBytes) << "copy quarter warp at chunk " << c0;
    }
    ASSERT_EQ(max_bank_group_load(dst), 1) << "copy quarter warp at chunk " << c0;
  }
  // ldmatrix.x4: matrix mi of chunk pair cp is lanes 8 mi .. 8 mi + 7.
  for (int part = 0; part < 2; ++part) {
    for (int cp = 0; cp < Geo::kRowChunks; cp += 2) {
      for (int mi = 0; mi < 4; ++mi) {
        std::array<int, kQuarterWarp> addr{};
        for (int j = 0; j < kQuarterWarp; ++j)
          addr[static_cast<size_t>(j)] = part * Geo::kStageCodeBytes +
                                         attn::ldmatrix_pair_offset<Geo::kRowChunks>(kQuarterWarp * mi + j, cp);
        ASSERT_LE(max_bank_group_load(addr), kLeastLdmatrixWays)
            << "ldmatrix part " << part << " chunks " << cp << " matrix " << mi;
      }
    }
  }
}

TEST(AttentionDecodeLayout, StageCodesKeepPageSectorsWholeAndLdmatrixAtTwoWay) {
  check_stage_code_placement<true, 128>();
  check_stage_code_placement<true, 64>();
  check_stage_code_placement<false, 128>();
  check_stage_code_placement<false, 64>();
}

TEST(AttentionDecodeLayout, FragmentChannelMapsArePermutations) {
  for (int d : {64, 128}) {
    std::vector<int> key(static_cast<size_t>(d), 0), val(static_cast<size_t>(d), 0);
    for (int gi = 0; gi < d / 32; ++gi)
      for (int ks = 0; ks < 2; ++ks)
        for (int t = 0; t < 4; ++t)
          for (int r = 0; r < 2; ++r)
            for (int h = 0; h < 2; ++h) {
              const int ch = attn::key_channel_int4(gi, ks, t, r, h);
              ASSERT_EQ(ch / 32, gi) << "a k-step must stay inside its group";
              ++key[static_cast<size_t>(ch)];
            }
    for (int mt = 0; mt < d / 16; ++mt)
      for (int g = 0; g < 8; ++g)
        for (int hi = 0; hi < 2; ++hi) {
          const int ch = attn::value_channel_t(mt, g, hi);
          ASSERT_EQ(ch / 32, mt / 2) << "an m-tile must stay inside one group (its scale is folded into P)";
          ++val[static_cast<size_t>(ch)];
        }
    for (int i = 0; i < d; ++i) ASSERT_EQ(key[static_cast<size_t>(i)], 1) << "key channel " << i;
    for (int i = 0; i < d; ++i) ASSERT_EQ(val[static_cast<size_t>(i)], 1) << "value channel " << i;
  }
}

// The twin refuses inconsistent inputs with one Error naming the field, and answers an empty sequence with 0.
TEST(AttentionDecodeTwin, RejectsInconsistentInputsAndZeroesEmptySequences) {
  PagedKvCase c = test::make_paged_kv_case(KvFormat::INT4, 64, 4, 2, {70, 5}, 41);
  auto expect_error = [&](const PagedKvCase& bad, const char* needle) {
    try {
      ref::paged_decode_attention(bad.cache(), bad.seq_lens, bad.q, bad.n_heads);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PagedKvCase bad = c;
  bad.block_table[1] = 1000;
  expect_error(bad, "block_table[0, 1] = 1000");
  bad = c;
  bad.seq_lens[1] = 129;
  expect_error(bad, "seq_lens[1] = 129");
  bad = c;
  bad.q.pop_back();
  expect_error(bad, "q has");
  bad = c;
  bad.n_heads = 3;
  expect_error(bad, "3 query heads");
  bad = c;
  bad.pool.pop_back();
  expect_error(bad, "pool of");
  c.seq_lens[1] = 0;
  const std::vector<float> out = ref::paged_decode_attention(c.cache(), c.seq_lens, c.q, c.n_heads);
  for (size_t i = out.size() / 2; i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f);
  for (size_t i = 0; i < out.size() / 2; ++i) ASSERT_TRUE(std::isfinite(out[i]));
}

// --- 2. Lane-by-lane emulation of one CTA (sequence b, KV head kvh, split). ---

struct Outputs {
  std::vector<float> out;          // [batch, n_heads, D] (splits == 1; NaN where not written)
  std::vector<float> partial_o;    // [batch, n_heads, splits, D]
  std::vector<float> partial_lse;  // [batch, n_heads, splits]
  std::vector<int> writes;         // per element of out / partial_o
};

// Merge buffers of one CTA: O [warp][head][channel], m and l per (warp, head).
struct Merge {
  std::vector<float> m, l, o;
};

// The stage of `tile`, as the cp.async schedule fills it (BF16 rows past the sequence zero-filled).
template <bool kInt4, int kD>
std::vector<uint8_t> fill_stage(const PagedKvCase& c, int b, int kvh, int tile, int len) {
  using Geo = attn::Geometry<kInt4, kD>;
  const int32_t page_id = c.block_table[static_cast<size_t>(b) * c.max_pages + tile / attn::kTilesPerPage];
  const uint8_t* page = c.pool.data() + (int64_t{page_id} * c.n_kv_heads + kvh) * Geo::kPageBytes;
  const int slot0 = (tile % attn::kTilesPerPage) * attn::kTile, tok0 = tile * attn::kTile;
  std::vector<uint8_t> st(Geo::kStageBytes);
  for (int ch = 0; ch < Geo::kStageChunks; ++ch) {
    const attn::ChunkCopy cc = attn::stage_chunk<kInt4, kD>(ch, slot0);
    const bool fill = kInt4 || tok0 + cc.row < len;
    for (int i = 0; i < 16; ++i) st[static_cast<size_t>(cc.dst + i)] = fill ? page[cc.src + i] : 0;
  }
  return st;
}

// One warp of the INT4 kernel (transposed products, attention_decode_layout.h): Sᵀ = K·Qᵀ, softmax per head column,
// Oᵀ += Vᵀ·P'ᵀ with P' moved into the B layout by movmatrix.
template <int kD>
void emulate_warp_int4(const PagedKvCase& c, int b, int kvh, int warp, int warps, attn::Range tiles, int len,
                       float score_scale, int G, const std::array<std::array<std::array<uint32_t, 2>, kD / 16>, 32>& qa, Merge& mg) {
  using Geo = attn::Geometry<true, kD>;
  constexpr int G4 = Geo::kGroups, kMT = kD / 16;
  std::array<std::array<float, 2>, 32> m, l;
  for (auto& x : m) x = {-INFINITY, -INFINITY};
  for (auto& x : l) x = {0.0f, 0.0f};
  std::array<std::array<std::array<float, 4>, kMT>, 32> o{};
  for (int tile = tiles.begin + warp; tile < tiles.end; tile += warps) {
    const std::vector<uint8_t> st = fill_stage<true, kD>(c, b, kvh, tile, len);
    const int tok0 = tile * attn::kTile;
    std::array<int, 32> addr{};
    Acc s{};
    for (int cp = 0; cp < G4; cp += 2) {
      for (int lane = 0; lane < 32; ++lane) addr[lane] = attn::ldmatrix_pair_offset<Geo::kRowChunks>(lane, cp);
      const Regs w = ldmatrix_x4(st, addr, false);
      for (int d = 0; d < 2; ++d) {
        const int gi = cp + d;
        Acc acc{};
        for (int ks = 0; ks < 2; ++ks) {
          AFrag a{};
          BFrag bb{};
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4;
            uint32_t bias[2];
            for (int r = 0; r < 2; ++r) {
              const int zoff = Geo::kStageZeros + (g + 8 * r) * G4;
              const uint32_t zk = G4 == 4 ? load32(st, zoff) : load16(st, zoff);
              bias[r] = prmt(zk, 0x43u, static_cast<uint32_t>(gi | (4 << 4) | (gi << 8) | (4 << 12)));
            }
            for (int reg = 0; reg < 4; ++reg)  // reg 0 / 1: tokens g / g + 8 with r = 0; reg 2 / 3 with r = 1
              a[lane][reg] = sub_bf16x2(
                  nibbles_plus_128(w[lane][2 * d + (reg & 1)], attn::key_shift_int4(ks, reg >> 1)), bias[reg & 1]);
            bb[lane] = qa[lane][2 * gi + ks];
          }
          mma(acc, a, bb);
        }
        for (int lane = 0; lane < 32; ++lane) {
          for (int i = 0; i < 4; ++i) {
            const int tok = lane / 4 + 8 * (i >> 1);
            const uint32_t sw = load32(st, Geo::kStageScales + tok * G4 * 2 + 4 * (gi >> 1));
            s[lane][i] = std::fma(acc[lane][i], half_to_float(sw, gi & 1), s[lane][i]);
          }
        }
      }
    }
    // Softmax per head column (the max over the 8 lanes of a t: shuffles xor 4, 8, 16).
    std::array<std::array<bool, 2>, 32> valid{};
    std::array<std::array<float, 2>, 32> tmax{};
    for (int lane = 0; lane < 32; ++lane) {
      for (int r = 0; r < 2; ++r) valid[lane][r] = tok0 + lane / 4 + 8 * r < len;
      for (int i = 0; i < 4; ++i) s[lane][i] = valid[lane][i >> 1] ? s[lane][i] * score_scale : -INFINITY;
      for (int j = 0; j < 2; ++j) tmax[lane][j] = std::max(s[lane][j], s[lane][2 + j]);
    }
    Acc p{};
    for (int lane = 0; lane < 32; ++lane) {
      for (int j = 0; j < 2; ++j) {
        float cmax = -INFINITY;
        for (int u = 0; u < 8; ++u) cmax = std::max(cmax, tmax[4 * u + lane % 4][j]);
        const float m_new = std::max(m[lane][j], cmax);
        const float alpha = std::exp2(m[lane][j] - m_new);
        p[lane][j] = std::exp2(s[lane][j] - m_new);
        p[lane][2 + j] = std::exp2(s[lane][2 + j] - m_new);
        l[lane][j] = std::fma(l[lane][j], alpha, p[lane][j] + p[lane][2 + j]);
        m[lane][j] = m_new;
        for (auto& x : o[lane]) x[j] *= alpha, x[2 + j] *= alpha;
      }
    }
    // Oᵀ += Vᵀ·P'ᵀ.
    for (int cp = 0; cp < G4; cp += 2) {
      for (int lane = 0; lane < 32; ++lane)
        addr[lane] = Geo::kStageCodeBytes + attn::ldmatrix_pair_offset<Geo::kRowChunks>(lane, cp);
      const Regs w = ldmatrix_x4(st, addr, true);
      for (int d = 0; d < 2; ++d) {
        const int grp = cp + d;
        std::array<std::array<uint32_t, 32>, 2> x{};
        std::array<std::array<uint32_t, 2>, 32> bias{};
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4;
          for (int r = 0; r < 2; ++r) {
            const uint32_t sw =
                load32(st, Geo::kStageScales + Geo::kStageScaleBytes + (g + 8 * r) * G4 * 2 + 4 * (grp >> 1));
            const float sc = half_to_float(sw, grp & 1);
            const float p0 = valid[lane][r] ? p[lane][2 * r] * sc : 0.0f;
            const float p1 = valid[lane][r] ? p[lane][2 * r + 1] * sc : 0.0f;
            x[r][lane] = pack_bf16x2(p0, p1);
            const int zoff = Geo::kStageZeros + Geo::kStageZeroBytes + (2 * t + 8 * r) * G4;
            const uint32_t z0 = load32(st, zoff), z1 = G4 == 4 ? load32(st, zoff + 4) : z0;
            bias[lane][r] =
                (prmt(z0, z1, static_cast<uint32_t>(grp | ((G4 + grp) << 8))) & 0x00ff00ffu) | attn::kBf16Magic;
          }
        }
        const std::array<uint32_t, 32> b0 = movmatrix_trans(x[0]), b1 = movmatrix_trans(x[1]);
        BFrag bb{};
        for (int lane = 0; lane < 32; ++lane) bb[lane] = {b0[lane], b1[lane]};
        for (int j = 0; j < 2; ++j) {
          const int mt = 2 * grp + j;
          AFrag a{};
          for (int lane = 0; lane < 32; ++lane)
            for (int reg = 0; reg < 4; ++reg)  // reg 0 / 1: rows g / g + 8 of tokens 2t, 2t+1; reg 2 / 3: tokens + 8
              a[lane][reg] = sub_bf16x2(
                  nibbles_plus_128(w[lane][2 * d + (reg >> 1)], attn::value_shift_t(mt, reg & 1)), bias[lane][reg >> 1]);
          Acc acc{};
          for (int lane = 0; lane < 32; ++lane) acc[lane] = o[lane][mt];
          mma(acc, a, bb);
          for (int lane = 0; lane < 32; ++lane) o[lane][mt] = acc[lane];
        }
      }
    }
  }
  // Warp state into the merge buffers (l summed over the 8 lanes of a t, as the xor-4, 8, 16 butterfly).
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 2; ++j) {
      const int h = 2 * t + j;
      if (h >= G) continue;
      float lsum = 0.0f;
      for (int u = 0; u < 8; ++u) lsum += l[4 * u + t][j];
      if (g == 0) mg.m[warp * 8 + h] = m[lane][j], mg.l[warp * 8 + h] = lsum;
      for (int mt = 0; mt < kMT; ++mt)
        for (int hi = 0; hi < 2; ++hi)
          mg.o[(static_cast<size_t>(warp) * 8 + h) * kD + attn::value_channel_t(mt, g, hi)] = o[lane][mt][2 * hi + j];
    }
  }
}

// One warp of the BF16 kernel (S = Q·Kᵀ with A rows 8..15 empty).
template <int kD>
void emulate_warp_bf16(const PagedKvCase& c, int b, int kvh, int warp, int warps, attn::Range tiles, int len,
                       float score_scale, int G, const std::array<std::array<std::array<uint32_t, 2>, kD / 16>, 32>& qa, Merge& mg) {
  using Geo = attn::Geometry<false, kD>;
  constexpr int kKSteps = kD / 16, kNTiles = kD / 8;
  std::array<float, 32> m, l;
  m.fill(-INFINITY);
  l.fill(0.0f);
  std::array<std::array<std::array<float, 2>, kNTiles>, 32> o{};
  for (int tile = tiles.begin + warp; tile < tiles.end; tile += warps) {
    const std::vector<uint8_t> st = fill_stage<false, kD>(c, b, kvh, tile, len);
    const int tok0 = tile * attn::kTile;
    std::array<int, 32> addr{};
    std::array<std::array<std::array<float, 2>, 2>, 32> s{};
    for (int ks = 0; ks < kKSteps; ++ks) {
      for (int lane = 0; lane < 32; ++lane) addr[lane] = attn::ldmatrix_pair_offset<Geo::kRowChunks>(lane, 2 * ks);
      const Regs w = ldmatrix_x4(st, addr, false);
      for (int nt = 0; nt < 2; ++nt) {
        std::array<uint32_t, 32> a0{}, a2{};
        std::array<std::array<uint32_t, 2>, 32> bb{};
        for (int lane = 0; lane < 32; ++lane) {
          a0[lane] = qa[lane][ks][0], a2[lane] = qa[lane][ks][1];
          bb[lane] = {w[lane][nt], w[lane][2 + nt]};
        }
        Acc2 acc{};
        for (int lane = 0; lane < 32; ++lane) acc[lane] = s[lane][nt];
        mma_rows8(acc, a0, a2, bb);
        for (int lane = 0; lane < 32; ++lane) s[lane][nt] = acc[lane];
      }
    }
    // Online softmax (shuffles over the 4 lanes of a row = lanes 4g .. 4g + 3).
    std::array<std::array<std::array<float, 2>, 2>, 32> p{};
    std::array<float, 32> tmax;
    for (int lane = 0; lane < 32; ++lane) {
      tmax[lane] = -INFINITY;
      for (int nt = 0; nt < 2; ++nt)
        for (int j = 0; j < 2; ++j) {
          const bool valid = tok0 + attn::score_token(lane % 4, nt, j) < len;
          s[lane][nt][j] = valid ? s[lane][nt][j] * score_scale : -INFINITY;
          tmax[lane] = std::max(tmax[lane], s[lane][nt][j]);
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
      float rmax = -INFINITY;
      for (int u = 0; u < 4; ++u) rmax = std::max(rmax, tmax[(lane & ~3) + u]);
      const float m_new = std::max(m[lane], rmax);
      const float alpha = std::exp2(m[lane] - m_new);
      float psum = 0.0f;
      for (int nt = 0; nt < 2; ++nt)
        for (int j = 0; j < 2; ++j) psum += (p[lane][nt][j] = std::exp2(s[lane][nt][j] - m_new));
      l[lane] = std::fma(l[lane], alpha, psum);
      m[lane] = m_new;
      for (auto& x : o[lane]) x[0] *= alpha, x[1] *= alpha;
    }
    // O += P·V.
    for (int cp = 0; cp < Geo::kRowChunks; cp += 2) {
      for (int lane = 0; lane < 32; ++lane)
        addr[lane] = Geo::kStageCodeBytes + attn::ldmatrix_pair_offset<Geo::kRowChunks>(lane, cp);
      const Regs w = ldmatrix_x4(st, addr, true);
      for (int d = 0; d < 2; ++d) {
        const int nt = cp + d;
        std::array<uint32_t, 32> a0{}, a2{};
        std::array<std::array<uint32_t, 2>, 32> bb{};
        for (int lane = 0; lane < 32; ++lane) {
          a0[lane] = pack_bf16x2(p[lane][0][0], p[lane][0][1]);
          a2[lane] = pack_bf16x2(p[lane][1][0], p[lane][1][1]);
          bb[lane] = {w[lane][2 * d], w[lane][2 * d + 1]};
        }
        Acc2 acc{};
        for (int lane = 0; lane < 32; ++lane) acc[lane] = o[lane][nt];
        mma_rows8(acc, a0, a2, bb);
        for (int lane = 0; lane < 32; ++lane) o[lane][nt] = acc[lane];
      }
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int q0 = lane & ~3;  // the kernel's xor-1, xor-2 butterfly
    const float lsum = (l[q0] + l[q0 + 1]) + (l[q0 + 2] + l[q0 + 3]);
    if (g >= G) continue;
    if (t == 0) mg.m[warp * 8 + g] = m[lane], mg.l[warp * 8 + g] = lsum;
    for (int nt = 0; nt < kNTiles; ++nt)
      for (int j = 0; j < 2; ++j)
        mg.o[(static_cast<size_t>(warp) * 8 + g) * kD + attn::value_channel_bf16(nt, 2 * t + j)] = o[lane][nt][j];
  }
}

template <bool kInt4, int kD>
void emulate_cta(const PagedKvCase& c, int b, int kvh, int split, int splits, int warps, Outputs& res) {
  using Geo = attn::Geometry<kInt4, kD>;
  constexpr int kKSteps = kD / 16, G4 = Geo::kGroups;
  const int G = c.n_heads / c.n_kv_heads;
  const int len = std::max(0, std::min(c.seq_lens[static_cast<size_t>(b)], c.max_pages * attn::kPageTokens));
  const attn::Range tiles = attn::split_range(attn::tiles_for(len), splits, split);
  const float score_scale = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
  const int64_t head0 = int64_t{b} * c.n_heads + int64_t{kvh} * G;

  // Q fragments, as load_q builds them (the A operand of S for BF16, the B operand of Sᵀ for INT4: one layout).
  std::array<std::array<std::array<uint32_t, 2>, kKSteps>, 32> qa{};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    if (g >= G) continue;
    const uint16_t* qrow = c.q_bf16.data() + (head0 + g) * kD;
    auto word = [&](int ch) { return qrow[ch] | (static_cast<uint32_t>(qrow[ch + 1]) << 16); };
    if constexpr (kInt4) {
      for (int gi = 0; gi < G4; ++gi) {
        const int base = 32 * gi + 8 * t;
        const uint32_t x = word(base), y = word(base + 2), z = word(base + 4), w = word(base + 6);
        qa[lane][2 * gi] = {prmt(x, z, 0x5410), prmt(x, z, 0x7632)};
        qa[lane][2 * gi + 1] = {prmt(y, w, 0x5410), prmt(y, w, 0x7632)};
      }
    } else {
      for (int ks = 0; ks < kKSteps; ++ks)
        for (int r = 0; r < 2; ++r) qa[lane][ks][r] = word(attn::key_channel_bf16(ks, t, r, 0));
    }
  }

  Merge mg{std::vector<float>(static_cast<size_t>(warps) * 8, -INFINITY),
           std::vector<float>(static_cast<size_t>(warps) * 8, 0.0f),
           std::vector<float>(static_cast<size_t>(warps) * 8 * kD, 0.0f)};
  for (int warp = 0; warp < warps; ++warp) {
    if constexpr (kInt4) {
      emulate_warp_int4<kD>(c, b, kvh, warp, warps, tiles, len, score_scale, G, qa, mg);
    } else {
      emulate_warp_bf16<kD>(c, b, kvh, warp, warps, tiles, len, score_scale, G, qa, mg);
    }
  }
  const std::vector<float>&red_m = mg.m, &red_l = mg.l, &red_o = mg.o;
  for (int h = 0; h < G; ++h) {
    float mx = -INFINITY;
    for (int w = 0; w < warps; ++w) mx = std::max(mx, red_m[w * 8 + h]);
    for (int ch = 0; ch < kD; ++ch) {
      float num = 0.0f, den = 0.0f;
      if (mx != -INFINITY) {
        for (int w = 0; w < warps; ++w) {
          const float wt = std::exp2(red_m[w * 8 + h] - mx);
          num = std::fma(wt, red_o[(static_cast<size_t>(w) * 8 + h) * kD + ch], num);
          den = std::fma(wt, red_l[w * 8 + h], den);
        }
      }
      const float val = den > 0.0f ? num / den : 0.0f;
      if (splits == 1) {
        const size_t idx = static_cast<size_t>((head0 + h) * kD + ch);
        res.out[idx] = bf16_to_f32(f32_to_bf16(val));
        ++res.writes[idx];
      } else {
        const size_t row = static_cast<size_t>((head0 + h) * splits + split);
        res.partial_o[row * kD + static_cast<size_t>(ch)] = val;
        ++res.writes[row * kD + static_cast<size_t>(ch)];
        if (ch == 0) res.partial_lse[row] = den > 0.0f ? mx + std::log2(den) : -INFINITY;
      }
    }
  }
}

template <bool kInt4, int kD>
std::vector<float> emulate(const PagedKvCase& c, int splits, int warps) {
  Outputs res;
  const size_t n = static_cast<size_t>(c.batch) * c.n_heads * kD;
  res.out.assign(n, std::numeric_limits<float>::quiet_NaN());
  res.partial_o.assign(splits > 1 ? n * splits : 0, std::numeric_limits<float>::quiet_NaN());
  res.partial_lse.assign(splits > 1 ? n / kD * splits : 0, std::numeric_limits<float>::quiet_NaN());
  res.writes.assign(splits > 1 ? n * splits : n, 0);
  for (int b = 0; b < c.batch; ++b)
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh)
      for (int sp = 0; sp < splits; ++sp) emulate_cta<kInt4, kD>(c, b, kvh, sp, splits, warps, res);
  for (int w : res.writes) EXPECT_EQ(w, 1) << "an output element written " << w << " times";
  if (splits > 1) {  // the combine kernel, one (b, head) row at a time
    for (size_t bh = 0; bh < n / kD; ++bh) {
      float mx = -INFINITY;
      for (int s = 0; s < splits; ++s) mx = std::max(mx, res.partial_lse[bh * splits + s]);
      std::vector<float> wt(static_cast<size_t>(splits));
      for (int s = 0; s < splits; ++s)
        wt[s] = mx == -INFINITY ? 0.0f : std::exp2(res.partial_lse[bh * splits + s] - mx);
      for (int ch = 0; ch < kD; ++ch) {
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < splits; ++s) {
          num = std::fma(wt[s], res.partial_o[(bh * splits + s) * kD + ch], num);
          den += wt[s];
        }
        res.out[bh * kD + ch] = bf16_to_f32(f32_to_bf16(den > 0.0f ? num / den : 0.0f));
      }
    }
  }
  return res.out;
}

// warps: the CTA's (attn::kWarps, or 8 for the INT4 head_dim 128 instances; attn::CtaShape).
void check_case(KvFormat format, int d, int n_heads, int n_kv, const std::vector<int32_t>& lens, int splits,
                uint32_t seed, int warps = attn::kWarps) {
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " head_dim " << d << " heads " << n_heads << "/"
                                  << n_kv << " splits " << splits << " warps " << warps << " seed " << seed);
  const PagedKvCase c = test::make_paged_kv_case(format, d, n_heads, n_kv, lens, seed);
  std::vector<float> abs_ref;
  const std::vector<float> ref = ref::paged_decode_attention(c.cache(), c.seq_lens, c.q, n_heads, &abs_ref);
  const bool int4 = format != KvFormat::BF16;
  const std::vector<float> got =
      int4 ? (d == 128 ? emulate<true, 128>(c, splits, warps) : emulate<true, 64>(c, splits, warps))
           : (d == 128 ? emulate<false, 128>(c, splits, warps) : emulate<false, 64>(c, splits, warps));
  ASSERT_EQ(got.size(), ref.size());
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " not written (or NaN)";
    const double bound = test::kAttnOutputRel * std::fabs(ref[i]) + test::kAttnProbRel * abs_ref[i];
    ASSERT_LE(std::fabs(got[i] - ref[i]), bound) << "element " << i << " (sequence " << i / (n_heads * d) << ", head "
                                                 << i / d % n_heads << ", channel " << i % d << ")";
    err2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-30)), test::kAttnRelL2);
}

const std::vector<int32_t> kLens = {1, 17, 64, 100, 700};

TEST(AttentionDecodeEmulation, Int4HeadDim128) {
  check_case(KvFormat::INT4, 128, 16, 2, kLens, 1, 11);
  check_case(KvFormat::INT4, 128, 8, 1, kLens, 3, 12);
  check_case(KvFormat::INT4, 128, 2, 2, {700, 33}, 5, 13);
  check_case(KvFormat::INT4, 128, 4, 1, {4097, 1, 65}, 9, 14);  // page-crossing splits, more splits than tiles
}

// The 8-warp CTAs (attn::CtaShape<true, 128, 8>): tiles dealt round-robin to 8 warps, 8 partial states merged.
TEST(AttentionDecodeEmulation, Int4HeadDim128EightWarps) {
  static_assert(attn::CtaShape<true, 128, 8>::kThreadsPerCta == 8 * attn::kWarpSize);
  check_case(KvFormat::INT4, 128, 16, 2, kLens, 1, 41, 8);
  check_case(KvFormat::INT4_HADAMARD, 128, 8, 1, {700, 5, 129}, 3, 42, 8);  // warps with no tile in a split
  check_case(KvFormat::INT4, 128, 4, 4, {4097, 1}, 9, 43, 8);
}

TEST(AttentionDecodeEmulation, Int4HadamardHeadDim128AndHeadDim64) {
  check_case(KvFormat::INT4_HADAMARD, 128, 8, 2, kLens, 2, 21);
  check_case(KvFormat::INT4_HADAMARD, 64, 16, 4, kLens, 1, 22);
  check_case(KvFormat::INT4, 64, 8, 1, {1, 300}, 7, 23);
  check_case(KvFormat::INT4, 64, 3, 3, {4097, 18}, 2, 24);
}

TEST(AttentionDecodeEmulation, Bf16CacheBothHeadDims) {
  check_case(KvFormat::BF16, 128, 8, 2, kLens, 1, 31);
  check_case(KvFormat::BF16, 128, 8, 1, {129, 1}, 4, 32);
  check_case(KvFormat::BF16, 64, 12, 3, kLens, 3, 33);
}

}  // namespace
