// Byte-level BPE: the Llama-3 tiktoken file against ids computed with OpenAI's tiktoken (Python, same ranks file
// and pattern), tokenizer.json rebuilt from the same ranks, special tokens, robustness, malformed files.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "futransformer/error.h"
#include "futransformer/tokenizer.h"
#include "futransformer/tokenizer_bpe.h"
#include "test_paths.h"
#include "tokenizer/byte_unicode.h"

namespace futransformer {
namespace {

constexpr int32_t kLlama3Base = 128000;  // first special id = number of ranks in the file
// Encoding the 1.3 MB WikiText-2 test file takes well under a second in Release; the bound leaves room for a
// loaded shared machine while still catching an O(n^2) regression.
constexpr double kMaxWikiEncodeSeconds = 10.0;

std::string llama3_path() { return test::shared_path("tokenizers/llama3/tokenizer.model"); }
std::string wiki_path() { return test::shared_path("data/wiki.test.raw"); }

const Tokenizer& llama3() {
  static const std::unique_ptr<Tokenizer> tok = load_tiktoken_tokenizer(llama3_path());
  return *tok;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

// FNV-1a over the ids as little-endian uint32, the same digest the Python reference printed.
uint64_t fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<uint32_t>(id) >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ULL;
    }
  return h;
}

// Expects `fn` to throw Error whose message contains every string in `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error mentioning " << parts.front();
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// From tiktoken 0.14: Encoding("llama3", pat_str=<Llama-3 pattern>, mergeable_ranks=<this file>).encode_ordinary.
const std::vector<Case>& llama3_cases() {
  static const std::vector<Case> cases = {
      {"Hello world", {9906, 1917}},
      {"12345", {4513, 1774}},
      {"I'm here, you'RE not", {40, 2846, 1618, 11, 499, 95253, 539}},
      {"line1\r\nline2\n\n\nx", {1074, 16, 319, 1074, 17, 1432, 87}},
      {"a   b    c  ", {64, 256, 293, 262, 272, 256}},
      {"h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88",
       {71, 19010, 385, 289, 9603, 509, 105180, 102158, 113545, 71634}},
      {"emoji \xf0\x9f\x98\x80\xf0\x9f\x8e\x89 done", {38623, 91416, 9468, 236, 231, 2884}},
      {" 1234567 3.14159", {220, 4513, 10961, 22, 220, 18, 13, 9335, 2946}},
      {"\t\tindent\n  x", {197, 197, 33940, 198, 220, 865}},
      {"Don't    stop!!! ...\n", {8161, 956, 262, 3009, 12340, 12515}},
      {"\xc3\x80\xc3\x89\xc3\x8e \xc3\xb1 \xc3\x9f \xce\xa9 \xd0\x96\xd0\xb8\xd0\xb7\xd0\xbd\xd1\x8c",
       {73053, 27887, 72907, 1717, 109, 1717, 253, 117336, 102866, 41873, 101229}},
      {"   leading and trailing   ", {256, 6522, 323, 28848, 262}},
      // U+FB01 ligature, long s (case-folds to 's'), NBSP and LINE SEPARATOR (Unicode whitespace)
      {"\xef\xac\x81 \xc5\xbf\xc2\xa0nbsp\xe2\x80\xa8sep", {171, 71831, 27006, 123, 4194, 5792, 378, 101, 29136}},
      {"WE'LL 'Ll it's", {12739, 6, 4178, 364, 43, 75, 433, 596}},
  };
  return cases;
}

TEST(TiktokenTokenizer, MatchesTiktokenOnTrickyStrings) {
  FT_REQUIRE_FILE(llama3_path());
  for (const Case& c : llama3_cases()) {
    EXPECT_EQ(llama3().encode(c.text), c.ids) << "text: " << c.text;
    EXPECT_EQ(llama3().decode(c.ids), c.text);
  }
}

TEST(TiktokenTokenizer, Llama3Conventions) {
  FT_REQUIRE_FILE(llama3_path());
  const Tokenizer& t = llama3();
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.bos_id(), 128000);
  EXPECT_EQ(t.eos_id(), 128001);
  EXPECT_TRUE(t.add_bos());
  for (int32_t id : {128001, 128008, 128009}) EXPECT_TRUE(t.is_end_of_generation(id)) << id;
  for (int32_t id : {128000, 128006, 13}) EXPECT_FALSE(t.is_end_of_generation(id)) << id;
}

