#include "futransformer/formats/hadamard.h"

#include <cmath>

#include "futransformer/error.h"

namespace futransformer::formats {
namespace {

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

float hadamard_scale(int64_t block) {
  check(is_pow2(block), "Hadamard block ", block, " is not a positive power of two");
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
}

void hadamard_blocks(float* x, int64_t n, int64_t block) {
  check(is_pow2(block), "Hadamard block ", block, " is not a positive power of two");
  check(n >= 0 && n % block == 0, "Hadamard transform over ", n, " values: not a multiple of the block ", block);
  check(n == 0 || x != nullptr, "Hadamard transform: null input");
  const float s = hadamard_scale(block);
  for (int64_t base = 0; base < n; base += block) {
    float* v = x + base;
    for (int64_t h = 1; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
      }
    }
    for (int64_t j = 0; j < block; ++j) v[j] *= s;
  }
}

int64_t hadamard_block_for(int64_t head_dim) {
  check(head_dim > 0, "Hadamard block for head_dim ", head_dim, ": head_dim must be positive");
  int64_t b = kHadamardMaxBlock;
  while (head_dim % b != 0) b /= 2;
  return b;
}

}  // namespace futransformer::formats
