// KV-cache formats and the paged layout that the reference engine and the GPU kernels share. docs/formats.md
// documents every byte, with worked offsets for head_dim 128 and 64.
//
// The unit of encoding is one token's K (or V) vector of one KV head: head_dim fp32 values.
//   bf16           value -> bf16 (round to nearest even). No metadata.
//   fp8            e4m3 codes + one fp32 scale per token per head: exactly fp8_quantize_per_token on the vector
//                  (scale = amax / 448, code = fp8_e4m3_encode(x / scale)); see fp8.h.
//   int4           groups of kKvInt4Group = 32 consecutive channels, asymmetric: the INT4 rule of int4.h with
//                  {group 32, asymmetric, F16 scales}; per group an fp16 scale and an integer zero-point (a byte,
//                  0..15); value = (u - z) * s. Nibbles: low nibble = even channel.
//   int4-hadamard  the vector is first rotated with hadamard_blocks(x, head_dim, hadamard_block_for(head_dim)),
//                  then stored as int4. The cache then holds H·k and H·v: attention must use H·q
//                  (kv_rotate_query; q·k = Hq·Hk since H is orthogonal) and un-rotate its output
//                  (kv_unrotate_output; the output is a weighted sum of H·v, and H is its own inverse).
//                  Keys (not values) are stored relative to a key anchor c: head_dim fp16 values in the rotated
//                  basis, one per (sequence, layer, KV head), fixed by the sequence's first appended chunk
//                  (kv_key_anchor). The K slot holds int4 of y = H·k − c. Softmax is invariant to it: for one
//                  query, q'·(H·k − c) = q·k − q'·c shifts every logit by the same constant. Real key outlier
//                  channels carry a consistent offset across tokens; removing it shrinks every group's range.
//
// Paged layout: a page holds kKvPageTokens = 64 consecutive token slots of one (sequence, layer, KV head).
// Inside a page, four regions, each starting at a multiple of 16 bytes:
//   K codes [P][code_row_bytes] | K meta | V codes [P][code_row_bytes] | V meta
// Codes are token-major rows (slot t's row at codes + t * code_row_bytes). Metadata per format:
//   fp8:  scales fp32 [P]
//   int4: scales fp16 bits [P][G] then zeros u8 [P][G], G = head_dim / 32 (the zeros at a 16-aligned offset)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace futransformer::formats {

enum class KvFormat : uint8_t { BF16, FP8, INT4, INT4_HADAMARD };
enum class KvPart : uint8_t { K, V };

inline constexpr int64_t kKvPageTokens = 64;
inline constexpr int64_t kKvInt4Group = 32;
inline constexpr int64_t kKvMaxHeadDim = 1024;
inline constexpr int64_t kKvAlign = 16;  // every region (and page size) is a multiple of 16 bytes

// "bf16", "fp8", "int4", "int4-hadamard".
const char* kv_format_name(KvFormat f);
// Inverse of kv_format_name; an unknown name throws an Error listing the valid ones.
KvFormat parse_kv_format(std::string_view name);

// Byte offsets of one page's regions (relative to the page start) for one format and head_dim.
struct KvPageLayout {
  KvFormat format = KvFormat::BF16;
  int64_t head_dim = 0;
  int64_t page_tokens = 0;
  int64_t groups = 0;          // int4 groups per token (head_dim / 32); 0 for bf16/fp8
  int64_t code_row_bytes = 0;  // bytes of codes per token: 2*head_dim (bf16), head_dim (fp8), head_dim/2 (int4)
  // Offsets of the regions of part K and part V (index 0 = K, 1 = V). Absent regions have size 0.
  int64_t codes[2] = {0, 0};
  int64_t scales[2] = {0, 0};  // fp8: fp32 [P]; int4: fp16 [P][G]
  int64_t zeros[2] = {0, 0};   // int4: u8 [P][G]
  int64_t page_bytes = 0;      // multiple of 16

  // Bytes that one token of one head takes (K and V, codes and metadata, padding excluded).
  int64_t bytes_per_token() const;
};

