// Byte-level BPE fuzz target. First byte: 0 parse as tokenizer.json, 1 parse as a tiktoken file, otherwise encode
// the rest with a small in-memory tokenizer (first byte picks which, and whether specials are parsed) and require
// decode(encode(x)) == x. futransformer::Error is an accepted outcome; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/tokenizer.h"
#include "futransformer/tokenizer_bpe.h"

namespace {

using futransformer::Tokenizer;

// GPT-2's byte-to-unicode spelling of one byte, written out here so the target depends on public headers only.
std::string byte_level(unsigned b) {
  const bool itself = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  unsigned code = b;
  if (!itself) {
    code = 256;
    for (unsigned c = 0; c < b; ++c)
      if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) ++code;
  }
  if (code < 0x80) return std::string(1, static_cast<char>(code));
  return {static_cast<char>(0xC0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3F))};
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// 256 byte tokens, a few merges that chain ("Ġt" "Ġth" "Ġthe", "in" "ing"), two specials; pre-tokenizer chosen by
// `pre` so the regex steps are exercised too.
std::string tiny_json(const std::string& pre) {
  std::string vocab;
  for (unsigned b = 0; b < 256; ++b) vocab += json_string(byte_level(b)) + ":" + std::to_string(b) + ",";
  vocab += R"("Ġt":256,"Ġth":257,"Ġthe":258,"in":259,"ing":260,"11":261)";
  return R"({"added_tokens":[{"id":262,"content":"<|endoftext|>","special":true},)"
         R"({"id":263,"content":"<sep>","special":false}],"pre_tokenizer":)" +
         pre + R"(,"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{)" + vocab +
         R"(},"merges":["Ġ t","Ġt h","Ġth e","i n","in g","1 1"]}})";
}

const std::vector<std::unique_ptr<Tokenizer>>& tokenizers() {
  static const std::vector<std::unique_ptr<Tokenizer>> all = [] {
    std::vector<std::unique_ptr<Tokenizer>> v;
    v.push_back(futransformer::parse_hf_tokenizer_json(
        tiny_json(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})"), "fuzz-gpt2.json"));
    v.push_back(futransformer::parse_hf_tokenizer_json(
        tiny_json(R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":)"
                  R"("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|)"
                  R"( ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},)"
                  R"("behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]})"),
        "fuzz-llama3.json"));
    v.push_back(futransformer::parse_hf_tokenizer_json(
        tiny_json(R"({"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},)"
                  R"({"type":"ByteLevel","use_regex":true}]})"),
        "fuzz-smollm.json"));
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const uint8_t mode = data[0];
  try {
    if (mode == 0) {
      const auto t = futransformer::parse_hf_tokenizer_json(rest, "fuzz.json");
      const std::vector<int32_t> ids = t->encode("Hello 123 world<|endoftext|>", true);
      (void)t->decode(ids, true);
    } else if (mode == 1) {
      const auto t = futransformer::parse_tiktoken(rest, "fuzz.model");
      const std::vector<int32_t> ids = t->encode("Hello 123 world<|begin_of_text|>", true);
      if (t->decode(ids, true) != "Hello 123 world<|begin_of_text|>") std::abort();
    } else {
      const auto& all = tokenizers();
      const Tokenizer& t = *all[mode % all.size()];
      const bool special = (mode & 0x80) != 0;
      const std::vector<int32_t> ids = t.encode(rest, special);
      // Specials decode to their text only with keep_special; without parse_special none are produced.
      if (t.decode(ids, special) != rest) std::abort();
    }
  } catch (const futransformer::Error&) {
  }
  return 0;
}
