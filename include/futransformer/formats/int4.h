// INT4 weight format (canonical, CPU): the single definition that the quantisers (RTN, GPTQ), the reference
// engine and the GPU kernels agree on. docs/formats.md documents it bit by bit.
//
// A weight W is [N rows (output channels), K columns (input channels)], row-major. Each row is cut along K
// into groups of `group_size` consecutive columns (32, 64, 128, or K for per-channel). Every group has a scale
// s (stored as FP16 or BF16) and a zero-point z (an integer in [0, 15]):
//     stored nibble u in [0, 15],   value = (u - z) * s
//   symmetric:  z = 8,  s = round_to_scale_type(max|x| * 2 / 15)   (GPTQ's convention: grid -8s .. 7s)
//   asymmetric: s = round_to_scale_type((max(x, 0) - min(x, 0)) / 15),  z = clamp(nearbyint(-min(x, 0) / s), 0, 15)
//   quantise:   u = clamp(nearbyint(x / s) + z, 0, 15)   with the *stored* (rounded) s, fp32 division,
//               round-half-to-even; a group whose s is 0 (all zeros) uses s = 1 so x / s is defined.
// Packing: qweight is uint8 [N, K / 2]; byte j of a row holds column 2j in its low nibble and column 2j + 1 in
// its high nibble. scales are uint16 bit patterns [N, K / group_size]; zeros are uint8 [N, K / group_size]
// (present for asymmetric only; symmetric groups have z = 8 implicitly).
// K must be a multiple of group_size (and even); anything else is rejected with an Error.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace futransformer::formats {

enum class ScaleType : uint8_t { F16, BF16 };

struct Int4Spec {
  int64_t group_size = 128;       // 32, 64, 128, or 0 meaning per-channel (group = K)
  bool symmetric = true;
  ScaleType scale_type = ScaleType::F16;
  // Group size actually used for a K (resolves 0 to K); throws Error if K is not a multiple of it.
  int64_t resolved_group(int64_t K, const std::string& what) const;
};

struct Int4Weight {
  int64_t rows = 0, cols = 0;     // N, K
  Int4Spec spec;
  int64_t group = 0;              // resolved group size
  std::vector<uint8_t> qweight;   // [N, K / 2]
  std::vector<uint16_t> scales;   // [N, K / group]   FP16 or BF16 bits per spec.scale_type
  std::vector<uint8_t> zeros;     // [N, K / group]   asymmetric only (empty when symmetric)

  int64_t groups_per_row() const { return cols / group; }
  uint8_t nibble(int64_t r, int64_t c) const {
    const uint8_t b = qweight[static_cast<size_t>(r * (cols / 2) + c / 2)];
    return (c & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
  }
  float scale(int64_t r, int64_t g) const;   // decoded scale of group g in row r
  int zero(int64_t r, int64_t g) const;      // 8 when symmetric
};

// Scale for a group of values (already rounded to spec.scale_type, returned as fp32), and its zero-point.
struct GroupParams {
  float scale;
  int zero;
  uint16_t scale_bits;
};
GroupParams int4_group_params(std::span<const float> group_values, const Int4Spec& spec);
// The nibble for one value under given group params (the rule above).
uint8_t int4_quantize_value(float x, const GroupParams& p);
inline float int4_dequantize_value(uint8_t u, const GroupParams& p) {
  return static_cast<float>(static_cast<int>(u) - p.zero) * p.scale;
}

// Packing of nibble values (0..15, one per column) two per byte: column 2j -> low nibble of byte j, column 2j + 1
// -> high nibble. The count must be even and every value <= 15 (Error otherwise).
std::vector<uint8_t> int4_pack(std::span<const uint8_t> nibbles);
// The inverse: 2 * packed.size() nibble values.
std::vector<uint8_t> int4_unpack(std::span<const uint8_t> packed);

// Round-to-nearest quantisation of a whole [N, K] fp32 weight.
Int4Weight int4_quantize_rtn(std::span<const float> w, int64_t rows, int64_t cols, const Int4Spec& spec,
                             const std::string& tensor_name);
// Dequantise to fp32 [N, K].
std::vector<float> int4_dequantize(const Int4Weight& q);
// q with zero-valued rows appended up to `rows` (>= q.rows): nibbles equal to the zero-point (8 symmetric, 0
// asymmetric) and scale bits 0, so each new row dequantises to exact zeros. For kernels whose N must be a multiple
// of a tile (the W4A16 GEMM's 32) running a weight whose N is not, e.g. an INT4 LM head of vocabulary 32001.
Int4Weight int4_pad_rows(const Int4Weight& q, int64_t rows);

}  // namespace futransformer::formats
