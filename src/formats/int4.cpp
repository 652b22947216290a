#include "futransformer/formats/int4.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "futransformer/dtype.h"
#include "futransformer/error.h"

namespace futransformer::formats {
namespace {

uint16_t to_scale_bits(float s, ScaleType t) { return t == ScaleType::F16 ? f32_to_f16(s) : f32_to_bf16(s); }
float from_scale_bits(uint16_t b, ScaleType t) { return t == ScaleType::F16 ? f16_to_f32(b) : bf16_to_f32(b); }

constexpr int kSymmetricZero = 8;
constexpr float kLevels = 15.0f;  // 16 levels, 15 steps

}  // namespace

int64_t Int4Spec::resolved_group(int64_t K, const std::string& what) const {
  check(group_size == 0 || group_size == 32 || group_size == 64 || group_size == 128, what, ": INT4 group size ",
        group_size, " is not supported (expected 32, 64, 128, or 0 for per-channel)");
  check(K > 0 && K % 2 == 0, what, ": INT4 needs an even, positive number of input columns, got ", K);
  const int64_t g = group_size == 0 ? K : group_size;
  check(K % g == 0, what, ": input size ", K, " is not a multiple of INT4 group size ", g,
        " (choose a group size that divides it, or per-channel)");
  return g;
}

float Int4Weight::scale(int64_t r, int64_t g) const {
  return from_scale_bits(scales[static_cast<size_t>(r * groups_per_row() + g)], spec.scale_type);
}

int Int4Weight::zero(int64_t r, int64_t g) const {
  return spec.symmetric ? kSymmetricZero : zeros[static_cast<size_t>(r * groups_per_row() + g)];
}

GroupParams int4_group_params(std::span<const float> v, const Int4Spec& spec) {
  float lo = 0.0f, hi = 0.0f;  // the grid always contains 0, as GPTQ's quantiser does
  for (float x : v) {
    // min/max would skip a NaN and the later float -> uint8 cast of it is undefined: reject it here.
    check(std::isfinite(x), "INT4 quantiser input contains inf or nan");
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  GroupParams p{};
  float s;
  if (spec.symmetric) {
    const float amax = std::max(-lo, hi);
    s = amax * 2.0f / kLevels;
  } else {
    s = (hi - lo) / kLevels;
  }
  p.scale_bits = to_scale_bits(s, spec.scale_type);
  p.scale = from_scale_bits(p.scale_bits, spec.scale_type);
  check(std::isfinite(p.scale), "INT4 group scale ", s, " overflows the ",
        spec.scale_type == ScaleType::F16 ? "FP16" : "BF16", " scale type (weights too large; use BF16 scales)");
  if (!(p.scale > 0.0f)) {
    // All-zero group, or values so small that the scale underflows the scale type: a unit scale keeps x / s
    // defined and every value quantises to the zero-point (an error below the scale type's smallest step).
    p.scale_bits = to_scale_bits(1.0f, spec.scale_type);
    p.scale = 1.0f;
  }
  if (spec.symmetric) {
    p.zero = kSymmetricZero;
  } else {
    const float z = std::nearbyint(-lo / p.scale);
    p.zero = static_cast<int>(std::clamp(z, 0.0f, kLevels));
  }
  return p;
}

uint8_t int4_quantize_value(float x, const GroupParams& p) {
  const float q = std::nearbyint(x / p.scale) + static_cast<float>(p.zero);
  return static_cast<uint8_t>(std::clamp(q, 0.0f, kLevels));
}

std::vector<uint8_t> int4_pack(std::span<const uint8_t> nibbles) {
  check(nibbles.size() % 2 == 0, "INT4 packing needs an even number of values, got ", nibbles.size());
  std::vector<uint8_t> out(nibbles.size() / 2);
  for (size_t j = 0; j < out.size(); ++j) {
    const uint8_t lo = nibbles[2 * j], hi = nibbles[2 * j + 1];
    check(lo <= 15 && hi <= 15, "INT4 packing: value ", static_cast<int>(std::max(lo, hi)), " at column ",
          lo > 15 ? 2 * j : 2 * j + 1, " does not fit in 4 bits");
    out[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return out;
}

std::vector<uint8_t> int4_unpack(std::span<const uint8_t> packed) {
  std::vector<uint8_t> out(packed.size() * 2);
  for (size_t j = 0; j < packed.size(); ++j) {
    out[2 * j] = static_cast<uint8_t>(packed[j] & 0xf);
    out[2 * j + 1] = static_cast<uint8_t>(packed[j] >> 4);
  }
  return out;
}

Int4Weight int4_quantize_rtn(std::span<const float> w, int64_t rows, int64_t cols, const Int4Spec& spec,
                             const std::string& tensor_name) {
  check(rows > 0 && cols > 0 && static_cast<int64_t>(w.size()) == rows * cols, tensor_name, ": INT4 quantiser got ",
        w.size(), " values for a ", rows, " x ", cols, " weight");
  Int4Weight q;
  q.rows = rows;
  q.cols = cols;
  q.spec = spec;
  q.group = spec.resolved_group(cols, tensor_name);
  const int64_t groups = cols / q.group;
  q.qweight.assign(static_cast<size_t>(rows * cols / 2), 0);
  q.scales.resize(static_cast<size_t>(rows * groups));
  if (!spec.symmetric) q.zeros.resize(static_cast<size_t>(rows * groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = w.data() + r * cols + g * q.group;
      const GroupParams p = int4_group_params(std::span<const float>(src, static_cast<size_t>(q.group)), spec);
      q.scales[static_cast<size_t>(r * groups + g)] = p.scale_bits;
      if (!spec.symmetric) q.zeros[static_cast<size_t>(r * groups + g)] = static_cast<uint8_t>(p.zero);
      for (int64_t i = 0; i < q.group; ++i) {
        const int64_t c = g * q.group + i;
        const uint8_t u = int4_quantize_value(src[i], p);
        uint8_t& byte = q.qweight[static_cast<size_t>(r * (cols / 2) + c / 2)];
        byte = static_cast<uint8_t>((c & 1) ? (byte | (u << 4)) : (byte | u));
      }
    }
  }
  return q;
}

std::vector<float> int4_dequantize(const Int4Weight& q) {
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols));
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const int64_t g = c / q.group;
      out[static_cast<size_t>(r * q.cols + c)] =
          static_cast<float>(static_cast<int>(q.nibble(r, c)) - q.zero(r, g)) * q.scale(r, g);
    }
  }
  return out;
}

Int4Weight int4_pad_rows(const Int4Weight& q, int64_t rows) {
  check(rows >= q.rows, "int4_pad_rows: ", rows, " rows is fewer than the weight's ", q.rows);
  check(q.cols % 2 == 0 && q.group > 0 && q.cols % q.group == 0, "int4_pad_rows: a weight of ", q.cols,
        " columns in groups of ", q.group, " is malformed");
  Int4Weight p = q;
  const int64_t groups = q.groups_per_row();
  const uint8_t z = q.spec.symmetric ? 8 : 0;
  p.rows = rows;
  p.qweight.resize(static_cast<size_t>(rows * q.cols / 2), static_cast<uint8_t>(z | (z << 4)));
  p.scales.resize(static_cast<size_t>(rows * groups), 0);
  if (!q.spec.symmetric) p.zeros.resize(static_cast<size_t>(rows * groups), 0);
  return p;
}

}  // namespace futransformer::formats
