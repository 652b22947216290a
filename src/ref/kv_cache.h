// Key/value storage of one layer of one sequence in the reference engine. The engine only appends token vectors
// and reads positions back as fp32, so a KV-cache format (bf16, fp8, int4, int4 with a Hadamard rotation) is one
// more implementation of this interface: it encodes on append and decodes on read, and attention sees exactly
// the values the format can represent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "futransformer/formats/kv_cache.h"

namespace futransformer::ref {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Appends `tokens` tokens; k and v are [tokens, width] (width = n_kv_heads · head_dim).
  virtual void append(const float* k, const float* v, int64_t tokens) = 0;
  // Writes the keys / values of positions [0, n) into out ([n, width]); n <= size().
  virtual void read_keys(int64_t n, float* out) const = 0;
  virtual void read_values(int64_t n, float* out) const = 0;
  virtual int64_t size() const = 0;
  virtual int64_t width() const = 0;
};

// Builds an empty store for vectors of `width` values.
using KvStoreFactory = std::function<std::unique_ptr<KvStore>(int64_t width)>;

// Plain fp32 storage: reads return exactly what was appended.
class F32KvStore final : public KvStore {
 public:
  explicit F32KvStore(int64_t width);
  void append(const float* k, const float* v, int64_t tokens) override;
  void read_keys(int64_t n, float* out) const override;
  void read_values(int64_t n, float* out) const override;
  int64_t size() const override { return size_; }
  int64_t width() const override { return width_; }

 private:
  int64_t width_;
  int64_t size_ = 0;
  std::vector<float> keys_, values_;
};

std::unique_ptr<KvStore> make_f32_kv_store(int64_t width);

// A cache in one of the formats of formats/kv_cache.h, held as the canonical pages (kKvPageTokens token slots of
// one KV head each, the bytes the GPU writes). Every appended token is encoded with kv_encode_token and decoded
// back once, right away, into an fp32 mirror that reads return: attention sees exactly decode(page bytes), without
// decoding the whole history at every step. Reads are in the cache's domain: for int4-hadamard the keys and values
// stay rotated (H·k, H·v), and the engine rotates queries and un-rotates the attention output, as the GPU does.
// int4-hadamard keys are also anchored: the first append (prefill chunk, or one token) fixes, per KV head, the
// anchor c = kv_key_anchor(format, k of that chunk) = fp16(H · mean of the chunk's keys), and every key is stored
// as H·k − c; read_keys returns those anchored
// keys. Attention is unchanged by it (each query's logits shift by the same q'·c, which softmax cancels).
class PagedKvStore final : public KvStore {
 public:
  PagedKvStore(formats::KvFormat format, int64_t n_kv_heads, int64_t head_dim);
  void append(const float* k, const float* v, int64_t tokens) override;
  void read_keys(int64_t n, float* out) const override;
  void read_values(int64_t n, float* out) const override;
  int64_t size() const override { return size_; }
  int64_t width() const override { return heads_ * layout_.head_dim; }

  const formats::KvPageLayout& layout() const { return layout_; }
  int64_t pages_per_head() const { return static_cast<int64_t>(pages_.size()) / heads_; }
  // The bytes of page `index` (tokens index·P … index·P + P − 1) of KV head `head`.
  const uint8_t* page(int64_t head, int64_t index) const;
  // The fp16 key anchor of KV head `head` (head_dim values); empty for formats without one and before the first
  // append.
  std::span<const uint16_t> key_anchor(int64_t head) const;

 private:
  formats::KvPageLayout layout_;
  int64_t heads_;
  int64_t size_ = 0;
  std::vector<std::vector<uint8_t>> pages_;  // page-major: pages_[index * heads_ + head]
  std::vector<float> keys_, values_;         // decoded mirror, [size_, width]
  void set_anchors(const float* k, int64_t tokens);

  std::vector<uint16_t> anchors_;            // int4-hadamard: fp16 [heads_][head_dim] once the first append is in
};

// An fp32 store (nullopt) or a PagedKvStore of `format`, for n_kv_heads heads of head_dim values. Throws Error
// when the format cannot hold that head_dim (kv_page_layout's rules).
std::unique_ptr<KvStore> make_kv_store(std::optional<formats::KvFormat> format, int64_t n_kv_heads,
                                       int64_t head_dim);

}  // namespace futransformer::ref
