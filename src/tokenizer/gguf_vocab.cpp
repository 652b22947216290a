// GGUF-embedded byte-level BPE vocabulary (tokenizer.ggml.model "gpt2") -> BpeSpec. The pre-tokenizer is named
// by tokenizer.ggml.pre; each supported name maps to the splits llama.cpp applies for it.
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>

#include "futransformer/error.h"
#include "futransformer/tokenizer.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_unicode.h"

namespace futransformer {
namespace {

constexpr const char* kSupportedPre = "llama-bpe, llama3, smollm, gpt2, or empty";

bpe::PreTokenizer pre_tokenizer_for(const std::string& pre, const std::string& source) {
  const std::string where = source + ": tokenizer.ggml.pre '" + pre + "'";
  bpe::PreTokenizer steps;
  if (pre == "llama-bpe" || pre == "llama3") {
    steps.push_back(std::make_shared<bpe::RegexSplitter>(bpe::kLlama3Pattern, false, where));
  } else if (pre == "smollm") {
    // SmolLM2's tokenizer.json: Digits(individual_digits) then ByteLevel(use_regex); llama.cpp's SMOLLM entry
    // is the same pair of splits.
    steps.push_back(std::make_shared<bpe::RegexSplitter>(bpe::kDigitPattern, false, where));
    steps.push_back(std::make_shared<bpe::RegexSplitter>(bpe::kGpt2Pattern, false, where));
  } else if (pre == "gpt2" || pre.empty()) {
    steps.push_back(std::make_shared<bpe::RegexSplitter>(bpe::kGpt2Pattern, false, where));
  } else {
    fail(where, " is not supported (supported: ", kSupportedPre, ")");
  }
  return steps;
}

bpe::TokenKind kind_of_type(int32_t type, size_t id, const std::string& source) {
  switch (type) {
    case 1:  // normal
    case 6:  // byte (a SentencePiece notion; a gpt2 vocabulary spells bytes like any token)
      return bpe::TokenKind::normal;
    case 2:  // unknown
    case 3:  // control
    case 5:  // unused: like llama.cpp, matched in text only when parsing specials and hidden on decode
      return bpe::TokenKind::control;
    case 4:  // user-defined
      return bpe::TokenKind::user;
    default:
      fail(source, ": tokenizer.ggml.token_type[", id, "] is ", type, ", expected 1..6");
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_gguf_tokenizer(const TokenizerData& data, const std::string& source) {
  if (data.model == "llama")
    fail(source, ": tokenizer.ggml.model 'llama' (SentencePiece) is not supported; only 'gpt2' (byte-level BPE)");
  check(data.model == "gpt2", source, ": tokenizer.ggml.model '", data.model,
        "' is not supported; only 'gpt2' (byte-level BPE)");
  const size_t n = data.tokens.size();
  check(n > 0, source, ": tokenizer.ggml.tokens is empty");
  check(n < static_cast<size_t>(std::numeric_limits<int32_t>::max()), source, ": tokenizer.ggml.tokens has ", n,
        " entries, too many");
  check(data.token_types.empty() || data.token_types.size() == n, source, ": tokenizer.ggml.token_type has ",
        data.token_types.size(), " entries, expected ", n, " (one per token)");

  bpe::BpeSpec spec;
  spec.source = source;
  spec.pre = pre_tokenizer_for(data.pre, source);
  // Llama-3 vocabularies come from tiktoken, which looks a whole pre-token up before merging (llama.cpp sets
  // ignore_merges for this pre-tokenizer for the same reason).
  spec.whole_piece_lookup = data.pre == "llama-bpe" || data.pre == "llama3";
  spec.missing_byte = bpe::BpeSpec::MissingByte::block_drop;
  spec.bytes.resize(n);
  spec.kinds.resize(n);
  std::unordered_map<std::string_view, int32_t> id_of;  // spelling -> first id, for merges
  id_of.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = data.tokens[id];
    id_of.emplace(text, static_cast<int32_t>(id));
    bpe::TokenKind kind = data.token_types.empty() ? bpe::TokenKind::normal
                                                   : kind_of_type(data.token_types[id], id, source);
    if (kind == bpe::TokenKind::normal) {
      // A normal token outside byte-level spelling cannot come out of encode; it decodes as its text.
      if (std::optional<std::string> bytes = bpe::byte_level_to_bytes(text)) {
        spec.bytes[id] = std::move(*bytes);
      } else {
        spec.bytes[id] = text;
        kind = bpe::TokenKind::text;
      }
    } else {
      spec.bytes[id] = text;
    }
    spec.kinds[id] = kind;
  }

  spec.pairs.reserve(data.merges.size());
  std::string merged;
  for (size_t i = 0; i < data.merges.size(); ++i) {
    const std::string& m = data.merges[i];
    const size_t space = m.find(' ');
    check(space != std::string::npos && m.find(' ', space + 1) == std::string::npos, source,
          ": tokenizer.ggml.merges[", i, "] '", m, "' is not \"left right\"");
    const std::string_view left = std::string_view(m).substr(0, space), right = std::string_view(m).substr(space + 1);
    const auto l = id_of.find(left), r = id_of.find(right);
    merged.assign(left).append(right);
    const auto t = id_of.find(merged);
    check(l != id_of.end() && r != id_of.end() && t != id_of.end(), source, ": tokenizer.ggml.merges[", i, "] '", m,
          "' refers to a token missing from tokenizer.ggml.tokens");
    spec.pairs.insert(l->second, r->second, static_cast<int32_t>(i), t->second);
  }

  auto in_range = [&](int32_t id, const char* key) {
    check(id >= -1 && id < static_cast<int64_t>(n), source, ": ", key, " ", id, " is outside the ", n,
          "-token vocabulary");
    return id;
  };
  spec.bos_id = in_range(data.bos_id, "tokenizer.ggml.bos_token_id");
  spec.eos_id = in_range(data.eos_id, "tokenizer.ggml.eos_token_id");
  spec.add_bos = data.add_bos;
  // GGUF stores one EOS; chat models also stop at their end-of-turn token, found by its text (llama.cpp does too).
  for (const char* name : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>"}) {
    auto it = id_of.find(name);
    if (it != id_of.end() && spec.kinds[it->second] == bpe::TokenKind::control && it->second != spec.eos_id)
      spec.end_of_generation.push_back(it->second);
  }
  return bpe::make_bpe_tokenizer(std::move(spec));
}

}  // namespace futransformer