TEST(TiktokenTokenizer, SpecialTokensOnlyWhenAsked) {
  FT_REQUIRE_FILE(llama3_path());
  const Tokenizer& t = llama3();
  const std::string text = "<|begin_of_text|>Hi";
  EXPECT_EQ(t.encode(text, true), (std::vector<int32_t>{128000, 13347}));
  EXPECT_EQ(t.encode(text, false), (std::vector<int32_t>{27, 91, 7413, 3659, 4424, 91, 29, 13347}));
  const std::vector<int32_t> chat =
      t.encode("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|reserved_special_token_247|>", true);
  ASSERT_GE(chat.size(), 5u);
  EXPECT_EQ(chat.front(), 128006);
  EXPECT_EQ(chat[2], 128007);
  EXPECT_EQ(chat[chat.size() - 2], 128009);
  EXPECT_EQ(chat.back(), 128255);
  EXPECT_EQ(t.decode(chat), "user\n\nHi");
  EXPECT_EQ(t.decode(chat, true),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|reserved_special_token_247|>");
  EXPECT_EQ(t.piece(13347, 128009), "");
  EXPECT_EQ(t.piece(128000, 13347), "Hi");
}

TEST(TiktokenTokenizer, UnknownIdsAreErrors) {
  FT_REQUIRE_FILE(llama3_path());
  const std::vector<int32_t> bad_high = {9906, 128256};
  const std::vector<int32_t> bad_negative = {-1};
  expect_error([&] { llama3().decode(bad_high); }, {"128256", llama3_path()});
  expect_error([&] { llama3().decode(bad_negative); }, {"-1"});
  expect_error([&] { llama3().piece(0, 1 << 30); }, {"1073741824"});
}

TEST(TiktokenTokenizer, WikiTextMatchesTiktokenAndRoundTrips) {
  FT_REQUIRE_FILE(llama3_path());
  FT_REQUIRE_FILE(wiki_path());
  const std::string text = read_file(wiki_path());
  ASSERT_EQ(text.size(), 1290590u);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = llama3().encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s\n", text.size(), ids.size(), seconds);
  // Count and digest of tiktoken's encode_ordinary of the same bytes.
  EXPECT_EQ(ids.size(), 289076u);
  EXPECT_EQ(fnv1a(ids), 0xaa9209a16572bef2ULL);
  EXPECT_EQ(llama3().decode(ids), text);
#ifdef NDEBUG
  EXPECT_LT(seconds, kMaxWikiEncodeSeconds);
#endif
}

TEST(TiktokenTokenizer, ArbitraryBytesRoundTrip) {
  FT_REQUIRE_FILE(llama3_path());
  const Tokenizer& t = llama3();
  const std::vector<std::string> fixed = {
      std::string("\xff\xfe abc \xc3( \xe2\x82 end\x80"), std::string("\xed\xa0\x80 surrogate \xf4\x90\x80\x80"),
      std::string("nul\0inside", 10), std::string(100000, ' '), std::string(100000, 'a'),
      std::string(100000, '7'), std::string(50000, '\n') + "x", std::string(30000, '\xff'),
      "<|begin_of_text|", "<|begin_of_text|><|begin_of_text|>"};
  for (const std::string& s : fixed) {
    EXPECT_EQ(t.decode(t.encode(s)), s) << "size " << s.size();
    EXPECT_EQ(t.decode(t.encode(s, true), true), s) << "size " << s.size();
  }
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> byte(0, 255), len(1, 300), ascii(0, 3);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(static_cast<size_t>(len(rng)), '\0');
    // Mix raw bytes with mostly-ASCII text so that merges, not only single bytes, are exercised.
    for (char& c : s) c = static_cast<char>(ascii(rng) == 0 ? byte(rng) : 32 + byte(rng) % 95);
    const std::vector<int32_t> ids = t.encode(s);
    ASSERT_EQ(t.decode(ids), s) << "trial " << trial;
    std::string streamed;
    for (size_t i = 0; i < ids.size(); ++i) streamed += t.piece(i ? ids[i - 1] : t.bos_id(), ids[i]);
    ASSERT_EQ(streamed, s) << "trial " << trial;
  }
}

