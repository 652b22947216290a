// Key/value storage of one layer of one sequence in the reference engine. The engine only appends token vectors
// and reads positions back as fp32, so a KV-cache format (bf16, fp8, int4, int4 with a Hadamard rotation) is one
// more implementation of this interface: it encodes on append and decodes on read, and attention sees exactly
// the values the format can represent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

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

}  // namespace futransformer::ref
