// CPU checks of the generic paged decode-attention kernel (src/cuda/attention_generic.cuh) that run without a
// GPU, through the index maps it shares with them (src/cuda/attention_generic_layout.h):
//  1. a chunk decoded from the page offsets equals formats::kv_decode_token bit for bit, every load in bounds
//     and 16-byte aligned;
//  2. for every accepted head_dim the thread roles cover each (token, chunk) of a page exactly once, and the
//     end reduction fits its shared array; the cluster ranks' page runs partition every sequence;
//  3. a thread-by-thread emulation of the kernel (scores on two lanes per token joined by the shuffle, the
//     online softmax, P·V per thread group, the group reduction, the cluster merge) matches the CPU twin
//     ref::paged_decode_attention within the GPU test's tolerances, for 1 and 8 splits and the launcher's choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_generic_check.h"
#include "cuda/attention_generic_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/kv_cache.h"
#include "paged_kv_case.h"
#include "ref/paged_attention.h"

namespace {

using namespace futransformer;
namespace ag = futransformer::cuda::attn_generic;
using formats::KvFormat;
using test::PagedKvCase;

bool is_int4(KvFormat f) { return f == KvFormat::INT4 || f == KvFormat::INT4_HADAMARD; }

// What the launcher passes (src/cuda/attention_generic.cu).
ag::PageGeometry geometry_of(const formats::KvPageLayout& L) {
  ag::PageGeometry g{};
  g.row_bytes = static_cast<int>(L.code_row_bytes);
  g.groups_per_token = static_cast<int>(L.groups);
  for (int p = 0; p < 2; ++p) {
    g.codes[p] = static_cast<int>(L.codes[p]);
    g.scales[p] = static_cast<int>(L.scales[p]);
    g.zeros[p] = static_cast<int>(L.zeros[p]);
  }
  return g;
}

// The kernel's decode_chunk on host memory, with its loads checked against the page.
template <bool kInt4>
void decode_chunk(const formats::KvPageLayout& L, const ag::PageGeometry& g, const uint8_t* page, int part, int slot,
                  int chunk, float (&x)[ag::Format<kInt4>::kChunkChannels]) {
  const int off = ag::chunk_offset(g, part, slot, chunk);
  EXPECT_EQ(off % ag::kChunkBytes, 0);
  EXPECT_LE(off + ag::kChunkBytes, L.page_bytes);
  uint32_t w[4];
  std::memcpy(w, page + off, sizeof(w));
  float s = 0.0f;
  int z = 0;
  if constexpr (kInt4) {
    const int so = ag::scale_offset(g, part, slot, chunk), zo = ag::zero_offset(g, part, slot, chunk);
    EXPECT_EQ(so % 2, 0);
    EXPECT_LE(so + 2, L.page_bytes);
    EXPECT_LT(zo, L.page_bytes);
    s = f16_to_f32(static_cast<uint16_t>(page[so] | (page[so + 1] << 8)));
    z = page[zo];
  }
  ag::decode_chunk_words<kInt4>(w, s, z, x);
}

template <bool kInt4>
void check_chunks_decode_like_the_format(KvFormat f, int head_dim) {
  constexpr int C = ag::Format<kInt4>::kChunkChannels;
  const PagedKvCase c = test::make_paged_kv_case(f, head_dim, 2, 1, {64}, 11 + head_dim);
  const ag::PageGeometry g = geometry_of(c.layout);
  const uint8_t* page = c.pool.data() + static_cast<size_t>(c.block_table[0]) * c.layout.page_bytes;
  std::vector<float> want(static_cast<size_t>(head_dim));
  for (int part = 0; part < 2; ++part) {
    for (int slot = 0; slot < ag::kPageTokens; ++slot) {
      formats::kv_decode_token(c.layout, page, slot, static_cast<formats::KvPart>(part), want);
      for (int chunk = 0; chunk < head_dim / C; ++chunk) {
        float x[C];
        decode_chunk<kInt4>(c.layout, g, page, part, slot, chunk, x);
        for (int k = 0; k < C; ++k) {
          ASSERT_EQ(std::memcmp(&x[k], &want[static_cast<size_t>(chunk * C + k)], 4), 0)
              << formats::kv_format_name(f) << " head_dim " << head_dim << " part " << part << " slot " << slot
              << " channel " << chunk * C + k << ": " << x[k] << " vs " << want[static_cast<size_t>(chunk * C + k)];
        }
      }
    }
  }
}

TEST(AttentionGenericEmulation, ChunksDecodeLikeTheFormat) {
  for (int hd : {8, 16, 24, 96, 128, 512}) check_chunks_decode_like_the_format<false>(KvFormat::BF16, hd);
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    for (int hd : {32, 64, 96, 160, 512}) check_chunks_decode_like_the_format<true>(f, hd);
  }
}

