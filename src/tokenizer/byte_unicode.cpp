#include "tokenizer/byte_unicode.h"

#include <array>
#include <cstdint>

namespace futransformer::bpe {
namespace {

// Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, DEL, NBSP, soft hyphen)
// take the code points 256, 257, ... in byte order, which keeps every token string visible.
constexpr bool maps_to_itself(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

struct Tables {
  std::array<uint16_t, 256> code_of_byte{};
  std::array<int16_t, 324> byte_of_code{};  // code points 0..323; -1 = not in the table
  Tables() {
    byte_of_code.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const int code = maps_to_itself(b) ? b : next++;
      code_of_byte[b] = static_cast<uint16_t>(code);
      byte_of_code[code] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    const unsigned code = t.code_of_byte[c];
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else {  // all table code points are below 0x800: two UTF-8 bytes
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c0 = static_cast<unsigned char>(text[i]);
    unsigned code;
    if (c0 < 0x80) {
      code = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      code = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      if (code < 0x80) return std::nullopt;  // overlong encoding
      i += 2;
    } else {
      return std::nullopt;  // invalid UTF-8 or a code point >= 0x800, which the table never uses
    }
    if (code >= t.byte_of_code.size() || t.byte_of_code[code] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte_of_code[code]));
  }
  return out;
}

}  // namespace futransformer::bpe