// tokenizer.json equivalent of the tiktoken file: vocab in byte-level spelling; for each token the last merge
// tiktoken's algorithm performs when building it from its bytes (only lower ranks available), ordered by rank.
nlohmann::json llama3_as_tokenizer_json(const Tokenizer& tt) {
  std::vector<std::string> bytes(kLlama3Base);
  std::unordered_map<std::string, int32_t> rank;
  for (int32_t id = 0; id < kLlama3Base; ++id) {
    bytes[id] = tt.decode(std::vector<int32_t>{id});
    rank.emplace(bytes[id], id);
  }
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  for (int32_t id = 0; id < kLlama3Base; ++id) {
    vocab[bpe::bytes_to_byte_level(bytes[id])] = id;
    std::vector<std::string> parts;
    for (char c : bytes[id]) parts.emplace_back(1, c);
    while (parts.size() > 2) {
      int32_t best = kLlama3Base;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = rank.find(parts[i] + parts[i + 1]);
        if (it != rank.end() && it->second < best) best = it->second, at = i;
      }
      if (best >= id) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    if (parts.size() == 2)
      merges.push_back(bpe::bytes_to_byte_level(parts[0]) + " " + bpe::bytes_to_byte_level(parts[1]));
  }
  nlohmann::json added = nlohmann::json::array();
  for (int32_t id = kLlama3Base; id < tt.vocab_size(); ++id)
    added.push_back({{"id", id}, {"content", tt.decode(std::vector<int32_t>{id}, true)}, {"special", true}});
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
                       R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"ignore_merges", true},
        {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}},
  };
}

TEST(HfTokenizer, TokenizerJsonFromTiktokenRanksGivesTheSameIds) {
  FT_REQUIRE_FILE(llama3_path());
  FT_REQUIRE_FILE(wiki_path());
  const std::string dir = test::make_temp_dir("tok-bpe");
  const std::string path = dir + "/tokenizer.json";
  write_file(path, llama3_as_tokenizer_json(llama3()).dump());
  const std::unique_ptr<Tokenizer> hf = load_hf_tokenizer(path);
  EXPECT_EQ(hf->vocab_size(), 128256);
  EXPECT_EQ(hf->bos_id(), 128000);  // from the post_processor template, which also means add_bos
  EXPECT_TRUE(hf->add_bos());
  EXPECT_EQ(hf->eos_id(), 128001);
  EXPECT_TRUE(hf->is_end_of_generation(128009));
  for (const Case& c : llama3_cases()) EXPECT_EQ(hf->encode(c.text), c.ids) << c.text;
  EXPECT_EQ(hf->encode("<|begin_of_text|>Hi", true), (std::vector<int32_t>{128000, 13347}));
  const std::string text = read_file(wiki_path());
  const std::vector<int32_t> ids = hf->encode(text);
  EXPECT_EQ(ids, llama3().encode(text));
  EXPECT_EQ(hf->decode(ids), text);

  // tokenizer_config.json beside it overrides BOS/EOS/add_bos the way transformers reads it.
  write_file(dir + "/tokenizer_config.json",
             R"({"add_bos_token": false, "bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>"})");
  const std::unique_ptr<Tokenizer> configured = load_hf_tokenizer(path);
  EXPECT_FALSE(configured->add_bos());
  EXPECT_EQ(configured->eos_id(), 128009);
  write_file(dir + "/tokenizer_config.json", R"({"eos_token": "<|no_such_token|>"})");
  expect_error([&] { load_hf_tokenizer(path); }, {"tokenizer_config.json", "<|no_such_token|>"});
  std::filesystem::remove_all(dir);
}

