// CPU checks of the paged prefill-attention kernel (src/cuda/attention_prefill.cuh) that run without a GPU:
//  1. the block geometry of src/cuda/attention_prefill_layout.h matches formats::kv_page_layout, the row swizzle is a
//     conflict-free permutation, the ldmatrix lane maps deliver the mma B fragments of the PTX ISA, the INT4
//     dequantisation (prmt / lop3 / bf16x2 subtract) gives u − z exactly, and the tiles cover every query vector once;
//  2. a lane-by-lane emulation of whole CTAs — page copies (zero-fill past the tile's keys), dequantisation into the
//     swizzled block, Q fragment loads, ldmatrix addresses, mma fragments, per-group key scales, causal masking and
//     the skipped 16-token parts, the online softmax with its shuffles, P' packing with the value scales, the output
//     stores — matches the CPU twin (ref::paged_decode_attention, one decode query per row) within the GPU test's
//     tolerances and writes every output of every chunk row exactly once.
// The fragment tables come from tests/mma_m16n8k16_model.h (written from the PTX ISA), not from the layout header.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda/attention_prefill_layout.h"
#include "futransformer/dtype.h"
#include "mma_m16n8k16_model.h"
#include "paged_kv_case.h"

namespace {

using namespace futransformer;
namespace pf = futransformer::cuda::prefill;
using formats::KvFormat;
using namespace test::mma;

// --- PTX ISA models of the instructions the kernel uses. ---
uint32_t sub_bf16x2(uint32_t a, uint32_t b) { return pack_bf16x2(lo_f(a) - lo_f(b), hi_f(a) - hi_f(b)); }
uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {  // byte i = byte (sel nibble i & 7) of {b, a}
  const uint64_t x = a | (static_cast<uint64_t>(b) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
uint32_t load32(const std::vector<uint8_t>& m, size_t off) {
  uint32_t v;
  std::memcpy(&v, m.data() + off, 4);
  return v;
}
uint32_t load16(const std::vector<uint8_t>& m, size_t off) { return m[off] | (m[off + 1] << 8); }

using Regs = std::array<std::array<uint32_t, 4>, 32>;
// ldmatrix.x4 (.trans): lanes 8j .. 8j + 7 address the rows of matrix j. Plain: lane l receives row l / 4,
// b16 columns 2 (l % 4) + {0, 1}. Transposed: rows 2 (l % 4) + {0, 1} of b16 column l / 4.
Regs ldmatrix_x4(const std::vector<uint8_t>& smem, const std::array<int, 32>& addr, bool trans) {
  Regs out{};
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(addr[static_cast<size_t>(lane)] % 16, 0);
    EXPECT_LE(addr[static_cast<size_t>(lane)] + 16, static_cast<int>(smem.size()));
  }
  for (int j = 0; j < 4; ++j) {
    for (int lane = 0; lane < 32; ++lane) {
      if (!trans) {
        out[lane][j] = load32(smem, addr[8 * j + lane / 4] + 4 * (lane % 4));
      } else {
        const int col = 2 * (lane / 4);
        out[lane][j] =
            load16(smem, addr[8 * j + 2 * (lane % 4)] + col) | (load16(smem, addr[8 * j + 2 * (lane % 4) + 1] + col) << 16);
      }
    }
  }
  return out;
}

// --- 1. Geometry and index maps. ---

template <bool kInt4, int kD>
void check_geometry(KvFormat f) {
  using L = pf::Layout<kInt4, kD>;
  const formats::KvPageLayout canon = formats::kv_page_layout(f, kD);
  EXPECT_EQ(L::kRawPageBytes, canon.page_bytes);
  EXPECT_EQ(L::Page::kPagePartBytes, canon.codes[1]);
  if (kInt4) {
    EXPECT_EQ(L::Page::kPageCodeBytes, canon.scales[0]);
    EXPECT_EQ(L::Page::kPageCodeBytes + L::Page::kPageScaleBytes, canon.zeros[0]);
    EXPECT_EQ(L::kCodeRowBytes, canon.code_row_bytes);
  } else {
    EXPECT_EQ(L::kRowBytes, canon.code_row_bytes);
  }
  EXPECT_LE(L::kSmemBytes, 227 * 1024);
  // Swizzle: a permutation of each row's chunks; the 8 rows one ldmatrix matrix reads (any 8 consecutive tokens at
  // one logical chunk) land in 8 different 16-byte bank groups.
  for (int row = 0; row < pf::kBlockTokens; ++row) {
    std::vector<int> seen(L::kRowChunks, 0);
    for (int c = 0; c < L::kRowChunks; ++c) {
      const int off = pf::block_chunk_offset(L::kRowChunks, row, c);
      ASSERT_EQ(off / L::kRowBytes, row);
      ++seen[static_cast<size_t>(off % L::kRowBytes / pf::kChunk)];
    }
    for (int s : seen) ASSERT_EQ(s, 1);
  }
  for (int r0 = 0; r0 + 8 <= pf::kBlockTokens; r0 += 8) {
    for (int c = 0; c < L::kRowChunks; ++c) {
      std::vector<int> banks(8, 0);
      for (int r = r0; r < r0 + 8; ++r) ++banks[static_cast<size_t>(pf::block_chunk_offset(L::kRowChunks, r, c) / 16 % 8)];
      for (int b : banks) ASSERT_EQ(b, 1) << "rows " << r0 << "+8 chunk " << c;
    }
  }
}

TEST(AttentionPrefillLayout, GeometryMatchesTheCanonicalPagesAndTheSwizzleIsConflictFree) {
  check_geometry<true, 128>(KvFormat::INT4);
  check_geometry<true, 64>(KvFormat::INT4_HADAMARD);
  check_geometry<false, 128>(KvFormat::BF16);
  check_geometry<false, 64>(KvFormat::BF16);
}

// A block whose BF16 element (token, channel) holds a code of both, read through the kernel's ldmatrix addresses:
// every lane must get exactly the B fragment the PTX table asks for.
TEST(AttentionPrefillLayout, LdmatrixMapsDeliverTheMmaBFragments) {
  constexpr int kD = 128, kRowChunks = kD / 8;
  std::vector<uint8_t> blk(static_cast<size_t>(pf::kBlockTokens) * 2 * kD);
  auto code = [](int token, int ch) { return static_cast<uint16_t>(token * 256 + ch); };
  for (int tok = 0; tok < pf::kBlockTokens; ++tok) {
    for (int ch = 0; ch < kD; ++ch) {
      const size_t off = static_cast<size_t>(pf::block_chunk_offset(kRowChunks, tok, ch / 8)) + 2 * (ch % 8);
      const uint16_t v = code(tok, ch);
      std::memcpy(&blk[off], &v, 2);
    }
  }
  auto addr_of = [&](int tok, int chunk) { return pf::block_chunk_offset(kRowChunks, tok, chunk); };
  for (int p = 0; p < 4; ++p) {
    for (int ks = 0; ks < kD / 16; ++ks) {
      std::array<int, 32> addr{};
      for (int lane = 0; lane < 32; ++lane)
        addr[lane] = addr_of(pf::key_ldmatrix_token(lane, p), pf::key_ldmatrix_chunk(lane, ks));
      const Regs w = ldmatrix_x4(blk, addr, false);
      for (int lane = 0; lane < 32; ++lane) {
        for (int nt = 0; nt < 2; ++nt) {
          for (int r = 0; r < 2; ++r) {
            for (int h = 0; h < 2; ++h) {
              const RC kn = ptx_b(lane, r, h);  // k = channel within the k-step, n = token within the n-tile
              const uint32_t got = (w[lane][2 * nt + r] >> (16 * h)) & 0xffff;
              ASSERT_EQ(got, code(16 * p + 8 * nt + kn.c, 16 * ks + kn.r)) << "S pair " << p << " ks " << ks;
            }
          }
        }
      }
    }
  }
  for (int kk = 0; kk < 4; ++kk) {
    for (int c = 0; c < kD / 8; c += 2) {
      std::array<int, 32> addr{};
      for (int lane = 0; lane < 32; ++lane)
        addr[lane] = addr_of(pf::value_ldmatrix_token(lane, kk), pf::value_ldmatrix_chunk(lane, c));
      const Regs w = ldmatrix_x4(blk, addr, true);
      for (int lane = 0; lane < 32; ++lane) {
        for (int nt = 0; nt < 2; ++nt) {
          for (int r = 0; r < 2; ++r) {
            for (int h = 0; h < 2; ++h) {
              const RC kn = ptx_b(lane, r, h);  // k = token within the k-step, n = channel within the n-tile
              const uint32_t got = (w[lane][2 * nt + r] >> (16 * h)) & 0xffff;
              ASSERT_EQ(got, code(16 * kk + kn.r, 8 * (c + nt) + kn.c)) << "PV k-step " << kk << " chunk " << c;
            }
          }
        }
      }
    }
  }
}

// The kernel's dequantisation of one 32-bit code word (8 channels, nibble 2j / 2j + 1 = low / high of byte j).
std::array<uint32_t, 4> dequant_word(uint32_t code, uint32_t z) {
  const uint32_t bias = (z * 0x00010001u) | 0x43004300u;
  std::array<uint32_t, 4> o{};
  for (int j = 0; j < 4; ++j)
    o[j] = sub_bf16x2((prmt(code, code >> 4, pf::dequant_selector(j)) & 0x000f000fu) | 0x43004300u, bias);
  return o;
}

TEST(AttentionPrefillLayout, DequantisationGivesExactIntegersInChannelOrder) {
  std::mt19937 rng(5);
  for (int it = 0; it < 2000; ++it) {
    const uint32_t code = rng(), z = rng() % 16;
    const std::array<uint32_t, 4> o = dequant_word(code, z);
    for (int ch = 0; ch < 8; ++ch) {
      const int u = static_cast<int>((code >> (4 * ch)) & 15);  // channel ch: byte ch/2, low nibble for even ch
      const float got = ch % 2 ? hi_f(o[static_cast<size_t>(ch / 2)]) : lo_f(o[static_cast<size_t>(ch / 2)]);
      ASSERT_EQ(got, static_cast<float>(u - static_cast<int>(z))) << "code " << code << " z " << z << " ch " << ch;
    }
  }
}

TEST(AttentionPrefillLayout, TilesCoverEveryVectorOnceAndReadTheirKeys) {
  for (int G : {1, 3, 4, 7, 8}) {
    for (int rows : {1, 2, 17, 63, 64, 65, 200}) {
      for (int start : {0, 37, 3000}) {
        const int capacity = ((start + rows + 63) / 64) * 64;
        std::vector<int> seen(static_cast<size_t>(rows * G), 0);
        for (int tile = 0; tile < pf::tiles_for_rows(rows, G); ++tile) {
          const pf::TileWork w = pf::tile_work(rows, G, start, capacity, tile);
          ASSERT_LT(w.v_begin, w.v_end);
          ASSERT_LE(w.v_end - w.v_begin, pf::kTileVectors);
          for (int v = w.v_begin; v < w.v_end; ++v) ++seen[static_cast<size_t>(v)];
          ASSERT_EQ(w.kv_len, start + (w.v_end - 1) / G + 1);
          ASSERT_EQ(w.blocks, (w.kv_len + 63) / 64);
          for (int warp = 0; warp < pf::kWarps; ++warp) {
            for (int r = 0; r < 16; ++r) {
              const int v = pf::warp_row_vector(w, warp, r);
              ASSERT_TRUE(v >= w.v_begin && v < w.v_end);
            }
          }
        }
        for (int s : seen) ASSERT_EQ(s, 1) << "G " << G << " rows " << rows;
        EXPECT_EQ(pf::tile_work(rows, G, start, capacity, pf::tiles_for_rows(rows, G)).blocks, 0);
      }
    }
  }
  // Positions past the block table's capacity are clamped to its last slot.
  EXPECT_EQ(pf::vector_position(100, 50, 1, 128), 127);
  EXPECT_EQ(pf::tile_work(64, 1, 100, 128, 0).kv_len, 128);
}

// --- 2. Lane-by-lane emulation of the kernel. ---

struct ChunkSpec {
  int start, rows;
};

struct Case {
  test::PagedKvCase kv;
  std::vector<ChunkSpec> chunks;
  std::vector<int32_t> first_row, start_pos;
  int rows = 0, max_chunk_rows = 0;
  std::vector<uint16_t> q_bf16;
  std::vector<float> q;
};

Case make_case(KvFormat f, int d, int n_heads, int n_kv, const std::vector<ChunkSpec>& chunks, uint32_t seed) {
  Case c;
  std::vector<int32_t> lens;
  for (const ChunkSpec& s : chunks) lens.push_back(s.start + s.rows);
  c.kv = test::make_paged_kv_case(f, d, n_heads, n_kv, lens, seed);
  c.chunks = chunks;
  c.first_row.push_back(0);
  for (const ChunkSpec& s : chunks) {
    c.first_row.push_back(c.first_row.back() + s.rows);
    c.start_pos.push_back(s.start);
    c.max_chunk_rows = std::max(c.max_chunk_rows, s.rows);
  }
  c.rows = c.first_row.back();
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  c.q.resize(static_cast<size_t>(c.rows) * n_heads * d);
  for (float& v : c.q) v = 0.5f * normal(rng);
  formats::kv_rotate_query(f, d, c.q);
  c.q_bf16.resize(c.q.size());
  for (size_t i = 0; i < c.q.size(); ++i) {
    c.q_bf16[i] = f32_to_bf16(c.q[i]);
    c.q[i] = bf16_to_f32(c.q_bf16[i]);
  }
  return c;
}

// The registers of one warp's lanes (A rows g and g + 8 of each lane).
struct WarpState {
  std::array<std::array<int, 2>, 32> vec{}, pos{};
  int v0 = 0, min_pos = 0, max_pos = 0;
  bool active = false;
  std::vector<AFrag> qa;  // [k-step]
  std::vector<Acc> o;     // [n-tile]
  std::array<std::array<float, 2>, 32> m{}, l{};
};

// One CTA (chunk, kvh, blockIdx.x = bx), as the kernel computes it; writes[i] counts the stores of element i.
template <bool kInt4, int kD>
void emulate_cta(const Case& c, int chunk, int kvh, int bx, std::vector<float>& out, std::vector<int>& writes) {
  using L = pf::Layout<kInt4, kD>;
  constexpr int kKSteps = kD / 16, kNTiles = kD / 8;
  const int G = c.kv.n_heads / c.kv.n_kv_heads, n_heads = c.kv.n_heads;
  const int first_row = c.first_row[static_cast<size_t>(chunk)];
  const int n_rows = std::min({c.first_row[static_cast<size_t>(chunk) + 1] - first_row, c.max_chunk_rows,
                               c.rows - first_row});
  if (first_row < 0 || n_rows <= 0) return;
  const int tile = pf::tiles_for_rows(n_rows, G) - 1 - bx;
  if (tile < 0) return;
  const int start = std::max(0, c.start_pos[static_cast<size_t>(chunk)]);
  const int capacity = c.kv.max_pages * pf::kBlockTokens;
  const pf::TileWork work = pf::tile_work(n_rows, G, start, capacity, tile);

  std::vector<WarpState> ws(pf::kWarps);
  for (int warp = 0; warp < pf::kWarps; ++warp) {
    WarpState& w = ws[static_cast<size_t>(warp)];
    w.qa.resize(kKSteps);
    w.o.resize(kNTiles);
    w.v0 = work.v_begin + 16 * warp;
    w.active = w.v0 < work.v_end;
    w.min_pos = pf::vector_position(start, pf::warp_row_vector(work, warp, 0), G, capacity);
    w.max_pos = pf::vector_position(start, pf::warp_row_vector(work, warp, 15), G, capacity);
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int r = 0; r < 2; ++r) {
        w.vec[lane][r] = pf::warp_row_vector(work, warp, g + 8 * r);
        w.pos[lane][r] = pf::vector_position(start, w.vec[lane][r], G, capacity);
        w.m[lane][r] = -std::numeric_limits<float>::infinity();
        w.l[lane][r] = 0.0f;
      }
      for (int ks = 0; ks < kKSteps; ++ks) {
        for (int reg = 0; reg < 4; ++reg) {
          const int v = w.vec[lane][reg & 1];
          const size_t base = (static_cast<size_t>(first_row + v / G) * n_heads + kvh * G + v % G) * kD;
          const size_t ch = base + 16 * ks + 2 * t + 8 * (reg >> 1);
          w.qa[ks][lane][reg] = c.q_bf16[ch] | (static_cast<uint32_t>(c.q_bf16[ch + 1]) << 16);
        }
      }
      for (Acc& a : w.o) a[lane] = {0.0f, 0.0f, 0.0f, 0.0f};
    }
  }