// page_tokens must be a positive multiple of 16 (one mma tile of tokens), at most 4096. head_dim must be a
// positive multiple of 32 (int4 formats), 16 (fp8) or 8 (bf16) — so every code row is a multiple of 16 bytes —
// and at most kKvMaxHeadDim. Anything else throws an Error naming the format and the value.
KvPageLayout kv_page_layout(KvFormat format, int64_t head_dim, int64_t page_tokens = kKvPageTokens);

// Encode one token's K or V head vector (head_dim values) into slot `slot` of the page at `page`
// (layout.page_bytes bytes). For int4-hadamard, x is rotated here (x itself is not modified).
// Non-finite values are rejected for the quantised formats.
// key_anchor (fp16 bits, head_dim values, from kv_key_anchor): for int4-hadamard keys, the int4 rule is applied to
// y_i = (H·x)_i − f16_to_f32(key_anchor_i) (fp32 subtraction). Empty = no anchor (y = H·x). A non-empty anchor for
// another format or for part V, of the wrong length, or holding inf/nan, is an Error.
void kv_encode_token(const KvPageLayout& layout, uint8_t* page, int64_t slot, KvPart part, std::span<const float> x,
                     std::span<const uint16_t> key_anchor = {});
// Decode slot `slot` into out (head_dim values) in the cache's domain: for int4-hadamard the values stay rotated
// (apply kv_unrotate_output to get them back in the model's basis), and a K slot encoded with an anchor decodes to
// the anchored value y ≈ H·k − c. Attention over y equals attention over H·k (see above); to get k back (tools,
// tests), add f16_to_f32(c_i) to each y_i, then apply kv_unrotate_output.
void kv_decode_token(const KvPageLayout& layout, const uint8_t* page, int64_t slot, KvPart part,
                     std::span<float> out);

// Tokens per block of kv_key_anchor's sum: the chunk's keys are summed block by block (see below).
inline constexpr int64_t kKvAnchorBlockTokens = 32;

// The key anchor of int4-hadamard: c = fp16(H·m), m_i = the mean over the `tokens` rows of keys ([tokens][head_dim],
// in the model's basis, i.e. not rotated) of channel i, rounded to fp32 from an fp64 sum taken in two levels: the
// rows in consecutive blocks of kKvAnchorBlockTokens (the last block may be shorter), each block summed in fp64 in
// token order starting from 0, then the block sums added in fp64 in block order starting from 0. (A GPU sums the
// blocks in parallel: the longest dependent chain is 32 + tokens / 32 additions instead of `tokens`.) Then H·m
// is kv_rotate_query(format, ...) of m in fp32 (the queries' and keys' transform; nothing for a format that does not
// rotate), and each value is rounded to fp16 with round-to-nearest-even (f32_to_f16). A value beyond fp16's range
// saturates to ±65504, a NaN (butterflies of means near fp32's limit) becomes 0 (any c keeps attention invariant;
// the finite value keeps y finite). H·m equals the mean of the rotated keys H·k up to fp32 rounding: the mean is
// taken before the rotation so that a GPU sums the raw keys and rotates one vector, instead of rotating every key
// of the chunk first. The engine passes the sequence's first appended chunk
// (one token for a decode-only start: c = fp16(H·k)). tokens must be positive, head_dim positive, the values
// finite and keys.size() == tokens · head_dim; anything else is an Error.
std::vector<uint16_t> kv_key_anchor(KvFormat format, std::span<const float> keys, int64_t tokens, int64_t head_dim);

// The Hadamard block a format applies to a head (0 for the formats that do not rotate).
int64_t kv_hadamard_block(KvFormat f, int64_t head_dim);
// In place over v.size() / head_dim consecutive head vectors: H·v for int4-hadamard, nothing otherwise.
// kv_rotate_query before q·k; kv_unrotate_output on the attention output (the same H, named for the reader).
void kv_rotate_query(KvFormat f, int64_t head_dim, std::span<float> q);
void kv_unrotate_output(KvFormat f, int64_t head_dim, std::span<float> out);

}  // namespace futransformer::formats
