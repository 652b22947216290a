#include "ref/kv_cache.h"

#include <algorithm>

#include "futransformer/error.h"

namespace futransformer::ref {

F32KvStore::F32KvStore(int64_t width) : width_(width) {
  check(width > 0, "KV store: width ", width, " must be positive");
}

void F32KvStore::append(const float* k, const float* v, int64_t tokens) {
  check(tokens >= 0, "KV store: negative token count ", tokens);
  const size_t n = static_cast<size_t>(tokens * width_);
  keys_.insert(keys_.end(), k, k + n);
  values_.insert(values_.end(), v, v + n);
  size_ += tokens;
}

void F32KvStore::read_keys(int64_t n, float* out) const {
  check(n >= 0 && n <= size_, "KV store: reading ", n, " positions of ", size_);
  std::copy_n(keys_.data(), static_cast<size_t>(n * width_), out);
}

void F32KvStore::read_values(int64_t n, float* out) const {
  check(n >= 0 && n <= size_, "KV store: reading ", n, " positions of ", size_);
  std::copy_n(values_.data(), static_cast<size_t>(n * width_), out);
}

std::unique_ptr<KvStore> make_f32_kv_store(int64_t width) { return std::make_unique<F32KvStore>(width); }

}  // namespace futransformer::ref