// A tiny tiktoken file: the 256 bytes (rank = byte value) then "he", "ll", "hel", "hell", "hello".
std::string tiny_tiktoken() {
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto b64 = [](const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); i += 3) {
      uint32_t v = static_cast<unsigned char>(s[i]) << 16;
      if (i + 1 < s.size()) v |= static_cast<unsigned char>(s[i + 1]) << 8;
      if (i + 2 < s.size()) v |= static_cast<unsigned char>(s[i + 2]);
      out += kB64[v >> 18];
      out += kB64[(v >> 12) & 63];
      out += i + 1 < s.size() ? kB64[(v >> 6) & 63] : '=';
      out += i + 2 < s.size() ? kB64[v & 63] : '=';
    }
    return out;
  };
  std::string content;
  int rank = 0;
  for (int b = 0; b < 256; ++b)
    content += b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  for (const char* t : {"he", "ll", "hel", "hell", "hello"}) content += b64(t) + " " + std::to_string(rank++) + "\n";
  return content;
}

TEST(TiktokenTokenizer, TinyFileMergesByRank) {
  const auto t = parse_tiktoken(tiny_tiktoken(), "tiny.model");
  EXPECT_EQ(t->vocab_size(), 261 + 256);
  EXPECT_EQ(t->bos_id(), 261);
  // "hello" is one token; "hell" + "o" would need "hello" absent; "shell" splits as s|hell.
  EXPECT_EQ(t->encode("hello"), (std::vector<int32_t>{260}));
  EXPECT_EQ(t->encode("shell"), (std::vector<int32_t>{'s', 259}));
  EXPECT_EQ(t->encode("hellllo"), (std::vector<int32_t>{259, 257, 'o'}));
}

TEST(TiktokenTokenizer, MalformedFilesNameThePath) {
  const std::string dir = test::make_temp_dir("tok-bpe-bad");
  const std::string good = tiny_tiktoken();
  struct Bad {
    std::string name, content, expected;
  };
  const std::vector<Bad> bad = {
      {"b64.model", good + "!!!! 261\n", "not valid base64"},
      {"b64len.model", good + "aGVsbG 261\n", "not valid base64"},
      {"duprank.model", good + "aGVsbG8h 5\n", "duplicate rank"},
      {"range.model", good + "aGVsbG8h 999\n", "out of range"},
      {"norank.model", good + "aGVsbG8h\n", "base64token rank"},
      {"negrank.model", good + "aGVsbG8h -3\n", "not a non-negative integer"},
      {"hugerank.model", good + "aGVsbG8h 99999999999\n", "rank"},
      {"duptoken.model", good + "aGVsbG8= 261\n", "duplicate token"},
      {"nobytes.model", "aGVsbG8= 0\n", "no token for byte"},
      {"empty.model", "", "no tokens"},
  };
  for (const Bad& b : bad) {
    const std::string path = dir + "/" + b.name;
    write_file(path, b.content);
    expect_error([&] { load_tiktoken_tokenizer(path); }, {path, b.expected});
  }
  expect_error([&] { load_tiktoken_tokenizer(dir + "/missing.model"); }, {dir + "/missing.model"});
  std::filesystem::remove_all(dir);
}

