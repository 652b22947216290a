// A named, read-only tensor of a checkpoint: dtype, shape (outermost first, row-major) and bytes that either
// point into a memory-mapped file or into storage the tensor owns (e.g. dequantised GGUF blocks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "futransformer/dtype.h"

namespace futransformer {

struct Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;        // e.g. a linear weight is {out_features, in_features}
  const uint8_t* data = nullptr;     // numel() * dtype_size(dtype) bytes
  std::shared_ptr<const void> owner; // keeps `data` alive (a MappedFile or an owned buffer)

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string shape_str() const;     // "[576, 49152]"

  // All elements converted to fp32 (F32, F16, BF16, I8, I32 supported; U8 is rejected with an Error).
  std::vector<float> to_f32() const;

  // A tensor that owns a copy of `values` as F32.
  static Tensor from_f32(std::string name, std::vector<int64_t> shape, std::vector<float> values);
  // A tensor that owns `bytes` with the given dtype and shape (size is checked).
  static Tensor from_bytes(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
};

}  // namespace futransformer
