#include "futransformer/formats/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/hadamard.h"
#include "futransformer/formats/int4.h"

namespace futransformer::formats {
namespace {

constexpr int64_t kMaxPageTokens = 4096;
constexpr std::string_view kNames[] = {"bf16", "fp8", "int4", "int4-hadamard"};

int64_t align_up(int64_t v) { return (v + kKvAlign - 1) / kKvAlign * kKvAlign; }
bool is_int4(KvFormat f) { return f == KvFormat::INT4 || f == KvFormat::INT4_HADAMARD; }

Int4Spec kv_int4_spec() {
  Int4Spec s;
  s.group_size = kKvInt4Group;
  s.symmetric = false;
  s.scale_type = ScaleType::F16;
  return s;
}

void check_slot(const KvPageLayout& L, const void* page, int64_t slot, size_t n) {
  check(page != nullptr, "KV cache (", kv_format_name(L.format), "): null page");
  check(slot >= 0 && slot < L.page_tokens, "KV cache (", kv_format_name(L.format), "): slot ", slot,
        " outside a page of ", L.page_tokens, " tokens");
  check(static_cast<int64_t>(n) == L.head_dim, "KV cache (", kv_format_name(L.format), "): got ", n,
        " values for a head of ", L.head_dim);
}

template <typename T>
void store(uint8_t* p, T v) { std::memcpy(p, &v, sizeof(T)); }
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

const char* kv_format_name(KvFormat f) {
  const auto i = static_cast<size_t>(f);
  return i < std::size(kNames) ? kNames[i].data() : "?";
}

KvFormat parse_kv_format(std::string_view name) {
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (name == kNames[i]) return static_cast<KvFormat>(i);
  }
  fail("unknown KV-cache format '", name, "' (valid: bf16, fp8, int4, int4-hadamard)");
}

int64_t KvPageLayout::bytes_per_token() const {
  int64_t meta = 0;
  if (format == KvFormat::FP8) meta = 4;
  if (is_int4(format)) meta = groups * 3;  // fp16 scale + u8 zero per group
  return 2 * (code_row_bytes + meta);
}

KvPageLayout kv_page_layout(KvFormat format, int64_t head_dim, int64_t page_tokens) {
  const char* name = kv_format_name(format);
  check(format <= KvFormat::INT4_HADAMARD, "KV cache: unknown format ", static_cast<int>(format));
  const int64_t multiple = is_int4(format) ? kKvInt4Group : format == KvFormat::FP8 ? 16 : 8;
  check(head_dim > 0 && head_dim <= kKvMaxHeadDim && head_dim % multiple == 0, "KV cache (", name, "): head_dim ",
        head_dim, " is not supported (expected a positive multiple of ", multiple, ", at most ", kKvMaxHeadDim, ")");
  check(page_tokens > 0 && page_tokens <= kMaxPageTokens && page_tokens % 16 == 0, "KV cache (", name,
        "): page size ", page_tokens, " tokens is not supported (expected a positive multiple of 16, at most ",
        kMaxPageTokens, ")");
  KvPageLayout L;
  L.format = format;
  L.head_dim = head_dim;
  L.page_tokens = page_tokens;
  L.code_row_bytes = format == KvFormat::BF16 ? 2 * head_dim : format == KvFormat::FP8 ? head_dim : head_dim / 2;
  L.groups = is_int4(format) ? head_dim / kKvInt4Group : 0;
  int64_t off = 0;
  for (int part = 0; part < 2; ++part) {
    L.codes[part] = off;
    off = align_up(off + page_tokens * L.code_row_bytes);
    L.scales[part] = off;
    if (format == KvFormat::FP8) off = align_up(off + page_tokens * 4);
    if (is_int4(format)) off = align_up(off + page_tokens * L.groups * 2);
    L.zeros[part] = off;
    if (is_int4(format)) off = align_up(off + page_tokens * L.groups);
  }
  L.page_bytes = off;
  return L;
}

void kv_encode_token(const KvPageLayout& L, uint8_t* page, int64_t slot, KvPart part, std::span<const float> x,
                     std::span<const uint16_t> key_anchor) {
  check_slot(L, page, slot, x.size());
  if (!key_anchor.empty()) {
    check(L.format == KvFormat::INT4_HADAMARD && part == KvPart::K, "KV cache (", kv_format_name(L.format),
          "): a key anchor applies to int4-hadamard keys only");
    check(static_cast<int64_t>(key_anchor.size()) == L.head_dim, "KV cache (int4-hadamard): key anchor has ",
          key_anchor.size(), " values for a head of ", L.head_dim);
    const bool finite = std::all_of(key_anchor.begin(), key_anchor.end(),
                                    [](uint16_t h) { return std::isfinite(f16_to_f32(h)); });
    check(finite, "KV cache (int4-hadamard): key anchor contains inf or nan");
  }
  const int p = static_cast<int>(part);
  uint8_t* row = page + L.codes[p] + slot * L.code_row_bytes;
  if (L.format == KvFormat::BF16) {
    for (int64_t i = 0; i < L.head_dim; ++i) store<uint16_t>(row + 2 * i, f32_to_bf16(x[static_cast<size_t>(i)]));
    return;
  }
  const bool finite = std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
  check(finite, "KV cache (", kv_format_name(L.format), "): token vector contains inf or nan");
  if (L.format == KvFormat::FP8) {
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float s = fp8_scale_for_amax(amax, "KV cache (fp8)");
    for (int64_t i = 0; i < L.head_dim; ++i) row[i] = fp8_e4m3_encode(x[static_cast<size_t>(i)] / s);
    store<float>(page + L.scales[p] + slot * 4, s);
    return;
  }
  std::vector<float> v(x.begin(), x.end());
  if (L.format == KvFormat::INT4_HADAMARD) hadamard_blocks(v.data(), L.head_dim, hadamard_block_for(L.head_dim));
  for (size_t i = 0; i < key_anchor.size(); ++i) v[i] -= f16_to_f32(key_anchor[i]);
  const Int4Spec spec = kv_int4_spec();
  std::memset(row, 0, static_cast<size_t>(L.code_row_bytes));
  for (int64_t g = 0; g < L.groups; ++g) {
    const float* src = v.data() + g * kKvInt4Group;
    const GroupParams gp = int4_group_params(std::span<const float>(src, kKvInt4Group), spec);
    store<uint16_t>(page + L.scales[p] + (slot * L.groups + g) * 2, gp.scale_bits);
    page[L.zeros[p] + slot * L.groups + g] = static_cast<uint8_t>(gp.zero);
    for (int64_t i = 0; i < kKvInt4Group; ++i) {
      const int64_t c = g * kKvInt4Group + i;
      const uint8_t u = int4_quantize_value(src[i], gp);
      row[c / 2] = static_cast<uint8_t>(row[c / 2] | ((c & 1) ? (u << 4) : u));
    }
  }
}

void kv_decode_token(const KvPageLayout& L, const uint8_t* page, int64_t slot, KvPart part, std::span<float> out) {
  check_slot(L, page, slot, out.size());
  const int p = static_cast<int>(part);
  const uint8_t* row = page + L.codes[p] + slot * L.code_row_bytes;
  if (L.format == KvFormat::BF16) {
    for (int64_t i = 0; i < L.head_dim; ++i) out[static_cast<size_t>(i)] = bf16_to_f32(load<uint16_t>(row + 2 * i));
    return;
  }
  if (L.format == KvFormat::FP8) {
    const float s = load<float>(page + L.scales[p] + slot * 4);
    for (int64_t i = 0; i < L.head_dim; ++i) out[static_cast<size_t>(i)] = fp8_e4m3_decode(row[i]) * s;
    return;
  }
  for (int64_t g = 0; g < L.groups; ++g) {
    GroupParams gp{};
    gp.scale_bits = load<uint16_t>(page + L.scales[p] + (slot * L.groups + g) * 2);
    gp.scale = f16_to_f32(gp.scale_bits);
    gp.zero = page[L.zeros[p] + slot * L.groups + g];
    for (int64_t i = 0; i < kKvInt4Group; ++i) {
      const int64_t c = g * kKvInt4Group + i;
      const uint8_t u = (c & 1) ? static_cast<uint8_t>(row[c / 2] >> 4) : static_cast<uint8_t>(row[c / 2] & 0xF);
      out[static_cast<size_t>(c)] = int4_dequantize_value(u, gp);
    }
  }
}

std::vector<uint16_t> kv_key_anchor(KvFormat format, std::span<const float> keys, int64_t tokens, int64_t head_dim) {
  check(tokens > 0 && head_dim > 0 && head_dim <= kKvMaxHeadDim, "KV key anchor: ", tokens, " tokens of head_dim ",
        head_dim, " (expected a positive count and head_dim 1..", kKvMaxHeadDim, ")");
  // tokens · head_dim cannot overflow once tokens is bounded by the span's size.
  check(static_cast<uint64_t>(tokens) <= keys.size() && static_cast<int64_t>(keys.size()) == tokens * head_dim,
        "KV key anchor: got ", keys.size(), " values, expected ", tokens, " x ", head_dim);
  // Two-level fp64 sum (the header's order): blocks of kKvAnchorBlockTokens rows in token order, then the block sums
  // in block order.
  std::vector<double> sum(static_cast<size_t>(head_dim), 0.0), block(static_cast<size_t>(head_dim));
  for (int64_t t0 = 0; t0 < tokens; t0 += kKvAnchorBlockTokens) {
    std::fill(block.begin(), block.end(), 0.0);
    for (int64_t t = t0; t < std::min(tokens, t0 + kKvAnchorBlockTokens); ++t) {
      for (int64_t i = 0; i < head_dim; ++i) {
        const float x = keys[static_cast<size_t>(t * head_dim + i)];
        check(std::isfinite(x), "KV key anchor: key of token ", t, " channel ", i, " is not finite");
        block[static_cast<size_t>(i)] += x;
      }
    }
    for (int64_t i = 0; i < head_dim; ++i) sum[static_cast<size_t>(i)] += block[static_cast<size_t>(i)];
  }
  std::vector<float> mean(static_cast<size_t>(head_dim));
  for (size_t i = 0; i < mean.size(); ++i) mean[i] = static_cast<float>(sum[i] / static_cast<double>(tokens));
  kv_rotate_query(format, head_dim, mean);  // the keys' H (no-op for formats that do not rotate)
  constexpr float kF16Max = 65504.0f;
  std::vector<uint16_t> c(static_cast<size_t>(head_dim));
  for (size_t i = 0; i < c.size(); ++i) {
    // Butterflies of means near fp32's limit can overflow to inf and then give inf − inf = NaN: any anchor keeps
    // attention invariant, so such a channel gets 0.
    const float v = std::isnan(mean[i]) ? 0.0f : mean[i];
    c[i] = f32_to_f16(std::clamp(v, -kF16Max, kF16Max));
  }
  return c;
}

int64_t kv_hadamard_block(KvFormat f, int64_t head_dim) {
  return f == KvFormat::INT4_HADAMARD ? hadamard_block_for(head_dim) : 0;
}

void kv_rotate_query(KvFormat f, int64_t head_dim, std::span<float> q) {
  if (f != KvFormat::INT4_HADAMARD) return;
  check(head_dim > 0 && q.size() % static_cast<size_t>(head_dim) == 0, "KV cache (int4-hadamard): ", q.size(),
        " values are not whole heads of ", head_dim);
  hadamard_blocks(q.data(), static_cast<int64_t>(q.size()), hadamard_block_for(head_dim));
}

void kv_unrotate_output(KvFormat f, int64_t head_dim, std::span<float> out) { kv_rotate_query(f, head_dim, out); }

}  // namespace futransformer::formats
