#include "futransformer/formats/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "futransformer/error.h"

namespace futransformer::formats {
namespace {

constexpr float kMinNormal = 0x1p-6f;
constexpr uint8_t kMaxFiniteCode = 0x7E;

Fp8Matrix quantize_blocks(std::span<const float> x, int64_t rows, int64_t cols, int64_t block,
                          const std::string& what) {
  check(rows > 0 && cols > 0 && rows <= std::numeric_limits<int64_t>::max() / cols &&
            static_cast<uint64_t>(x.size()) == static_cast<uint64_t>(rows * cols),
        what, ": FP8 quantiser got ", x.size(), " values for a ", rows, " x ", cols, " matrix");
  Fp8Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.block = block;
  q.codes.resize(static_cast<size_t>(rows * cols));
  q.scales.resize(static_cast<size_t>(rows * (cols / block)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / block; ++b) {
      const size_t base = static_cast<size_t>(r * cols + b * block);
      float amax = 0.0f;
      for (int64_t i = 0; i < block; ++i) {
        const float v = x[base + static_cast<size_t>(i)];
        // Checked here because max() would silently skip a NaN.
        check(std::isfinite(v), what, ": FP8 quantiser input has ", v, " at row ", r, ", column ", b * block + i);
        amax = std::max(amax, std::fabs(v));
      }
      const float s = fp8_scale_for_amax(amax, what);
      q.scales[static_cast<size_t>(r * (cols / block) + b)] = s;
      for (int64_t i = 0; i < block; ++i) {
        q.codes[base + static_cast<size_t>(i)] = fp8_e4m3_encode(x[base + static_cast<size_t>(i)] / s);
      }
    }
  }
  return q;
}

}  // namespace

uint8_t fp8_e4m3_encode(float x) {
  if (std::isnan(x)) return kFp8E4M3NaN;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  // Every |x| >= 448 rounds to 448 or beyond; satfinite clamps those (and inf) to the largest finite code.
  if (a >= kFp8E4M3Max) return static_cast<uint8_t>(sign | kMaxFiniteCode);
  if (a < kMinNormal) {
    // Subnormal grid m * 2^-9: scaling by 2^9 is exact, so nearbyint does the one and only rounding. m == 8 is
    // the smallest normal, whose code (e = 1, m = 0) is also 8.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f)));
  }
  int e2;
  std::frexp(a, &e2);  // a = f * 2^e2 with f in [0.5, 1): the unbiased exponent is e2 - 1, in [-6, 8]
  int exp = e2 - 1;
  // 4 significant bits: m in [8, 16] after rounding (ldexp by a power of two is exact).
  int m = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exp)));
  if (m == 16) {
    m = 8;
    ++exp;  // cannot pass 8: a < 448 rounds to at most 448 = 14 * 2^5
  }
  return static_cast<uint8_t>(sign | ((exp + 7) << 3) | (m - 8));
}

float fp8_e4m3_decode(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int e = (code >> 3) & 0xF;
  const int m = code & 0x7;
  if (e == 0xF && m == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);
}

float fp8_scale_for_amax(float amax, const std::string& what) {
  check(std::isfinite(amax), what, ": FP8 quantiser input contains inf or nan");
  const float s = amax / kFp8E4M3Max;
  // All-zero rows (and amax so small that amax / 448 underflows to 0) get a unit scale so x / s stays defined;
  // their values then encode to zero or tiny subnormals, which is within the format's absolute floor.
  return s > 0.0f ? s : 1.0f;
}

Fp8Matrix fp8_quantize_weight(std::span<const float> w, int64_t rows, int64_t cols, const std::string& tensor_name) {
  return quantize_blocks(w, rows, cols, cols, tensor_name);
}

Fp8Matrix fp8_quantize_per_token(std::span<const float> x, int64_t tokens, int64_t cols, const std::string& what) {
  return quantize_blocks(x, tokens, cols, cols, what);
}

Fp8Matrix fp8_quantize_per_token_block(std::span<const float> x, int64_t tokens, int64_t cols,
                                       const std::string& what) {
  check(cols > 0 && cols % kFp8BlockCols == 0, what, ": FP8 block quantisation needs a channel count that is a ",
        "multiple of ", kFp8BlockCols, ", got ", cols);
  return quantize_blocks(x, tokens, cols, kFp8BlockCols, what);
}

std::vector<float> fp8_dequantize(const Fp8Matrix& q) {
  std::vector<float> out(q.codes.size());
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const size_t i = static_cast<size_t>(r * q.cols + c);
      out[i] = fp8_e4m3_decode(q.codes[i]) * q.scale(r, c);
    }
  }
  return out;
}

}  // namespace futransformer::formats
