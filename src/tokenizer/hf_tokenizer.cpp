// HF tokenizer.json (model.type "BPE", byte-level vocabulary) -> BpeSpec. Only what byte-level BPE models use is
// accepted; anything else is an Error naming the file and the JSON field, never a silently different encoding.
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "futransformer/error.h"
#include "futransformer/tokenizer_bpe.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_unicode.h"

namespace futransformer {
namespace {

using nlohmann::json;

// Keeps error messages readable when a hostile file puts megabytes where a short name belongs.
std::string clip(std::string_view s) {
  constexpr size_t kMax = 80;
  return s.size() <= kMax ? std::string(s) : std::string(s.substr(0, kMax)) + "...";
}

// Field access that reports "file: field: problem" instead of nlohmann's exceptions.
class Fields {
 public:
  explicit Fields(const std::string& source) : source_(source) {}

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    fail(source_, ": ", field, ": ", what);
  }

  const json* find(const json& obj, const std::string& key) const {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& object(const json& obj, const std::string& key, const std::string& field) const {
    const json* v = find(obj, key);
    if (v == nullptr || !v->is_object()) bad(field, "expected an object");
    return *v;
  }
  std::string string(const json& obj, const std::string& key, const std::string& field) const {
    const json* v = find(obj, key);
    if (v == nullptr || !v->is_string()) bad(field, "expected a string");
    return v->get<std::string>();
  }
  bool boolean(const json& obj, const std::string& key, bool fallback, const std::string& field) const {
    const json* v = find(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) bad(field, "expected true or false");
    return v->get<bool>();
  }
  int64_t id(const json& v, int64_t limit, const std::string& field) const {
    if (!v.is_number_integer()) bad(field, "expected an integer token id");
    const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(limit)
                           ? limit
                           : v.get<int64_t>();
    if (id < 0 || id >= limit)
      bad(field, "token id " + clip(v.dump()) + " is out of range [0, " + std::to_string(limit) + ")");
    return id;
  }
  const std::string& source() const { return source_; }

 private:
  const std::string& source_;
};

// One pre-tokenizer entry; appends its regex steps. Returns whether it was a ByteLevel step.
bool add_pre_tokenizer(const Fields& f, const json& pt, const std::string& field, bpe::PreTokenizer& pre,
                       int depth) {
  const std::string type = f.string(pt, "type", field + ".type");
  if (type == "Sequence") {
    const json* list = f.find(pt, "pretokenizers");
    if (list == nullptr || !list->is_array()) f.bad(field + ".pretokenizers", "expected an array");
    if (depth > 4) f.bad(field, "pre-tokenizer Sequences nested too deeply");
    bool byte_level = false;
    for (size_t i = 0; i < list->size(); ++i)
      byte_level |= add_pre_tokenizer(f, (*list)[i], field + ".pretokenizers[" + std::to_string(i) + "]", pre,
                                      depth + 1);
    return byte_level;
  }
  if (type == "ByteLevel") {
    if (f.boolean(pt, "add_prefix_space", false, field + ".add_prefix_space"))
      f.bad(field + ".add_prefix_space", "true is not supported (it inserts text that decode cannot remove)");
    if (f.boolean(pt, "use_regex", true, field + ".use_regex"))
      pre.push_back(std::make_shared<bpe::RegexSplitter>(bpe::kGpt2Pattern, false, f.source() + ": " + field));
    return true;
  }
  if (type == "Split") {
    const json& pattern = f.object(pt, "pattern", field + ".pattern");
    const std::string behavior = f.string(pt, "behavior", field + ".behavior");
    if (behavior != "Isolated") f.bad(field + ".behavior", "'" + clip(behavior) + "' is not supported (only Isolated)");
    if (f.boolean(pt, "invert", false, field + ".invert")) f.bad(field + ".invert", "true is not supported");
    const bool literal = f.find(pattern, "Regex") == nullptr;
    const std::string text = literal ? f.string(pattern, "String", field + ".pattern.String")
                                     : f.string(pattern, "Regex", field + ".pattern.Regex");
    pre.push_back(std::make_shared<bpe::RegexSplitter>(text, literal, f.source() + ": " + field + ".pattern"));
    return false;
  }
  if (type == "Digits") {
    const bool individual = f.boolean(pt, "individual_digits", false, field + ".individual_digits");
    pre.push_back(std::make_shared<bpe::RegexSplitter>(individual ? bpe::kDigitPattern : bpe::kDigitRunPattern,
                                                       false, f.source() + ": " + field));
    return false;
  }
  f.bad(field + ".type", "'" + clip(type) + "' is not supported (supported: ByteLevel, Split, Digits, Sequence)");
}

// The id of the special token a post_processor template puts first in a single sequence, if any.
std::optional<std::string> template_leading_token(const Fields& f, const json& pp, int depth) {
  const json* type = f.find(pp, "type");
  if (type == nullptr || !type->is_string() || depth > 4) return std::nullopt;
  if (*type == "Sequence") {
    const json* list = f.find(pp, "processors");
    if (list == nullptr || !list->is_array()) return std::nullopt;
    for (const json& p : *list)
      if (auto t = template_leading_token(f, p, depth + 1)) return t;
    return std::nullopt;
  }
  if (*type != "TemplateProcessing") return std::nullopt;
  const json* single = f.find(pp, "single");
  if (single == nullptr || !single->is_array() || single->empty()) return std::nullopt;
  const json* special = f.find(single->front(), "SpecialToken");
  if (special == nullptr) return std::nullopt;
  const json* id = f.find(*special, "id");
  if (id == nullptr || !id->is_string()) return std::nullopt;
  return id->get<std::string>();
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
std::optional<std::string> config_token(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

using bpe::BpeSpec;
using bpe::TokenKind;

std::unique_ptr<Tokenizer> parse_hf(std::string_view content, const std::string& source,
                                    std::string_view config_content, const std::string& config_source) {
  const json root = json::parse(content.begin(), content.end(), nullptr, false);
  check(!root.is_discarded(), source, ": not valid JSON");
  check(root.is_object(), source, ": expected a JSON object at the top level");
  const Fields f(source);

  const json& model = f.object(root, "model", "model");
  const json* type = f.find(model, "type");
  if (type != nullptr && *type != "BPE")
    f.bad("model.type", clip(type->dump()) + " is not supported (only BPE)");
  if (const json* d = f.find(model, "dropout"); d != nullptr && !(d->is_number() && d->get<double>() == 0.0))
    f.bad("model.dropout", "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = f.find(model, key); v != nullptr && !(v->is_string() && v->get<std::string>().empty()))
      f.bad(std::string("model.") + key, "is not supported by byte-level BPE");
  if (f.boolean(model, "byte_fallback", false, "model.byte_fallback"))
    f.bad("model.byte_fallback", "true is not supported (byte-level vocabularies need no fallback)");
  if (f.find(root, "normalizer") != nullptr) f.bad("normalizer", "normalizers are not supported (expected null)");
  if (const json* dec = f.find(root, "decoder"); dec != nullptr) {
    const std::string t = f.string(*dec, "type", "decoder.type");
    if (t != "ByteLevel") f.bad("decoder.type", "'" + clip(t) + "' is not supported (only ByteLevel)");
  }

  const json& vocab = f.object(model, "vocab", "model.vocab");
  const json* added = f.find(root, "added_tokens");
  if (added != nullptr && !added->is_array()) f.bad("added_tokens", "expected an array");
  const size_t n_added = added == nullptr ? 0 : added->size();
  // Ids may leave gaps, but only a few: the bound keeps a hostile file from asking for a huge id table.
  const size_t limit_size = 2 * (vocab.size() + n_added) + 1024;
  check(limit_size < static_cast<size_t>(std::numeric_limits<int32_t>::max()), source, ": too many tokens");
  const auto limit = static_cast<int64_t>(limit_size);

  BpeSpec spec;
  spec.source = source;
  spec.bytes.resize(limit_size);
  spec.kinds.assign(limit_size, TokenKind::missing);
  std::vector<const std::string*> text_of(limit_size, nullptr);  // vocab spelling, for merges
  std::unordered_map<std::string_view, int32_t> id_of;
  id_of.reserve(vocab.size());
  size_t max_id = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = static_cast<size_t>(f.id(it.value(), limit, "model.vocab[\"" + clip(it.key()) + "\"]"));
    if (text_of[id] != nullptr)
      f.bad("model.vocab[\"" + clip(it.key()) + "\"]", "duplicate id " + std::to_string(id) + " (also \"" +
                                                           clip(*text_of[id]) + "\")");
    text_of[id] = &it.key();
    id_of.emplace(it.key(), static_cast<int32_t>(id));
    // Tokens not in byte-level spelling (raw "<|endoftext|>" in some files) decode as their text, like HF does.
    std::optional<std::string> bytes = bpe::byte_level_to_bytes(it.key());
    spec.bytes[id] = bytes ? std::move(*bytes) : it.key();
    spec.kinds[id] = bytes ? TokenKind::normal : TokenKind::text;
    max_id = std::max(max_id, id);
  }
  std::unordered_map<std::string, int32_t> added_ids;
  std::vector<bool> id_added(limit_size, false);
  for (size_t i = 0; i < n_added; ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const json& tok = (*added)[i];
    if (!tok.is_object()) f.bad(field, "expected an object");
    const json* id_json = f.find(tok, "id");
    if (id_json == nullptr) f.bad(field + ".id", "missing");
    const auto id = static_cast<size_t>(f.id(*id_json, limit, field + ".id"));
    std::string text = f.string(tok, "content", field + ".content");
    if (text.empty()) f.bad(field + ".content", "empty token text");
    if (added_ids.count(text) != 0) f.bad(field + ".content", "duplicate added token '" + clip(text) + "'");
    if (id_added[id]) f.bad(field + ".id", "id " + std::to_string(id) + " used by two added tokens");
    id_added[id] = true;
    added_ids.emplace(text, static_cast<int32_t>(id));
    spec.kinds[id] = f.boolean(tok, "special", false, field + ".special") ? TokenKind::control : TokenKind::user;
    spec.bytes[id] = std::move(text);
    max_id = std::max(max_id, id);
  }
  spec.bytes.resize(max_id + 1);
  spec.kinds.resize(max_id + 1);

  const json* merges = f.find(model, "merges");
  if (merges != nullptr && !merges->is_array()) f.bad("model.merges", "expected an array");
  spec.pairs.reserve(merges == nullptr ? 0 : merges->size());
  std::string merged_text;
  for (size_t i = 0; merges != nullptr && i < merges->size(); ++i) {
    const std::string field = "model.merges[" + std::to_string(i) + "]";
    const json& m = (*merges)[i];
    std::string_view left, right;
    if (m.is_string()) {  // "a b": byte-level spellings never contain a space
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        f.bad(field, "expected \"left right\"");
      left = std::string_view(s).substr(0, space);
      right = std::string_view(s).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get_ref<const std::string&>();
      right = m[1].get_ref<const std::string&>();
    } else {
      f.bad(field, "expected \"left right\" or [left, right]");
    }
    const auto l = id_of.find(left), r = id_of.find(right);
    if (l == id_of.end()) f.bad(field, "token '" + clip(left) + "' is not in model.vocab");
    if (r == id_of.end()) f.bad(field, "token '" + clip(right) + "' is not in model.vocab");
    merged_text.assign(left).append(right);
    const auto m_id = id_of.find(merged_text);
    if (m_id == id_of.end()) f.bad(field, "merged token '" + clip(merged_text) + "' is not in model.vocab");
    spec.pairs.insert(l->second, r->second, static_cast<int32_t>(i), m_id->second);
  }

  const json* pt = f.find(root, "pre_tokenizer");
  if (pt == nullptr) f.bad("pre_tokenizer", "missing (byte-level BPE needs a ByteLevel pre-tokenizer)");
  if (!add_pre_tokenizer(f, *pt, "pre_tokenizer", spec.pre, 0))
    f.bad("pre_tokenizer", "no ByteLevel step (only byte-level BPE vocabularies are supported)");
  spec.whole_piece_lookup = f.boolean(model, "ignore_merges", false, "model.ignore_merges");
  spec.missing_byte = BpeSpec::MissingByte::skip;
  if (const json* unk = f.find(model, "unk_token")) {
    if (!unk->is_string()) f.bad("model.unk_token", "expected a string");
    const auto it = id_of.find(unk->get_ref<const std::string&>());
    if (it == id_of.end()) f.bad("model.unk_token", "'" + clip(unk->get<std::string>()) + "' is not in model.vocab");
    spec.missing_byte = BpeSpec::MissingByte::block_unk;
    spec.unk_id = it->second;
  }

  auto special_id = [&](const std::string& text) -> int32_t {
    if (auto it = added_ids.find(text); it != added_ids.end()) return it->second;
    return -1;
  };
  auto first_present = [&](std::initializer_list<const char*> names) -> int32_t {
    for (const char* name : names)
      if (int32_t id = special_id(name); id >= 0) return id;
    return -1;
  };
  if (const json* pp = f.find(root, "post_processor")) {
    if (auto lead = template_leading_token(f, *pp, 0)) {
      spec.bos_id = special_id(*lead);
      spec.add_bos = spec.bos_id >= 0;
    }
  }
  if (spec.bos_id < 0) spec.bos_id = first_present({"<|begin_of_text|>", "<s>", "<|im_start|>", "<|endoftext|>"});
  spec.eos_id = first_present({"<|end_of_text|>", "</s>", "<|im_end|>", "<|endoftext|>"});

  if (!config_content.empty()) {
    const json config = json::parse(config_content.begin(), config_content.end(), nullptr, false);
    check(!config.is_discarded() && config.is_object(), config_source, ": not a JSON object");
    auto resolve = [&](const char* key, int32_t& target) {
      if (auto text = config_token(config, key)) {
        int32_t id = special_id(*text);
        if (id < 0)
          if (auto it = id_of.find(*text); it != id_of.end()) id = it->second;
        check(id >= 0, config_source, ": ", key, " '", *text, "' is not a token of ", source);
        target = id;
      }
    };
    resolve("bos_token", spec.bos_id);
    resolve("eos_token", spec.eos_id);
    auto add_bos = config.find("add_bos_token");
    if (add_bos != config.end() && add_bos->is_boolean()) spec.add_bos = add_bos->get<bool>();
  }
  for (const char* name : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>"})
    if (int32_t id = special_id(name); id >= 0) spec.end_of_generation.push_back(id);
  return bpe::make_bpe_tokenizer(std::move(spec));
}

}  // namespace

std::unique_ptr<Tokenizer> parse_hf_tokenizer_json(std::string_view content, const std::string& source) {
  return parse_hf(content, source, {}, {});
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  const std::string content = bpe::read_whole_file(path);
  // The optional tokenizer_config.json beside the file states BOS/EOS and add_bos the way transformers uses them.
  const std::string config_path = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  std::error_code ec;
  const std::string config = std::filesystem::is_regular_file(config_path, ec) ? bpe::read_whole_file(config_path)
                                                                                 : std::string();
  return parse_hf(content, path, config, config_path);
}

}  // namespace futransformer
