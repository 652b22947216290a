// The SmolLM2 GGUF vocabulary (tokenizer.ggml.model "gpt2", pre "smollm") against ids from HF `tokenizers`
// 0.23 run on a tokenizer.json rebuilt from the same GGUF data (Digits(individual) + ByteLevel, as SmolLM2 ships).
// The GGUF key/value section is read by a small reader local to this test, independent of the library's loader.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "futransformer/mapped_file.h"
#include "futransformer/tokenizer.h"
#include "futransformer/tokenizer_bpe.h"
#include "test_paths.h"

namespace futransformer {
namespace {

// Reads just the metadata of a GGUF v2/v3 file; throws std::runtime_error on anything unexpected.
class GgufMetadataReader {
 public:
  explicit GgufMetadataReader(const MappedFile& f) : p_(f.data()), end_(f.data() + f.size()) {}

  TokenizerData read() {
    if (take(4) != "GGUF") throw std::runtime_error("not a GGUF file");
    const auto version = pod<uint32_t>();
    if (version < 2) throw std::runtime_error("GGUF version " + std::to_string(version));
    pod<uint64_t>();  // tensor count
    const auto n_kv = pod<uint64_t>();
    TokenizerData d;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const auto type = pod<uint32_t>();
      if (key == "tokenizer.ggml.model") d.model = str_of(type);
      else if (key == "tokenizer.ggml.pre") d.pre = str_of(type);
      else if (key == "tokenizer.ggml.tokens") d.tokens = str_array(type);
      else if (key == "tokenizer.ggml.merges") d.merges = str_array(type);
      else if (key == "tokenizer.ggml.token_type") d.token_types = int_array(type);
      else if (key == "tokenizer.ggml.bos_token_id") d.bos_id = static_cast<int32_t>(uint_of(type));
      else if (key == "tokenizer.ggml.eos_token_id") d.eos_id = static_cast<int32_t>(uint_of(type));
      else if (key == "tokenizer.ggml.add_bos_token") d.add_bos = uint_of(type) != 0;
      else skip(type);
    }
    return d;
  }