  std::vector<uint8_t> smem(static_cast<size_t>(L::kSmemBytes), 0xAB);  // garbage where nothing was written
  const int32_t* bt = c.kv.block_table.data() + static_cast<size_t>(chunk) * c.kv.max_pages;
  for (int j = 0; j < work.blocks; ++j) {
    const int valid = work.kv_len - j * pf::kBlockTokens;
    const uint8_t* page = c.kv.pool.data() + (static_cast<size_t>(bt[j]) * c.kv.n_kv_heads + kvh) * L::kRawPageBytes;
    const size_t stage = static_cast<size_t>(j & 1) * L::kStageBytes;
    // issue(j): the copy schedule of Block::issue.
    if (kInt4) {
      for (int i = 0; i < L::kRawPageChunks; ++i) std::memcpy(&smem[stage + 16 * i], page + 16 * i, 16);
    } else {
      constexpr int kPartChunks = pf::kBlockTokens * L::kRowChunks;
      for (int i = 0; i < 2 * kPartChunks; ++i) {
        const int part = i / kPartChunks, row = (i % kPartChunks) / L::kRowChunks, col = i % L::kRowChunks;
        uint8_t* dst = &smem[stage + part * L::kPartBytes + pf::block_chunk_offset(L::kRowChunks, row, col)];
        if (row < valid) {
          std::memcpy(dst, page + part * L::kPartBytes + row * L::kRowBytes + col * 16, 16);
        } else {
          std::memset(dst, 0, 16);
        }
      }
    }
    size_t blk = stage;
    if (kInt4) {
      blk = L::kBlockOffset;
      using Page = typename L::Page;
      constexpr int kPartWords = pf::kBlockTokens * L::kCodeWords;
      for (int i = 0; i < 2 * kPartWords; ++i) {
        const int part = i / kPartWords, row = (i % kPartWords) / L::kCodeWords, w = i % L::kCodeWords;
        const size_t src = stage + part * Page::kPagePartBytes;
        std::array<uint32_t, 4> v{};
        if (row < valid) {
          const uint32_t code = load32(smem, src + row * L::kCodeRowBytes + 4 * w);
          const uint32_t z = smem[src + Page::kPageCodeBytes + Page::kPageScaleBytes + row * L::kGroups + w / 4];
          v = dequant_word(code, z);
        }
        std::memcpy(&smem[blk + part * L::kPartBytes + pf::block_chunk_offset(L::kRowChunks, row, w)], v.data(), 16);
      }
      for (int i = 0; i < 2 * pf::kBlockTokens * L::kGroups; ++i) {
        const int part = i / (pf::kBlockTokens * L::kGroups), rem = i % (pf::kBlockTokens * L::kGroups);
        const int row = rem / L::kGroups, gi = rem % L::kGroups;
        const float s = row < valid ? f16_to_f32(static_cast<uint16_t>(load16(
                                          smem, stage + part * Page::kPagePartBytes + Page::kPageCodeBytes +
                                                    (row * L::kGroups + gi) * 2)))
                                    : 0.0f;
        std::memcpy(&smem[blk + 2 * L::kPartBytes + ((part * L::kGroups + gi) * pf::kBlockTokens + row) * 4], &s, 4);
      }
    }
    auto fl = [&](size_t off) {
      float v;
      std::memcpy(&v, &smem[off], 4);
      return v;
    };
    const int kb = j * pf::kBlockTokens;
    for (int warp = 0; warp < pf::kWarps; ++warp) {
      WarpState& w = ws[static_cast<size_t>(warp)];
      if (!w.active || kb > w.max_pos) continue;
      const bool masked = kb + pf::kBlockTokens - 1 > w.min_pos;
      const int n_pairs = masked ? std::min(4, (w.max_pos - kb) / 16 + 1) : 4;
      std::vector<Acc> s(8);
      for (Acc& a : s)
        for (auto& x : a) x = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int p = 0; p < n_pairs; ++p) {
        for (int gi = 0; gi < (kInt4 ? L::kGroups : 1); ++gi) {
          Acc acc[2] = {};
          const int ks0 = kInt4 ? 2 * gi : 0, ks1 = kInt4 ? 2 * gi + 2 : kKSteps;
          for (int ks = ks0; ks < ks1; ++ks) {
            std::array<int, 32> addr{};
            for (int lane = 0; lane < 32; ++lane) {
              const int tok = pf::key_ldmatrix_token(lane, p);
              addr[lane] = static_cast<int>(blk) + tok * L::kRowBytes +
                           ((pf::key_ldmatrix_chunk(lane, ks) ^ (tok & 7)) * pf::kChunk);
            }
            const Regs r = ldmatrix_x4(smem, addr, false);
            BFrag b0{}, b1{};
            for (int lane = 0; lane < 32; ++lane) b0[lane] = {r[lane][0], r[lane][1]}, b1[lane] = {r[lane][2], r[lane][3]};
            mma(kInt4 ? acc[0] : s[2 * p], w.qa[ks], b0);
            mma(kInt4 ? acc[1] : s[2 * p + 1], w.qa[ks], b1);
          }
          if (kInt4) {
            for (int lane = 0; lane < 32; ++lane) {
              const int t = lane & 3;
              for (int nt = 0; nt < 2; ++nt) {
                const size_t so = blk + 2 * L::kPartBytes + (gi * pf::kBlockTokens + 16 * p + 8 * nt + 2 * t) * 4;
                const float sx = fl(so), sy = fl(so + 4);
                for (int e = 0; e < 4; ++e)
                  s[2 * p + nt][lane][e] = std::fma(acc[nt][lane][e], e & 1 ? sy : sx, s[2 * p + nt][lane][e]);
              }
            }
          }
        }
      }
      // Masking, online softmax (row max over the 4 lanes of a row: the two shfl.xor), rescale.
      std::array<std::array<float, 2>, 32> bmax{}, m_use{}, alpha{}, psum{};
      const float scale = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(kD)));
      for (int lane = 0; lane < 32; ++lane) {
        const int t = lane & 3;
        bmax[lane] = {-INFINITY, -INFINITY};
        for (int nt = 0; nt < 8; ++nt) {
          for (int e = 0; e < 4; ++e) {
            const int tok = kb + 8 * nt + 2 * t + (e & 1);
            float& x = s[nt][lane][e];
            x = masked && tok > w.pos[lane][e >> 1] ? -INFINITY : x * scale;
            bmax[lane][e >> 1] = std::max(bmax[lane][e >> 1], x);
          }
        }
      }
      for (int lane = 0; lane < 32; ++lane) {
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
          for (int q = 0; q < 4; ++q) mx = std::max(mx, bmax[(lane & ~3) | q][r]);
          const float m_new = std::max(w.m[lane][r], mx);
          m_use[lane][r] = m_new == -INFINITY ? 0.0f : m_new;
          alpha[lane][r] = std::exp2(w.m[lane][r] - m_use[lane][r]);
          w.m[lane][r] = m_new;
        }
      }
      for (int lane = 0; lane < 32; ++lane) {
        for (int nt = 0; nt < 8; ++nt) {
          for (int e = 0; e < 4; ++e) {
            float& x = s[nt][lane][e];
            x = std::exp2(x - m_use[lane][e >> 1]);
            psum[lane][e >> 1] += x;
          }
        }
        for (int r = 0; r < 2; ++r) w.l[lane][r] = std::fma(w.l[lane][r], alpha[lane][r], psum[lane][r]);
        for (Acc& a : w.o)
          for (int e = 0; e < 4; ++e) a[lane][e] *= alpha[lane][e >> 1];
      }
      // O += P'·V.
      for (int kk = 0; kk < n_pairs; ++kk) {
        for (int grp = 0; grp < (kInt4 ? L::kGroups : 1); ++grp) {
          AFrag a{};
          for (int lane = 0; lane < 32; ++lane) {
            const int t = lane & 3;
            float sa[2] = {1.0f, 1.0f}, sb[2] = {1.0f, 1.0f};
            if (kInt4) {
              const size_t so = blk + 2 * L::kPartBytes + L::kScaleBytes + (grp * pf::kBlockTokens + 16 * kk) * 4;
              sa[0] = fl(so + (2 * t) * 4), sa[1] = fl(so + (2 * t + 1) * 4);
              sb[0] = fl(so + (8 + 2 * t) * 4), sb[1] = fl(so + (9 + 2 * t) * 4);
            }
            const auto& p0 = s[2 * kk][lane];
            const auto& p1 = s[2 * kk + 1][lane];
            a[lane] = {pack_bf16x2(p0[0] * sa[0], p0[1] * sa[1]), pack_bf16x2(p0[2] * sa[0], p0[3] * sa[1]),
                       pack_bf16x2(p1[0] * sb[0], p1[1] * sb[1]), pack_bf16x2(p1[2] * sb[0], p1[3] * sb[1])};
          }
          const int c0 = kInt4 ? 4 * grp : 0, c1 = kInt4 ? 4 * grp + 4 : kNTiles;
          for (int cc = c0; cc < c1; cc += 2) {
            std::array<int, 32> addr{};
            for (int lane = 0; lane < 32; ++lane) {
              const int tok = pf::value_ldmatrix_token(lane, kk);
              addr[lane] = static_cast<int>(blk) + L::kPartBytes + tok * L::kRowBytes +
                           ((pf::value_ldmatrix_chunk(lane, cc) ^ (tok & 7)) * pf::kChunk);
            }
            const Regs r = ldmatrix_x4(smem, addr, true);
            BFrag b0{}, b1{};
            for (int lane = 0; lane < 32; ++lane) b0[lane] = {r[lane][0], r[lane][1]}, b1[lane] = {r[lane][2], r[lane][3]};
            mma(w.o[static_cast<size_t>(cc)], a, b0);
            mma(w.o[static_cast<size_t>(cc) + 1], a, b1);
          }
        }
      }
    }
  }
  // Normalise and store.
  for (int warp = 0; warp < pf::kWarps; ++warp) {
    const WarpState& w = ws[static_cast<size_t>(warp)];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int r = 0; r < 2; ++r) {
        float l = 0.0f;
        for (int q = 0; q < 4; ++q) l += w.l[(lane & ~3) | q][r];
        const int v = w.v0 + g + 8 * r;
        if (v >= work.v_end) continue;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const size_t base = (static_cast<size_t>(first_row + v / G) * n_heads + kvh * G + v % G) * kD;
        for (int nt = 0; nt < kNTiles; ++nt) {
          for (int h = 0; h < 2; ++h) {
            const size_t i = base + 8 * nt + 2 * t + h;
            out[i] = bf16_to_f32(f32_to_bf16(w.o[static_cast<size_t>(nt)][lane][2 * r + h] * inv));
            ++writes[i];
          }
        }
      }
    }
  }
}

