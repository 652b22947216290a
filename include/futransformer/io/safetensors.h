// Reading and writing safetensors files (Hugging Face's checkpoint format): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data region that the offsets are relative to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "futransformer/tensor.h"

namespace futransformer {

// Largest JSON header accepted (the reference implementation's limit), so a corrupt length cannot make us
// parse gigabytes.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Parses a safetensors file held in memory. The tensors point into `data` (or into an owned copy when a
// tensor's bytes are not aligned to its element size) and keep `owner` alive. Tensors are returned in the
// order of their data. When `metadata` is given it receives the optional "__metadata__" map.
// Throws Error naming `source` and the offending tensor/field on any malformed input.
std::vector<Tensor> parse_safetensors(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                                      const std::string& source,
                                      std::map<std::string, std::string>* metadata = nullptr);

// Memory-maps `path` and parses it (tensors keep the mapping alive).
std::vector<Tensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// What the header says about one tensor to be written.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

// Writes a safetensors file whose tensor data arrives in pieces, so a checkpoint larger than memory can be
// produced: the header is written at construction, then append() takes the tensors' bytes in entry order
// (any chunking), and finish() checks that every byte arrived and moves the file into place (it is written
// under a temporary name until then). A writer destroyed before finish() removes its partial file. All errors
// name the path.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void append(const void* bytes, size_t size);
  void finish();
  // Size the finished file will have.
  uint64_t file_size() const { return file_size_; }

  // Size of the file `entries` and `metadata` would produce (header included), without writing anything.
  static uint64_t planned_size(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {});

 private:
  void write_all(const void* bytes, size_t size);
  void abandon();
  std::string path_;
  std::string write_path_;  // path_ + ".tmp.<pid>" until finish() renames it, or path_ for non-regular files
  bool temporary_ = false;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint64_t written_ = 0;
};

// Writes `tensors` (in the given order) and `metadata` to `path`; the header is padded with spaces to a
// multiple of 8 bytes as the reference writer does. Needs no memory beyond the tensors' own storage.
void write_safetensors(const std::string& path, const std::vector<const Tensor*>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace futransformer