 private:
  std::string take(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) throw std::runtime_error("truncated GGUF metadata");
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  template <typename T>
  T pod() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  std::string str() { return take(pod<uint64_t>()); }
  std::string str_of(uint32_t type) {
    if (type != 8) throw std::runtime_error("expected a string");
    return str();
  }
  uint64_t uint_of(uint32_t type) {
    switch (type) {
      case 0: case 1: case 7: return pod<uint8_t>();
      case 2: case 3: return pod<uint16_t>();
      case 4: case 5: return pod<uint32_t>();
      case 10: case 11: return pod<uint64_t>();
      default: throw std::runtime_error("expected an integer");
    }
  }
  std::vector<std::string> str_array(uint32_t type) {
    if (type != 9 || pod<uint32_t>() != 8) throw std::runtime_error("expected an array of strings");
    std::vector<std::string> out(pod<uint64_t>());
    for (auto& s : out) s = str();
    return out;
  }
  std::vector<int32_t> int_array(uint32_t type) {
    if (type != 9) throw std::runtime_error("expected an array");
    const auto elem = pod<uint32_t>();
    std::vector<int32_t> out(pod<uint64_t>());
    for (auto& v : out) v = static_cast<int32_t>(uint_of(elem));
    return out;
  }
  void skip(uint32_t type) {
    if (type == 8) {
      str();
    } else if (type == 9) {
      const auto elem = pod<uint32_t>();
      const auto n = pod<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) skip(elem);
    } else if (type == 6 || type == 12) {
      take(type == 6 ? 4 : 8);
    } else {
      uint_of(type);
    }
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

const TokenizerData& smollm2_data() {
  static const TokenizerData data = GgufMetadataReader(*MappedFile::open(test::smollm2_gguf_path())).read();
  return data;
}

const Tokenizer& smollm2() {
  static const std::unique_ptr<Tokenizer> tok = make_gguf_tokenizer(smollm2_data(), test::smollm2_gguf_path());
  return *tok;
}

uint64_t fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<uint32_t>(id) >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ULL;
    }
  return h;
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// tokenizers 0.23: Tokenizer.encode(text, add_special_tokens=False).ids on the rebuilt tokenizer.json.
const std::vector<Case>& smollm2_cases() {
  static const std::vector<Case> cases = {
      {"Hello world", {19556, 905}},
      {"12345", {33, 34, 35, 36, 37}},
      {"I'm here, you'RE not", {57, 5248, 1535, 28, 346, 23, 3256, 441}},
      {"line1\r\nline2\n\n\nx", {1311, 33, 201, 198, 1311, 34, 1116, 198, 104}},
      {"a   b    c  ", {81, 256, 278, 333, 265, 256}},
      {"h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
       {88, 2756, 31394, 267, 29989, 400, 17097, 241, 115, 40993, 179, 120, 248}},
      {"emoji \xf0\x9f\x98\x80\xf0\x9f\x8e\x89 done", {391, 33777, 40303, 218, 10813, 232, 227, 2294}},
      {" 1234567 3.14159", {216, 33, 34, 35, 36, 37, 38, 39, 216, 35, 30, 33, 36, 33, 37, 41}},
  };
  return cases;
}

TEST(GgufSmolLM2Tokenizer, MetadataIsTheSmolLMByteLevelVocabulary) {
  FT_REQUIRE_FILE(test::smollm2_gguf_path());
  const TokenizerData& d = smollm2_data();
  EXPECT_EQ(d.model, "gpt2");
  EXPECT_EQ(d.pre, "smollm");
  EXPECT_EQ(d.tokens.size(), 49152u);
  EXPECT_EQ(d.merges.size(), 48900u);
  EXPECT_EQ(smollm2().vocab_size(), 49152);
  EXPECT_EQ(smollm2().bos_id(), 1);  // <|im_start|>
  EXPECT_EQ(smollm2().eos_id(), 2);  // <|im_end|>
  EXPECT_FALSE(smollm2().add_bos());
  EXPECT_TRUE(smollm2().is_end_of_generation(0));  // <|endoftext|>
}

TEST(GgufSmolLM2Tokenizer, MatchesHfTokenizers) {
  FT_REQUIRE_FILE(test::smollm2_gguf_path());
  for (const Case& c : smollm2_cases()) {
    EXPECT_EQ(smollm2().encode(c.text), c.ids) << c.text;
    EXPECT_EQ(smollm2().decode(c.ids), c.text);
  }
  const std::vector<int32_t> chat = smollm2().encode("<|im_start|>user\nHi<|im_end|>", true);
  EXPECT_EQ(chat, (std::vector<int32_t>{1, 4093, 198, 26843, 2}));
  EXPECT_EQ(smollm2().decode(chat), "user\nHi");
  EXPECT_EQ(smollm2().decode(chat, true), "<|im_start|>user\nHi<|im_end|>");
}

TEST(GgufSmolLM2Tokenizer, WikiTextMatchesHfTokenizersAndRoundTrips) {
  FT_REQUIRE_FILE(test::smollm2_gguf_path());
  const std::string wiki = test::shared_path("data/wiki.test.raw");
  FT_REQUIRE_FILE(wiki);
  std::ifstream in(wiki, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::vector<int32_t> ids = smollm2().encode(text);
  EXPECT_EQ(ids.size(), 303415u);
  EXPECT_EQ(fnv1a(ids), 0x8672b255a2935a9bULL);
  EXPECT_EQ(smollm2().decode(ids), text);
}

// The same vocabulary as SmolLM2's own tokenizer.json layout goes through the tokenizer.json loader (Digits then
// ByteLevel with its regex) and must agree with the GGUF path.
TEST(GgufSmolLM2Tokenizer, TokenizerJsonLayoutAgrees) {
  FT_REQUIRE_FILE(test::smollm2_gguf_path());
  const TokenizerData& d = smollm2_data();
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    vocab[d.tokens[i]] = i;
    if (d.token_types[i] == 3) added.push_back({{"id", i}, {"content", d.tokens[i]}, {"special", true}});
  }
  const nlohmann::json j = {
      {"added_tokens", added},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", d.merges}}}};
  const auto hf = parse_hf_tokenizer_json(j.dump(), "smollm2-tokenizer.json");
  EXPECT_EQ(hf->bos_id(), 1);
  EXPECT_EQ(hf->eos_id(), 2);
  for (const Case& c : smollm2_cases()) EXPECT_EQ(hf->encode(c.text), c.ids) << c.text;
  EXPECT_EQ(hf->encode("<|im_start|>user\nHi<|im_end|>", true), (std::vector<int32_t>{1, 4093, 198, 26843, 2}));
}

}  // namespace
}  // namespace futransformer