// A small valid tokenizer.json to mutate: the 256 byte-level tokens, "he" and "hel".
nlohmann::json tiny_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[bpe::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  vocab["he"] = 256;
  vocab["hel"] = 257;
  return {{"added_tokens", {{{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", {"he", "l"}}}}}};
}

TEST(HfTokenizer, TinyJsonEncodesAndFindsConventions) {
  const auto t = parse_hf_tokenizer_json(tiny_tokenizer_json().dump(), "tiny.json");
  EXPECT_EQ(t->vocab_size(), 259);
  EXPECT_EQ(t->bos_id(), 258);  // <|endoftext|> is both, GPT-2 style
  EXPECT_EQ(t->eos_id(), 258);
  EXPECT_FALSE(t->add_bos());
  EXPECT_EQ(t->encode("help hel"), (std::vector<int32_t>{257, 'p', ' ', 257}));
  EXPECT_EQ(t->encode("a<|endoftext|>", true), (std::vector<int32_t>{'a', 258}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{'a', 258}), "a");
  EXPECT_EQ(t->decode(std::vector<int32_t>{'a', 258}, true), "a<|endoftext|>");
}

// Bytes without a token cannot round-trip; HF drops them before merging, or emits unk_token when one is set.
TEST(HfTokenizer, BytesWithoutTokenFollowHf) {
  nlohmann::json j = tiny_tokenizer_json();
  j["model"]["vocab"].erase("x");
  const auto skip = parse_hf_tokenizer_json(j.dump(), "tiny.json");
  EXPECT_EQ(skip->encode("hxel"), (std::vector<int32_t>{257}));
  j["model"]["vocab"]["<unk>"] = 259;
  j["model"]["unk_token"] = "<unk>";
  const auto unk = parse_hf_tokenizer_json(j.dump(), "tiny.json");
  EXPECT_EQ(unk->encode("hxel"), (std::vector<int32_t>{'h', 259, 'e', 'l'}));
}

TEST(HfTokenizer, MalformedJsonNamesFileAndField) {
  auto with = [](auto&& mutate) {
    nlohmann::json j = tiny_tokenizer_json();
    mutate(j);
    return j.dump();
  };
  using J = nlohmann::json;
  struct Bad {
    std::string content;
    std::vector<std::string> expected;
  };
  const std::vector<Bad> bad = {
      {"{\"model\": ", {"not valid JSON"}},
      {"[1, 2]", {"JSON object"}},
      {with([](J& j) { j["model"]["type"] = "WordPiece"; }), {"model.type", "WordPiece"}},
      {with([](J& j) { j["model"]["merges"].push_back("he zz"); }), {"model.merges[2]", "zz"}},
      {with([](J& j) { j["model"]["merges"].push_back("l o"); }), {"model.merges[2]", "'lo'"}},
      {with([](J& j) { j["model"]["merges"].push_back(7); }), {"model.merges[2]"}},
      {with([](J& j) { j["model"]["vocab"]["x2"] = 256; }), {"duplicate id 256"}},
      {with([](J& j) { j["model"]["vocab"]["x2"] = 1000000; }), {"model.vocab[\"x2\"]", "out of range"}},
      {with([](J& j) { j["model"]["vocab"]["x2"] = -4; }), {"out of range"}},
      {with([](J& j) { j["model"]["vocab"]["x2"] = "7"; }), {"model.vocab[\"x2\"]", "integer"}},
      {with([](J& j) { j["model"]["unk_token"] = "<nope>"; }), {"model.unk_token", "<nope>"}},
      {with([](J& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }), {"pre_tokenizer.type", "Metaspace"}},
      {with([](J& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}}}}; }),
       {"no ByteLevel"}},
      {with([](J& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }), {"pre_tokenizer.add_prefix_space"}},
      {with([](J& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                                 {{"type", "ByteLevel"}}}}};
       }),
       {"pre_tokenizer.pretokenizers[0].pattern", "does not compile"}},
      {with([](J& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", "Removed"}};
       }),
       {"pre_tokenizer.behavior", "Removed"}},
      {with([](J& j) { j["normalizer"] = {{"type", "NFC"}}; }), {"normalizer"}},
      {with([](J& j) { j["decoder"] = {{"type", "Metaspace"}}; }), {"decoder.type"}},
      {with([](J& j) { j["added_tokens"].push_back({{"id", 258}, {"content", "<x>"}}); }), {"added_tokens[1].id"}},
      {with([](J& j) { j["added_tokens"][0]["content"] = 5; }), {"added_tokens[0].content"}},
      {with([](J& j) { j["model"]["dropout"] = 0.1; }), {"model.dropout"}},
      {with([](J& j) { j.erase("model"); }), {"model"}},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> expected = b.expected;
    expected.push_back("bad.json");
    expect_error([&] { parse_hf_tokenizer_json(b.content, "bad.json"); }, expected);
  }
  const std::string dir = test::make_temp_dir("tok-bpe-json");
  write_file(dir + "/tokenizer.json", "not json");
  expect_error([&] { load_hf_tokenizer(dir + "/tokenizer.json"); }, {dir + "/tokenizer.json", "not valid JSON"});
  std::filesystem::remove_all(dir);
}