template <bool kInt4>
void check_thread_roles(int head_dim) {
  constexpr int C = ag::Format<kInt4>::kChunkChannels;
  const int chunks = head_dim / C;
  const int groups = ag::pv_groups(chunks);
  SCOPED_TRACE(testing::Message() << (kInt4 ? "int4" : "bf16") << " head_dim " << head_dim);
  ASSERT_GE(groups, 1);
  ASSERT_LE(groups * head_dim, ag::Format<kInt4>::kReduceFloats);
  // Score phase: lanes 2t, 2t + 1 take the chunks of token t with their parity.
  std::vector<int> seen(static_cast<size_t>(ag::kPageTokens * chunks), 0);
  for (int tid = 0; tid < ag::kThreads; ++tid) {
    const int token = tid / ag::kLanesPerToken, half = tid % ag::kLanesPerToken;
    for (int ch = half; ch < chunks; ch += ag::kLanesPerToken) ++seen[static_cast<size_t>(token * chunks + ch)];
  }
  for (int n : seen) ASSERT_EQ(n, 1);
  // P·V phase: active thread (group, chunk) takes tokens group, group + groups, ...
  seen.assign(seen.size(), 0);
  for (int tid = 0; tid < ag::kThreads; ++tid) {
    const int chunk = tid % chunks, group = tid / chunks;
    if (group >= groups) continue;
    for (int t = group; t < ag::kPageTokens; t += groups) ++seen[static_cast<size_t>(t * chunks + chunk)];
  }
  for (int n : seen) ASSERT_EQ(n, 1);
}

TEST(AttentionGenericEmulation, ThreadRolesCoverEveryTokenAndChunkOnce) {
  for (int hd = 8; hd <= ag::kMaxHeadDim; hd += 8) check_thread_roles<false>(hd);
  for (int hd = 32; hd <= ag::kMaxHeadDim; hd += 32) check_thread_roles<true>(hd);
}

TEST(AttentionGenericEmulation, ClusterRanksPartitionThePages) {
  for (int splits = 1; splits <= ag::kMaxSplits; ++splits) {
    for (int n_pages = 0; n_pages <= 200; ++n_pages) {
      int next = 0;
      for (int rank = 0; rank < splits; ++rank) {
        const ag::PageRange r = ag::pages_of_rank(n_pages, splits, rank);
        ASSERT_EQ(r.begin, next) << n_pages << " pages, rank " << rank << " of " << splits;
        ASSERT_GE(r.end, r.begin);
        next = r.end;
      }
      ASSERT_EQ(next, n_pages) << n_pages << " pages over " << splits << " splits";
    }
  }
  EXPECT_EQ(ag::clamped_len(-3, 4), 0);
  EXPECT_EQ(ag::clamped_len(256, 4), 256);
  EXPECT_EQ(ag::clamped_len(257, 4), 256);
  EXPECT_EQ(ag::clamped_len(2147483647, 1 << 24), 1 << 30);
  for (int batch : {1, 2, 7, 64, 65535}) {
    for (int heads : {1, 8, 32, 65535}) {
      for (int pages : {1, 2, 5, 512, 1 << 24}) {
        const int s = ag::splits_for(batch, heads, pages);
        ASSERT_GE(s, 1);
        ASSERT_LE(s, std::min(pages, ag::kMaxSplits));
      }
    }
  }
  EXPECT_EQ(ag::splits_for(1, 32, 512), ag::kMaxSplits);  // one long sequence: a full cluster
  EXPECT_EQ(ag::splits_for(8, 32, 512), 1);               // 256 CTAs already
}

