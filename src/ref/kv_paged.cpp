#include <algorithm>
#include <span>

#include "futransformer/error.h"
#include "ref/kv_cache.h"

namespace futransformer::ref {

PagedKvStore::PagedKvStore(formats::KvFormat format, int64_t n_kv_heads, int64_t head_dim)
    : layout_(formats::kv_page_layout(format, head_dim)), heads_(n_kv_heads) {
  check(n_kv_heads > 0, "KV store: ", n_kv_heads, " KV heads, expected a positive count");
}

void PagedKvStore::append(const float* k, const float* v, int64_t tokens) {
  check(tokens >= 0, "KV store: negative token count ", tokens);
  const int64_t hd = layout_.head_dim, w = width(), P = layout_.page_tokens;
  const size_t page_bytes = static_cast<size_t>(layout_.page_bytes);
  const size_t old = static_cast<size_t>(size_ * w);
  const bool anchored = layout_.format == formats::KvFormat::INT4_HADAMARD;
  try {
    if (anchored && size_ == 0 && tokens > 0) set_anchors(k, tokens);
    keys_.resize(old + static_cast<size_t>(tokens * w));
    values_.resize(old + static_cast<size_t>(tokens * w));
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t pos = size_ + t;
      const int64_t index = pos / P, slot = pos % P;
      if (slot == 0) pages_.resize(pages_.size() + static_cast<size_t>(heads_), std::vector<uint8_t>(page_bytes, 0));
      for (int64_t h = 0; h < heads_; ++h) {
        uint8_t* p = pages_[static_cast<size_t>(index * heads_ + h)].data();
        const size_t off = static_cast<size_t>(t * w + h * hd);
        formats::kv_encode_token(layout_, p, slot, formats::KvPart::K, std::span<const float>(k + off, hd),
                                 key_anchor(h));
        formats::kv_encode_token(layout_, p, slot, formats::KvPart::V, std::span<const float>(v + off, hd));
        formats::kv_decode_token(layout_, p, slot, formats::KvPart::K, std::span<float>(&keys_[old + off], hd));
        formats::kv_decode_token(layout_, p, slot, formats::KvPart::V, std::span<float>(&values_[old + off], hd));
      }
    }
  } catch (...) {
    // A rejected token (non-finite values) leaves the store as it was: slots past size_ are simply unused.
    keys_.resize(old);
    values_.resize(old);
    pages_.resize(static_cast<size_t>((size_ + P - 1) / P * heads_));
    if (size_ == 0) anchors_.clear();  // the next first append fixes the anchor again
    throw;
  }
  size_ += tokens;
}

void PagedKvStore::set_anchors(const float* k, int64_t tokens) {
  const int64_t hd = layout_.head_dim, w = width();
  std::vector<float> keys(static_cast<size_t>(tokens * hd));
  anchors_.clear();
  for (int64_t h = 0; h < heads_; ++h) {
    for (int64_t t = 0; t < tokens; ++t) std::copy_n(k + t * w + h * hd, hd, &keys[static_cast<size_t>(t * hd)]);
    // fp16(H · mean of the chunk's keys): the keys' H is the queries' transform.
    const std::vector<uint16_t> c = formats::kv_key_anchor(layout_.format, keys, tokens, hd);
    anchors_.insert(anchors_.end(), c.begin(), c.end());
  }
}

std::span<const uint16_t> PagedKvStore::key_anchor(int64_t head) const {
  check(head >= 0 && head < heads_, "KV store: key anchor of head ", head, " (", heads_, " heads)");
  if (anchors_.empty()) return {};
  const size_t hd = static_cast<size_t>(layout_.head_dim);
  return std::span<const uint16_t>(anchors_).subspan(static_cast<size_t>(head) * hd, hd);
}

void PagedKvStore::read_keys(int64_t n, float* out) const {
  check(n >= 0 && n <= size_, "KV store: reading ", n, " positions of ", size_);
  std::copy_n(keys_.data(), static_cast<size_t>(n * width()), out);
}

void PagedKvStore::read_values(int64_t n, float* out) const {
  check(n >= 0 && n <= size_, "KV store: reading ", n, " positions of ", size_);
  std::copy_n(values_.data(), static_cast<size_t>(n * width()), out);
}

const uint8_t* PagedKvStore::page(int64_t head, int64_t index) const {
  check(head >= 0 && head < heads_ && index >= 0 && index < pages_per_head(), "KV store: page ", index, " of head ",
        head, " does not exist (", pages_per_head(), " pages of ", heads_, " heads)");
  return pages_[static_cast<size_t>(index * heads_ + head)].data();
}

std::unique_ptr<KvStore> make_kv_store(std::optional<formats::KvFormat> format, int64_t n_kv_heads,
                                       int64_t head_dim) {
  if (!format) return make_f32_kv_store(n_kv_heads * head_dim);
  return std::make_unique<PagedKvStore>(*format, n_kv_heads, head_dim);
}

}  // namespace futransformer::ref