TokenizerData tiny_gguf_data(const std::string& pre) {
  TokenizerData d;
  d.model = "gpt2";
  d.pre = pre;
  for (int b = 0; b < 256; ++b) d.tokens.push_back(bpe::bytes_to_byte_level(std::string(1, static_cast<char>(b))));
  d.tokens.insert(d.tokens.end(), {"Ġt", "Ġth", "Ġthe", "12", "<|im_start|>", "<|im_end|>"});
  d.token_types.assign(d.tokens.size(), 1);
  d.token_types[d.tokens.size() - 2] = 3;
  d.token_types[d.tokens.size() - 1] = 3;
  d.merges = {"Ġ t", "Ġt h", "Ġth e", "1 2"};
  d.bos_id = 260;
  d.eos_id = 261;
  return d;
}

TEST(GgufTokenizer, PreTokenizerFollowsThePreName) {
  // "smollm" isolates every digit before the GPT-2 split, so "12" never merges; "gpt2" keeps digit runs.
  const auto smol = make_gguf_tokenizer(tiny_gguf_data("smollm"), "tiny.gguf");
  EXPECT_EQ(smol->encode(" the 12"), (std::vector<int32_t>{258, ' ', '1', '2'}));
  const auto gpt2 = make_gguf_tokenizer(tiny_gguf_data("gpt2"), "tiny.gguf");
  EXPECT_EQ(gpt2->encode(" the 12"), (std::vector<int32_t>{258, ' ', 259}));
  EXPECT_EQ(gpt2->encode("<|im_start|> the<|im_end|>", true), (std::vector<int32_t>{260, 258, 261}));
  EXPECT_EQ(gpt2->decode(std::vector<int32_t>{260, 258, 261}), " the");
  EXPECT_EQ(gpt2->bos_id(), 260);
  EXPECT_TRUE(gpt2->is_end_of_generation(261));
  const auto llama = make_gguf_tokenizer(tiny_gguf_data("llama-bpe"), "tiny.gguf");
  // Llama-3 groups digits by three: "123" | "45".
  EXPECT_EQ(llama->encode(" the 12345"), (std::vector<int32_t>{258, ' ', 259, '3', '4', '5'}));
}

// llama.cpp keeps a byte without a token as a symbol that blocks merges, then drops it.
TEST(GgufTokenizer, BytesWithoutTokenBlockMergesAndVanish) {
  TokenizerData d = tiny_gguf_data("gpt2");
  d.tokens['x'] = "<not-x>";
  const auto t = make_gguf_tokenizer(d, "tiny.gguf");
  EXPECT_EQ(t->encode(" tx"), (std::vector<int32_t>{256}));
  EXPECT_EQ(t->encode(" xt"), (std::vector<int32_t>{' ', 't'}));
}

TEST(GgufTokenizer, UnsupportedOrBrokenDataIsAnError) {
  expect_error([] { make_gguf_tokenizer(tiny_gguf_data("qwen2"), "m.gguf"); }, {"m.gguf", "qwen2", "smollm"});
  TokenizerData spm = tiny_gguf_data("");
  spm.model = "llama";
  expect_error([&] { make_gguf_tokenizer(spm, "m.gguf"); }, {"m.gguf", "not supported"});
  TokenizerData d = tiny_gguf_data("");
  d.merges.push_back("Ġthe zz");
  expect_error([&] { make_gguf_tokenizer(d, "m.gguf"); }, {"m.gguf", "tokenizer.ggml.merges[4]"});
  d = tiny_gguf_data("");
  d.token_types.pop_back();
  expect_error([&] { make_gguf_tokenizer(d, "m.gguf"); }, {"m.gguf", "token_type"});
  d = tiny_gguf_data("");
  d.token_types[3] = 9;
  expect_error([&] { make_gguf_tokenizer(d, "m.gguf"); }, {"m.gguf", "token_type[3]"});
  d = tiny_gguf_data("");
  d.eos_id = 5000;
  expect_error([&] { make_gguf_tokenizer(d, "m.gguf"); }, {"m.gguf", "eos_token_id"});
}

}  // namespace
}  // namespace futransformer
