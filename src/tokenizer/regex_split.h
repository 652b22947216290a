// Pre-tokenizer splits: a PCRE2 pattern (UTF + Unicode properties, JIT) cutting text into pieces, where both the
// matches and the text between them become pieces ("Isolated" in HF terms), so nothing of the input is lost.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace futransformer::bpe {

// The patterns the supported tokenizers use.
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// HF Digits pre-tokenizer (Rust char::is_numeric is exactly \p{N}).
inline constexpr std::string_view kDigitPattern = R"(\p{N})";
inline constexpr std::string_view kDigitRunPattern = R"(\p{N}+)";

class RegexSplitter {
 public:
  // Compiles `pattern` (a PCRE2 regex, or a literal string when `literal`); throws Error naming `where` (file and
  // field) with PCRE2's message when it does not compile.
  RegexSplitter(std::string_view pattern, bool literal, const std::string& where);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` to `out`, in order; their concatenation is `text`. Invalid UTF-8 never matches
  // (PCRE2_MATCH_INVALID_UTF) and so lands in the gaps, which keeps arbitrary bytes round-tripping. Throws Error
  // if PCRE2 gives up (match/heap limits on pathological input).
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A chain of splits: each one re-splits every piece the previous one produced.
using PreTokenizer = std::vector<std::shared_ptr<const RegexSplitter>>;

// Pieces of `text` after every step of `pre` (the text itself when `pre` is empty); `scratch` is reused storage.
void pre_tokenize(const PreTokenizer& pre, std::string_view text, std::vector<std::string_view>& out,
                  std::vector<std::string_view>& scratch);

}  // namespace futransformer::bpe
