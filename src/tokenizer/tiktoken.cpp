// Llama-3 tokenizer.model: tiktoken's "base64(token bytes) rank" lines. The rank is both the token id and the
// merge priority: tiktoken merges the adjacent pair whose concatenation has the lowest rank.
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/tokenizer_bpe.h"
#include "tokenizer/bpe.h"

namespace futransformer {
namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 with padding, as tiktoken writes it; nullopt on anything else.
std::optional<std::string> decode_base64(std::string_view s) {
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  size_t pad = 0;
  if (s.back() == '=') pad = s[s.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    uint32_t v = 0;
    const bool last = i + 4 == s.size();
    for (size_t k = 0; k < 4; ++k) {
      const bool padded = last && k >= 4 - pad;
      const int d = padded ? 0 : base64_value(s[i + k]);
      if (d < 0) return std::nullopt;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out.push_back(static_cast<char>(v >> 16));
    if (!last || pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xFF));
    if (!last || pad < 1) out.push_back(static_cast<char>(v & 0xFF));
  }
  return out;
}

std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> names = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                                    "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                                    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"};
  for (int i = 3; names.size() < 256; ++i) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return names;
}

constexpr int32_t kEomOffset = 8;  // <|eom_id|> is the 9th special token
constexpr int32_t kEotOffset = 9;

}  // namespace

std::unique_ptr<Tokenizer> parse_tiktoken(std::string_view content, const std::string& source) {
  struct Entry {
    std::string bytes;
    uint32_t rank;
    size_t line;
  };
  std::vector<Entry> entries;
  size_t line_no = 0;
  for (size_t pos = 0; pos < content.size();) {
    size_t end = content.find('\n', pos);
    if (end == std::string_view::npos) end = content.size();
    std::string_view line = content.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    check(space != std::string_view::npos, source, ":", line_no, ": expected \"base64token rank\"");
    const std::string_view rank_text = line.substr(space + 1);
    check(!rank_text.empty() && rank_text.size() <= 10 && rank_text.find_first_not_of("0123456789") ==
                                                                  std::string_view::npos,
          source, ":", line_no, ": rank '", rank_text.substr(0, 20), "' is not a non-negative integer");
    const uint64_t rank = std::stoull(std::string(rank_text));
    check(rank < static_cast<uint64_t>(std::numeric_limits<int32_t>::max()), source, ":", line_no, ": rank ", rank,
          " is out of range");
    std::optional<std::string> bytes = decode_base64(line.substr(0, space));
    check(bytes.has_value(), source, ":", line_no, ": token is not valid base64");
    entries.push_back({std::move(*bytes), static_cast<uint32_t>(rank), line_no});
  }
  check(!entries.empty(), source, ": no tokens (expected \"base64token rank\" lines)");
  const std::vector<std::string> specials = llama3_special_tokens();
  check(entries.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()) - specials.size(), source,
        ": too many tokens (", entries.size(), ")");
  const size_t n = entries.size();

  bpe::BpeSpec spec;
  spec.source = source;
  spec.bytes.resize(n + specials.size());
  spec.kinds.assign(n + specials.size(), bpe::TokenKind::missing);
  std::unordered_map<std::string_view, int32_t> id_of;
  id_of.reserve(n);
  for (const Entry& e : entries) {
    check(e.rank < n, source, ":", e.line, ": rank ", e.rank, " is out of range: the file has ", n,
          " tokens, so ranks must be below ", n);
    check(spec.kinds[e.rank] == bpe::TokenKind::missing, source, ":", e.line, ": duplicate rank ", e.rank);
    spec.bytes[e.rank] = e.bytes;
    spec.kinds[e.rank] = bpe::TokenKind::normal;
  }
  for (const Entry& e : entries) {
    const auto [it, inserted] = id_of.emplace(spec.bytes[e.rank], static_cast<int32_t>(e.rank));
    check(inserted, source, ":", e.line, ": duplicate token (same bytes as rank ", it->second, ")");
  }

  // Every split of a token into two tokens is a pair tiktoken may merge into it, with the token's rank as
  // priority; listing them all makes the id-pair merge loop give exactly tiktoken's result.
  spec.pairs.reserve(n * 2);
  for (size_t id = 0; id < n; ++id) {
    const std::string_view t = spec.bytes[id];
    for (size_t k = 1; k < t.size(); ++k) {
      const auto left = id_of.find(t.substr(0, k));
      if (left == id_of.end()) continue;
      const auto right = id_of.find(t.substr(k));
      if (right == id_of.end()) continue;
      spec.pairs.insert(left->second, right->second, static_cast<int32_t>(id), static_cast<int32_t>(id));
    }
  }
  for (size_t i = 0; i < specials.size(); ++i) {
    spec.bytes[n + i] = specials[i];
    spec.kinds[n + i] = bpe::TokenKind::control;
  }
  const auto base = static_cast<int32_t>(n);
  spec.pre.push_back(std::make_shared<bpe::RegexSplitter>(bpe::kLlama3Pattern, false, source + ": pre-tokenizer"));
  spec.whole_piece_lookup = true;
  spec.bos_id = base;
  spec.eos_id = base + 1;
  spec.end_of_generation = {base + kEomOffset, base + kEotOffset};
  spec.add_bos = true;
  return bpe::make_bpe_tokenizer(std::move(spec));
}

std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const std::string& path) {
  return parse_tiktoken(bpe::read_whole_file(path), path);
}

}  // namespace futransformer
