#include "futransformer/tensor.h"

#include <cstring>
#include <limits>
#include <sstream>

#include "futransformer/error.h"

namespace futransformer {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::vector<float> Tensor::to_f32() const {
  const size_t n = static_cast<size_t>(numel());
  std::vector<float> out(n);
  switch (dtype) {
    case DType::F32:
      std::memcpy(out.data(), data, n * 4);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::I8:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<int8_t>(data[i]));
      break;
    case DType::I32:
      for (size_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, data + 4 * i, 4);
        out[i] = static_cast<float>(v);
      }
      break;
    case DType::U8:
      fail("tensor '", name, "': dtype U8 holds packed data and has no direct fp32 value");
  }
  return out;
}

Tensor Tensor::from_f32(std::string name, std::vector<int64_t> shape, std::vector<float> values) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return from_bytes(std::move(name), DType::F32, std::move(shape), std::move(bytes));
}

Tensor Tensor::from_bytes(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  Tensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  for (int64_t d : t.shape) check(d >= 0, "tensor '", t.name, "': negative dimension in shape");
  check(t.nbytes() == bytes.size(), "tensor '", t.name, "': ", bytes.size(), " bytes given for shape ", t.shape_str(),
        " of ", dtype_name(dtype), " (expected ", t.nbytes(), ")");
  auto storage = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  t.data = storage->data();
  t.owner = storage;
  return t;
}

}  // namespace futransformer