template <bool kInt4, int kD>
void check_case(KvFormat f, int n_heads, int n_kv, const std::vector<ChunkSpec>& chunks, uint32_t seed) {
  const Case c = make_case(f, kD, n_heads, n_kv, chunks, seed);
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(f) << " head_dim " << kD << " heads " << n_heads << "/"
                                  << n_kv << " seed " << seed);
  std::vector<float> out(c.q.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<int> writes(c.q.size(), 0);
  const int grid_x = pf::tiles_for_rows(c.max_chunk_rows, n_heads / n_kv);
  for (int chunk = 0; chunk < static_cast<int>(chunks.size()); ++chunk)
    for (int kvh = 0; kvh < n_kv; ++kvh)
      for (int bx = 0; bx < grid_x; ++bx) emulate_cta<kInt4, kD>(c, chunk, kvh, bx, out, writes);
  // The twin: one decode query per row.
  std::vector<int32_t> table, lens;
  for (size_t ch = 0; ch < chunks.size(); ++ch) {
    for (int i = 0; i < chunks[ch].rows; ++i) {
      table.insert(table.end(), c.kv.block_table.begin() + static_cast<std::ptrdiff_t>(ch * c.kv.max_pages),
                   c.kv.block_table.begin() + static_cast<std::ptrdiff_t>((ch + 1) * c.kv.max_pages));
      lens.push_back(chunks[ch].start + i + 1);
    }
  }
  std::vector<float> abs_ref;
  const std::vector<float> ref = ref::paged_decode_attention(
      ref::PagedKvCache{c.kv.layout, c.kv.pool, c.kv.n_kv_heads, table, c.kv.max_pages}, lens, c.q, n_heads, &abs_ref);
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(writes[i], 1) << "element " << i << " (row " << i / (static_cast<size_t>(n_heads) * kD) << ")";
    const double bound = test::kAttnOutputRel * std::fabs(ref[i]) + test::kAttnProbRel * abs_ref[i];
    ASSERT_LE(std::fabs(out[i] - ref[i]), bound) << "element " << i << ": got " << out[i] << ", ref " << ref[i];
    err2 += (out[i] - ref[i]) * (out[i] - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  EXPECT_LE(std::sqrt(err2 / ref2), test::kAttnRelL2);
}

// Starts 0, non-multiples of 64 and past a page; chunks of 1, 17, 70 rows and one of no rows.
const std::vector<ChunkSpec> kChunks = {{0, 70}, {37, 17}, {150, 1}, {20, 0}, {64, 20}};

TEST(AttentionPrefillEmulation, Int4HeadDim128) {
  check_case<true, 128>(KvFormat::INT4, 8, 1, kChunks, 11);  // G = 8
  check_case<true, 128>(KvFormat::INT4, 2, 2, kChunks, 12);  // G = 1
}

TEST(AttentionPrefillEmulation, Int4HadamardHeadDim64AndOddGqa) {
  check_case<true, 64>(KvFormat::INT4_HADAMARD, 6, 2, kChunks, 21);  // G = 3: tiles end inside a row
  check_case<true, 64>(KvFormat::INT4_HADAMARD, 4, 1, kChunks, 22);  // G = 4
}

TEST(AttentionPrefillEmulation, Bf16CacheBothHeadDims) {
  check_case<false, 128>(KvFormat::BF16, 4, 1, kChunks, 31);
  check_case<false, 64>(KvFormat::BF16, 14, 2, kChunks, 32);  // G = 7
}

}  // namespace