// The kernel, one cluster at a time: the same decomposition and fp32 operation order (fmaf where the kernel
// writes fmaf). Returns the BF16 output bits.
template <bool kInt4>
std::vector<uint16_t> emulate(const PagedKvCase& c, const std::vector<int32_t>& seq_lens, int splits) {
  constexpr int C = ag::Format<kInt4>::kChunkChannels;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int D = c.head_dim, chunks = D / C, groups = ag::pv_groups(chunks), gqa = c.n_heads / c.n_kv_heads;
  const ag::PageGeometry g = geometry_of(c.layout);
  const float score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const size_t n_pool_pages = c.pool.size() / static_cast<size_t>(c.layout.page_bytes * c.n_kv_heads);
  std::vector<uint16_t> out(static_cast<size_t>(c.batch) * c.n_heads * D, 0xFFFF);
  std::vector<int> writes(out.size(), 0);

  struct Cta {
    float m, l;
    std::vector<float> o;
  };
  for (int b = 0; b < c.batch; ++b) {
    const int len = ag::clamped_len(seq_lens[static_cast<size_t>(b)], c.max_pages);
    const int n_pages = (len + ag::kPageTokens - 1) / ag::kPageTokens;
    for (int head = 0; head < c.n_heads; ++head) {
      const int kv_head = head / gqa;
      std::vector<float> q(static_cast<size_t>(D));
      for (int i = 0; i < D; ++i)
        q[static_cast<size_t>(i)] = bf16_to_f32(c.q_bf16[(static_cast<size_t>(b) * c.n_heads + head) * D + i]);
      std::vector<Cta> ctas;
      for (int rank = 0; rank < splits; ++rank) {
        const ag::PageRange range = ag::pages_of_rank(n_pages, splits, rank);
        std::vector<std::vector<float>> acc(ag::kThreads, std::vector<float>(C, 0.0f));
        float m_run = kNegInf, l_run = 0.0f;
        for (int pg = range.begin; pg < range.end; ++pg) {
          const int32_t id = c.block_table[static_cast<size_t>(b) * c.max_pages + pg];
          EXPECT_GE(id, 0);
          EXPECT_LT(static_cast<size_t>(id), n_pool_pages);
          const uint8_t* page =
              c.pool.data() + (static_cast<size_t>(id) * c.n_kv_heads + kv_head) * c.layout.page_bytes;
          const int valid = std::min(ag::kPageTokens, len - pg * ag::kPageTokens);
          EXPECT_GE(valid, 1);
          float p_s[ag::kPageTokens];
          for (int token = 0; token < ag::kPageTokens; ++token) {
            float dot[ag::kLanesPerToken] = {0.0f, 0.0f};
            for (int half = 0; half < ag::kLanesPerToken && token < valid; ++half) {
              for (int ch = half; ch < chunks; ch += ag::kLanesPerToken) {
                float x[C];
                decode_chunk<kInt4>(c.layout, g, page, 0, token, ch, x);
                for (int k = 0; k < C; ++k) dot[half] = std::fmaf(x[k], q[static_cast<size_t>(ch * C + k)], dot[half]);
              }
            }
            p_s[token] = token < valid ? (dot[0] + dot[1]) * score_scale : kNegInf;  // lane 2t's shuffle sum
          }
          float m_page = kNegInf;
          for (int i = 0; i < valid; ++i) m_page = std::fmax(m_page, p_s[i]);
          const float m_new = std::fmax(m_run, m_page);
          const float alpha = std::exp(m_run - m_new);
          for (int i = 0; i < valid; ++i) p_s[i] = std::exp(p_s[i] - m_new);
          float l_page = 0.0f;
          for (int i = 0; i < valid; ++i) l_page += p_s[i];
          l_run = l_run * alpha + l_page;
          m_run = m_new;
          for (int tid = 0; tid < ag::kThreads; ++tid) {
            for (float& a : acc[static_cast<size_t>(tid)]) a *= alpha;
            const int chunk = tid % chunks, group = tid / chunks;
            if (group >= groups) continue;
            for (int i = group; i < valid; i += groups) {
              float x[C];
              decode_chunk<kInt4>(c.layout, g, page, 1, i, chunk, x);
              for (int k = 0; k < C; ++k)
                acc[static_cast<size_t>(tid)][k] = std::fmaf(p_s[i], x[k], acc[static_cast<size_t>(tid)][k]);
            }
          }
        }
        std::vector<float> reduce(static_cast<size_t>(ag::Format<kInt4>::kReduceFloats), std::nanf(""));
        for (int tid = 0; tid < ag::kThreads; ++tid) {
          const int chunk = tid % chunks, group = tid / chunks;
          if (group >= groups) continue;
          for (int k = 0; k < C; ++k)
            reduce.at(static_cast<size_t>(group * D + chunk * C + k)) = acc[static_cast<size_t>(tid)][k];
        }
        Cta cta{m_run, l_run, std::vector<float>(static_cast<size_t>(D))};
        for (int ch = 0; ch < D; ++ch) {
          float s = 0.0f;
          for (int gr = 0; gr < groups; ++gr) s += reduce[static_cast<size_t>(gr * D + ch)];
          cta.o[static_cast<size_t>(ch)] = s;
        }
        ctas.push_back(std::move(cta));
      }
      float m = kNegInf;
      for (const Cta& r : ctas) m = std::fmax(m, r.m);
      const size_t base = (static_cast<size_t>(b) * c.n_heads + head) * D;
      float l = 0.0f;
      if (m != kNegInf) {
        for (const Cta& r : ctas) l += r.l * std::exp(r.m - m);
      }
      for (int ch = 0; ch < D; ++ch) {
        float s = 0.0f;
        if (m != kNegInf) {
          for (const Cta& r : ctas) s += r.o[static_cast<size_t>(ch)] * std::exp(r.m - m);
        }
        out[base + ch] = f32_to_bf16(m == kNegInf ? 0.0f : s / l);
        ++writes[base + ch];
      }
    }
  }
  for (int w : writes) EXPECT_EQ(w, 1);
  return out;
}

