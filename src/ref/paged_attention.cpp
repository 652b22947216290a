#include "ref/paged_attention.h"

#include <algorithm>
#include <cmath>

#include "futransformer/error.h"
#include "ref/ops.h"

namespace futransformer::ref {

std::vector<float> paged_decode_attention(const PagedKvCache& c, std::span<const int32_t> seq_lens,
                                          std::span<const float> q, int64_t n_heads, std::vector<float>* abs_out) {
  const formats::KvPageLayout& L = c.layout;
  const int64_t batch = static_cast<int64_t>(seq_lens.size());
  const int64_t d = L.head_dim;
  check(L.page_bytes > 0 && d > 0 && L.page_tokens > 0, "paged attention: empty page layout");
  check(c.n_kv_heads > 0 && n_heads > 0 && n_heads % c.n_kv_heads == 0, "paged attention: ", n_heads,
        " query heads are not a positive multiple of ", c.n_kv_heads, " KV heads");
  check(c.max_pages_per_seq > 0 && c.max_pages_per_seq <= (int64_t{1} << 30) / L.page_tokens,
        "paged attention: max_pages_per_seq ", c.max_pages_per_seq, " out of range");
  check(static_cast<int64_t>(c.block_table.size()) == batch * c.max_pages_per_seq, "paged attention: block table has ",
        c.block_table.size(), " entries, expected batch ", batch, " x ", c.max_pages_per_seq, " pages");
  check(static_cast<int64_t>(q.size()) == batch * n_heads * d, "paged attention: q has ", q.size(),
        " values, expected ", batch, " x ", n_heads, " x ", d);
  const int64_t block_bytes = L.page_bytes * c.n_kv_heads;
  check(static_cast<int64_t>(c.pool.size()) % block_bytes == 0, "paged attention: pool of ", c.pool.size(),
        " bytes is not a whole number of ", block_bytes, "-byte page blocks");
  const int64_t pages = static_cast<int64_t>(c.pool.size()) / block_bytes;
  const int64_t width = c.n_kv_heads * d;

  std::vector<float> out(static_cast<size_t>(batch * n_heads * d), 0.0f);
  if (abs_out) abs_out->assign(out.size(), 0.0f);
  std::vector<float> k, v, vabs;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = seq_lens[static_cast<size_t>(b)];
    check(len >= 0 && len <= c.max_pages_per_seq * L.page_tokens, "paged attention: seq_lens[", b, "] = ", len,
          ", expected 0..", c.max_pages_per_seq * L.page_tokens);
    if (len == 0) continue;
    k.assign(static_cast<size_t>(len * width), 0.0f);
    v.assign(k.size(), 0.0f);
    for (int64_t t = 0; t < len; ++t) {
      const int64_t slot = t / L.page_tokens;
      const int32_t page = c.block_table[static_cast<size_t>(b * c.max_pages_per_seq + slot)];
      check(page >= 0 && page < pages, "paged attention: block_table[", b, ", ", slot, "] = ", page,
            " is outside the pool of ", pages, " pages");
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        const uint8_t* p = c.pool.data() + (page * c.n_kv_heads + h) * L.page_bytes;
        const size_t off = static_cast<size_t>(t * width + h * d);
        formats::kv_decode_token(L, p, t % L.page_tokens, formats::KvPart::K, std::span<float>(&k[off], d));
        formats::kv_decode_token(L, p, t % L.page_tokens, formats::KvPart::V, std::span<float>(&v[off], d));
      }
    }
    const size_t qoff = static_cast<size_t>(b * n_heads * d);
    attention(q.data() + qoff, k.data(), v.data(), out.data() + qoff, 1, len - 1, len, n_heads, c.n_kv_heads, d);
    if (abs_out) {
      vabs.resize(v.size());
      std::transform(v.begin(), v.end(), vabs.begin(), [](float x) { return std::fabs(x); });
      attention(q.data() + qoff, k.data(), vabs.data(), abs_out->data() + qoff, 1, len - 1, len, n_heads, c.n_kv_heads,
                d);
    }
  }
  return out;
}

}  // namespace futransformer::ref
