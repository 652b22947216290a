// GGUF (versions 2 and 3, little-endian): the parsed file (metadata + tensor infos pointing into the bytes) and
// its conversion to a Model with Hugging Face tensor names and layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "futransformer/model.h"

namespace futransformer {

// Metadata value types; the numbers are the ones stored in the file.
enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufValue;
struct GgufArray {
  GgufType type = GgufType::UINT8;   // element type (ARRAY for arrays of arrays)
  std::vector<GgufValue> items;
};

struct GgufValue {
  // Alternative index == GgufType number.
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string, GgufArray,
               uint64_t, int64_t, double>
      value;

  GgufType type() const { return static_cast<GgufType>(value.index()); }
  // The value as an integer if it is one of the integer types and fits in int64.
  std::optional<int64_t> as_int() const;
  // The value as a double if it is an integer or floating-point type.
  std::optional<double> as_number() const;
  const std::string* as_string() const { return std::get_if<std::string>(&value); }
  const GgufArray* as_array() const { return std::get_if<GgufArray>(&value); }
};

// ggml tensor types this loader reads.
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, BF16 = 30 };
// "Q4_K" etc. for any ggml type number, "unknown" for numbers ggml does not define.
const char* ggml_type_name(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;      // GGUF order: ne0 (innermost, contiguous) first
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;            // from the start of the data section
  const uint8_t* data = nullptr;  // inside the parsed bytes; nbytes of them
  size_t nbytes = 0;

  int64_t numel() const;
};

struct GgufFile {
  std::string source;
  uint32_t version = 0;
  uint64_t alignment = 32;
  size_t data_offset = 0;                          // start of the data section in the file
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;             // in file order
  std::shared_ptr<const void> owner;               // keeps the bytes that tensors point into alive

  const GgufValue* find(const std::string& key) const;
  const GgufTensorInfo* find_tensor(const std::string& name) const;
};

// Parses and validates `size` bytes at `data` (kept alive by `owner`). `source` names the file in errors.
// Throws Error on any malformed input: truncation, impossible counts or lengths, unknown value types, bad
// tensor dims, data outside the file or misaligned, duplicate keys/tensors, tensor types not in GgmlType.
GgufFile parse_gguf(std::shared_ptr<const void> owner, const uint8_t* data, size_t size, const std::string& source);

// Builds a Llama Model (config, HF-named tensors, tokenizer) from a parsed file. F32/F16/BF16 tensors point into
// the file's bytes; quantised tensors are dequantised to F32 and Q/K rows are permuted from GGUF's interleaved
// RoPE order to HF's rotate-half order (both owned). Throws Error naming the source and the key or tensor.
Model gguf_to_model(const GgufFile& file, const std::string& source);

// load_gguf_model(path) is declared in model.h: it maps the file and calls parse_gguf + gguf_to_model.

}  // namespace futransformer