std::vector<uint16_t> emulate(const PagedKvCase& c, const std::vector<int32_t>& seq_lens, int splits) {
  return is_int4(c.format) ? emulate<true>(c, seq_lens, splits) : emulate<false>(c, seq_lens, splits);
}

const std::vector<int32_t> kLens = {0, 1, 63, 64, 65, 1000};

void check_against_twin(KvFormat f, int head_dim, int n_heads, int n_kv, const std::vector<int32_t>& lens,
                        uint32_t seed) {
  const PagedKvCase c = test::make_paged_kv_case(f, head_dim, n_heads, n_kv, lens, seed);
  std::vector<float> abs_ref;
  const std::vector<float> ref = ref::paged_decode_attention(c.cache(), c.seq_lens, c.q, n_heads, &abs_ref);
  for (int splits : {1, ag::kMaxSplits, ag::splits_for(c.batch, n_heads, c.max_pages)}) {
    SCOPED_TRACE(testing::Message() << formats::kv_format_name(f) << " head_dim " << head_dim << " heads " << n_heads
                                    << "/" << n_kv << " splits " << splits << " seed " << seed);
    test::expect_close_to_twin(c, emulate(c, c.seq_lens, splits), ref, abs_ref);
  }
}

TEST(AttentionGenericEmulation, MatchesTheTwinBf16) {
  uint32_t seed = 1;
  for (int hd : {8, 24, 96, 256}) {
    for (int gqa : {1, 3}) check_against_twin(KvFormat::BF16, hd, 2 * gqa, 2, kLens, ++seed);
  }
  check_against_twin(KvFormat::BF16, 8, 8, 4, {512, 1, 300}, ++seed);  // stories260K's shape
}

TEST(AttentionGenericEmulation, MatchesTheTwinInt4) {
  uint32_t seed = 100;
  for (KvFormat f : {KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
    for (int hd : {32, 96, 128, 512}) check_against_twin(f, hd, 4, 2, kLens, ++seed);
  }
}

// seq_lens beyond the block table clamp to it, negative ones are empty: the same bits as the exact lengths.
TEST(AttentionGenericEmulation, LengthsAreClamped) {
  const PagedKvCase c = test::make_paged_kv_case(KvFormat::INT4, 64, 4, 2, {192, 192, 0}, 7);
  EXPECT_EQ(emulate(c, {100000, 193, -4}, 3), emulate(c, c.seq_lens, 3));
}

}  // namespace
