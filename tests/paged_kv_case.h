// Random paged KV caches for the decode-attention tests (CPU emulation and GPU): tokens encoded with
// formats::kv_encode_token into pages at random page ids, block tables in shuffled page order, and every byte
// that no token owns (unused pages, slots past a sequence's end) set to 0xFF, which reads as NaN in BF16 and
// FP16 scales: a kernel that lets a missing token into its sums produces NaN.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "futransformer/dtype.h"
#include "futransformer/formats/kv_cache.h"
#include "ref/paged_attention.h"

namespace futransformer::test {

struct PagedKvCase {
  formats::KvFormat format = formats::KvFormat::INT4;
  formats::KvPageLayout layout;
  int batch = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, max_pages = 0, max_seq_len = 0;
  std::vector<int32_t> seq_lens, block_table;
  std::vector<uint8_t> pool;
  std::vector<uint16_t> q_bf16;  // [batch, n_heads, head_dim], rotated for int4-hadamard, then rounded
  std::vector<float> q;          // the same values in fp32 (what the CPU twin sees)

  ref::PagedKvCache cache() const { return ref::PagedKvCache{layout, pool, n_kv_heads, block_table, max_pages}; }
};

// lens: one length per sequence. spare_pages unused pages are mixed into the pool.
inline PagedKvCase make_paged_kv_case(formats::KvFormat format, int head_dim, int n_heads, int n_kv_heads,
                                      const std::vector<int32_t>& lens, uint32_t seed, int spare_pages = 3) {
  PagedKvCase c;
  c.format = format;
  c.layout = formats::kv_page_layout(format, head_dim);
  c.batch = static_cast<int>(lens.size());
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.seq_lens = lens;
  const int P = static_cast<int>(c.layout.page_tokens);
  int total_pages = spare_pages;
  for (int32_t len : lens) {
    c.max_pages = std::max(c.max_pages, (len + P - 1) / P);
    c.max_seq_len = std::max(c.max_seq_len, static_cast<int>(len));
    total_pages += (len + P - 1) / P;
  }
  c.max_pages = std::max(c.max_pages, 1);
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(total_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.block_table.assign(static_cast<size_t>(c.batch) * c.max_pages, -1);  // entries past a sequence stay unused
  size_t next = 0;
  for (int b = 0; b < c.batch; ++b) {
    for (int i = 0; i < (lens[static_cast<size_t>(b)] + P - 1) / P; ++i) {
      c.block_table[static_cast<size_t>(b) * c.max_pages + i] = ids[next++];
    }
  }
  const size_t page_bytes = static_cast<size_t>(c.layout.page_bytes);
  c.pool.assign(static_cast<size_t>(total_pages) * n_kv_heads * page_bytes, 0xFF);

  // Keys with a few stronger channels (as after RoPE in real models), values N(0, 1), queries scaled so the
  // softmax is neither flat nor one-hot.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> channel_gain(static_cast<size_t>(head_dim), 1.0f);
  for (int i = 0; i < 4; ++i) channel_gain[rng() % static_cast<size_t>(head_dim)] = 4.0f;
  std::vector<float> x(static_cast<size_t>(head_dim));
  for (int b = 0; b < c.batch; ++b) {
    for (int t = 0; t < lens[static_cast<size_t>(b)]; ++t) {
      const int32_t page = c.block_table[static_cast<size_t>(b) * c.max_pages + t / P];
      for (int h = 0; h < n_kv_heads; ++h) {
        uint8_t* p = c.pool.data() + (static_cast<size_t>(page) * n_kv_heads + h) * page_bytes;
        for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * channel_gain[i];
        formats::kv_encode_token(c.layout, p, t % P, formats::KvPart::K, x);
        for (float& v : x) v = normal(rng);
        formats::kv_encode_token(c.layout, p, t % P, formats::KvPart::V, x);
      }
    }
  }
  c.q.resize(static_cast<size_t>(c.batch) * n_heads * head_dim);
  for (float& v : c.q) v = 0.5f * normal(rng);
  formats::kv_rotate_query(format, head_dim, c.q);
  c.q_bf16.resize(c.q.size());
  for (size_t i = 0; i < c.q.size(); ++i) {
    c.q_bf16[i] = f32_to_bf16(c.q[i]);
    c.q[i] = bf16_to_f32(c.q_bf16[i]);
  }
  return c;
}

// Tolerances against the CPU twin, from the number formats. BF16 keeps 8 significant bits: rounding to it
// errs by at most 2^-8 relative (half an ulp at the bottom of a binade). The output is rounded once to BF16:
// 2^-8 |out|. The kernel rounds each probability (times the token's value scale, INT4) to BF16 before P·V: at
// most 2^-8 of Σ_t p_t |v_t| / Σ_t p_t (the twin's abs_out); doubled to 2^-7 for the approximate exp2 and the
// fp32 summation orders. Scores are exact products summed in fp32 and add no visible error. Whole-tensor
// relative L2: the two roundings give about 2e-3.
constexpr double kAttnOutputRel = 1.0 / 256.0;
constexpr double kAttnProbRel = 1.0 / 128.0;
constexpr double kAttnRelL2 = 1e-2;

}  // namespace futransformer::test
