// Read-only memory map of a whole file (RAII). Loaders keep a shared_ptr to it so tensors can point into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace futransformer {

class MappedFile {
 public:
  // Maps `path` read-only; throws Error naming the path if it cannot be opened or mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace futransformer
