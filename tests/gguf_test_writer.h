// A minimal GGUF writer for tests: builds valid files byte by byte (and, through its knobs, invalid ones).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace futransformer::test {

class GgufWriter {
 public:
  // Value type numbers of the GGUF format.
  enum Type : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };

  uint32_t version = 3;
  uint64_t alignment = 32;  // used for layout; written as general.alignment only via add_u32 by the caller

  template <typename T>
  static void put(std::vector<uint8_t>& out, T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  static void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }

  // A key with an already-encoded value (type number + bytes).
  void add_raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
    put_string(kv_, key);
    put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++kv_count_;
  }
  template <typename T>
  void add_scalar(const std::string& key, uint32_t type, T v) {
    std::vector<uint8_t> b;
    put<T>(b, v);
    add_raw(key, type, b);
  }
  void add_u32(const std::string& key, uint32_t v) { add_scalar(key, kU32, v); }
  void add_i32(const std::string& key, int32_t v) { add_scalar(key, kI32, v); }
  void add_u64(const std::string& key, uint64_t v) { add_scalar(key, kU64, v); }
  void add_u8(const std::string& key, uint8_t v) { add_scalar(key, kU8, v); }
  void add_f32(const std::string& key, float v) { add_scalar(key, kF32, v); }
  void add_f64(const std::string& key, double v) { add_scalar(key, kF64, v); }
  void add_bool(const std::string& key, bool v) { add_scalar<uint8_t>(key, kBool, v ? 1 : 0); }
  void add_string(const std::string& key, const std::string& v) {
    std::vector<uint8_t> b;
    put_string(b, v);
    add_raw(key, kString, b);
  }
  void add_string_array(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kString);
    put<uint64_t>(b, v.size());
    for (const std::string& s : v) put_string(b, s);
    add_raw(key, kArray, b);
  }
  void add_f32_array(const std::string& key, const std::vector<float>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kF32);
    put<uint64_t>(b, v.size());
    for (float x : v) put<float>(b, x);
    add_raw(key, kArray, b);
  }
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kI32);
    put<uint64_t>(b, v.size());
    for (int32_t x : v) put<int32_t>(b, x);
    add_raw(key, kArray, b);
  }

  // dims innermost first (GGUF order). `offset_override` replaces the computed data offset when non-negative.
  void add_tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t ggml_type,
                  std::vector<uint8_t> bytes, int64_t offset_override = -1) {
    tensors_.push_back({name, dims, ggml_type, std::move(bytes), offset_override});
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    put<uint32_t>(out, version);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, kv_count_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const TensorSpec& t : tensors_) {
      put_string(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put<uint64_t>(out, d);
      put<uint32_t>(out, t.type);
      offsets.push_back(offset);
      put<uint64_t>(out, t.offset_override >= 0 ? static_cast<uint64_t>(t.offset_override) : offset);
      offset = align(offset + t.bytes.size());
    }
    out.resize(align(out.size()), 0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data_start + offsets[i], 0);
      out.insert(out.end(), tensors_[i].bytes.begin(), tensors_[i].bytes.end());
    }
    return out;
  }

  static void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
  }

 private:
  struct TensorSpec {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> bytes;
    int64_t offset_override;
  };
  uint64_t align(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }

  std::vector<uint8_t> kv_;
  uint64_t kv_count_ = 0;
  std::vector<TensorSpec> tensors_;
};

}  // namespace futransformer::test
