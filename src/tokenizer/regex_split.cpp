#include "tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "futransformer/error.h"

namespace futransformer::bpe {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buffer));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// Only the overall match is read, so one ovector pair serves every pattern; one block per thread keeps encode()
// allocation-free and thread-safe.
pcre2_match_data* thread_match_data() {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(1, nullptr));
  if (!data) throw Error("cannot allocate PCRE2 match data");
  return data.get();
}

bool is_utf8_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
};

RegexSplitter::RegexSplitter(std::string_view pattern, bool literal, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  // MATCH_INVALID_UTF: arbitrary bytes are legal input; invalid sequences simply never match.
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  if (literal) options |= PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                              &offset, nullptr);
  if (impl_->code == nullptr)
    fail(where, ": pattern does not compile at offset ", offset, ": ", pcre2_message(error));
  // JIT is an optimisation only: when unavailable pcre2_match() interprets the pattern.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(impl_->code); }

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  pcre2_match_data* md = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t piece_start = 0;
  size_t pos = 0;
  while (pos < n) {
    const int rc = pcre2_match(impl_->code, subject, n, pos, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("pre-tokenizer regex failed on a ", n, "-byte text: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      if (begin > piece_start) out.push_back(text.substr(piece_start, begin - piece_start));
      out.push_back(text.substr(begin, end - begin));
      piece_start = pos = end;
    } else {
      // An empty match produces no piece; step over one character (or one invalid byte) to make progress.
      pos = begin + 1;
      while (pos < n && is_utf8_continuation(static_cast<unsigned char>(text[pos]))) ++pos;
    }
  }
  if (piece_start < n) out.push_back(text.substr(piece_start));
}

void pre_tokenize(const PreTokenizer& pre, std::string_view text, std::vector<std::string_view>& out,
                  std::vector<std::string_view>& scratch) {
  out.clear();
  if (text.empty()) return;
  out.push_back(text);
  for (const auto& step : pre) {
    scratch.clear();
    for (std::string_view piece : out) step->split(piece, scratch);
    out.swap(scratch);
  }
}

}  // namespace futransformer::bpe
