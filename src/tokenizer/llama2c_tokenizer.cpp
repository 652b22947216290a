// llama2.c tokenizer.bin: int32 max_token_length, then per token float32 score, int32 len, len bytes.
// Encoding and decoding reproduce run.c's encode()/decode() (SentencePiece-style score-greedy BPE with byte
// fallback), so prompts tokenise to the ids run.c feeds its model.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <queue>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/io/llama2c.h"
#include "futransformer/mapped_file.h"
#include "futransformer/tokenizer.h"

namespace futransformer {
namespace {

constexpr int32_t kBos = 1;
constexpr int32_t kEos = 2;
// run.c's byte fallback: the 256 byte pieces <0x00>..<0xFF> follow <unk>, <s>, </s>.
constexpr int32_t kByteFallbackOffset = 3;
// run.c seeds its best merge score with -1e10f: pairs scoring at or below it (or NaN) are never merged.
constexpr float kNoMergeScore = -1e10f;
// SentencePiece pieces are short (Llama 2's longest is a few dozen bytes); a larger field means a corrupt file.
constexpr int32_t kMaxTokenLength = 1 << 16;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::string source)
      : pieces_(std::move(pieces)), scores_(std::move(scores)), source_(std::move(source)) {
    build_index();
    decoded_.reserve(pieces_.size());
    decoded_after_bos_.reserve(pieces_.size());
    for (const std::string& p : pieces_) {
      decoded_.push_back(run_c_decode(p, false));
      decoded_after_bos_.push_back(run_c_decode(p, true));
    }
  }

  // parse_special is ignored: run.c has no special-token syntax, "<s>" in a prompt is ordinary text.
  std::vector<int32_t> encode(std::string_view text, bool /*parse_special*/) const override {
    std::vector<int32_t> ids;
    if (text.empty()) return ids;
    // SentencePiece's add_dummy_prefix, as run.c approximates it: one " " piece before non-empty text.
    append_piece_or_bytes(" ", ids);
    std::string codepoint;
    for (size_t c = 0; c < text.size(); ++c) {
      const auto byte = static_cast<unsigned char>(text[c]);
      if ((byte & 0xC0) != 0x80) codepoint.clear();
      codepoint.push_back(static_cast<char>(byte));
      // Continuation bytes extend the codepoint, but never past 4 bytes (run.c's buffer bound).
      const bool next_continues = c + 1 < text.size() && (static_cast<unsigned char>(text[c + 1]) & 0xC0) == 0x80;
      if (next_continues && codepoint.size() < 4) continue;
      append_piece_or_bytes(codepoint, ids);
      codepoint.clear();
    }
    merge(ids);
    return ids;
  }

  std::string decode(std::span<const int32_t> ids, bool keep_special) const override {
    std::string out;
    int32_t prev = -1;
    for (int32_t id : ids) {
      if (!keep_special && (id == kBos || id == kEos)) {
        check_id(id);
        prev = id;
        continue;
      }
      out += piece(prev, id);
      prev = id;
    }
    return out;
  }

  std::string piece(int32_t prev, int32_t id) const override {
    check_id(id);
    return prev == kBos ? decoded_after_bos_[static_cast<size_t>(id)] : decoded_[static_cast<size_t>(id)];
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  bool add_bos() const override { return true; }
  // run.c stops when the model emits BOS (TinyStories training data delimits stories with BOS); EOS is
  // honoured as well because exported Llama 2 models end with it.
  bool is_end_of_generation(int32_t id) const override { return id == kBos || id == kEos; }

 private:
  // run.c sorts the vocabulary with qsort and finds pieces with bsearch. With duplicate pieces the id it
  // returns depends on where glibc's bsearch probes in the sorted array: replay that probe sequence once per
  // distinct piece over a stable sort (glibc's qsort is a merge sort), then answer lookups from a hash map.
  void build_index() {
    std::vector<int32_t> sorted(pieces_.size());
    for (size_t i = 0; i < sorted.size(); ++i) sorted[i] = static_cast<int32_t>(i);
    auto piece_less = [&](int32_t a, int32_t b) {
      return pieces_[static_cast<size_t>(a)] < pieces_[static_cast<size_t>(b)];
    };
    std::stable_sort(sorted.begin(), sorted.end(), piece_less);
    for (const std::string& key : pieces_) {
      if (index_.count(key) != 0) continue;
      size_t lo = 0, hi = sorted.size();
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        const int cmp = key.compare(pieces_[static_cast<size_t>(sorted[mid])]);
        if (cmp < 0) {
          hi = mid;
        } else if (cmp > 0) {
          lo = mid + 1;
        } else {
          index_.emplace(key, sorted[mid]);
          break;
        }
      }
    }
  }

  static std::string run_c_decode(const std::string& stored, bool after_bos) {
    const char* p = stored.c_str();
    if (after_bos && p[0] == ' ') ++p;
    // Byte pieces look like "<0x0A>". sscanf is what run.c uses, so lenient forms ("<0xA", "<0x41junk")
    // decode the same way here.
    unsigned char byte = 0;
    if (std::sscanf(p, "<0x%02hhX>", &byte) == 1) return std::string(1, static_cast<char>(byte));
    return p;
  }

  int32_t lookup(std::string_view s) const {
    auto it = index_.find(s);
    return it == index_.end() ? -1 : it->second;
  }

  void check_id(int32_t id) const {
    check(id >= 0 && static_cast<size_t>(id) < pieces_.size(), source_, ": token id ", id,
          " is outside the vocabulary of ", pieces_.size(), " tokens");
  }

  // The piece for `text` if the vocabulary has it, else one byte-fallback token per byte. (run.c would index
  // with -1 when the vocabulary lacks " " for the dummy prefix; falling back to its byte is the defined choice.)
  void append_piece_or_bytes(std::string_view text, std::vector<int32_t>& ids) const {
    const int32_t id = lookup(text);
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
    for (char ch : text) {
      const int32_t byte_id = static_cast<unsigned char>(ch) + kByteFallbackOffset;
      check(static_cast<size_t>(byte_id) < pieces_.size(), source_, ": cannot encode byte 0x", std::hex,
            static_cast<int>(static_cast<unsigned char>(ch)), std::dec, ": no piece holds it and its byte-fallback id ",
            byte_id, " is outside the vocabulary of ", pieces_.size(), " tokens");
      ids.push_back(byte_id);
    }
  }

  // run.c merges, until none is left, the adjacent pair whose concatenation is a piece with the highest score,
  // the leftmost on ties. Rescanning every pair after each merge is quadratic, so candidates wait in a heap
  // ordered by (score, original position of the left token): a token keeps the position of its left end, so
  // original positions order the current tokens left to right. Stale entries are dropped when popped.
  void merge(std::vector<int32_t>& ids) const {
    const int32_t n = static_cast<int32_t>(ids.size());
    std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
      prev[static_cast<size_t>(i)] = i - 1;
    }
    std::vector<char> alive(static_cast<size_t>(n), 1);
    struct Candidate {
      float score;
      int32_t left, right, left_id, right_id, merged_id;
    };
    auto lower_priority = [](const Candidate& a, const Candidate& b) {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower_priority)> heap(lower_priority);
    auto consider = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const int32_t a = ids[static_cast<size_t>(left)], b = ids[static_cast<size_t>(right)];
      const int32_t merged = lookup(pieces_[static_cast<size_t>(a)] + pieces_[static_cast<size_t>(b)]);
      if (merged < 0) return;
      const float score = scores_[static_cast<size_t>(merged)];
      if (!(score > kNoMergeScore)) return;
      heap.push({score, left, right, a, b, merged});
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      const auto l = static_cast<size_t>(c.left), r = static_cast<size_t>(c.right);
      if (!alive[l] || !alive[r] || next[l] != c.right || ids[l] != c.left_id || ids[r] != c.right_id) continue;
      ids[l] = c.merged_id;
      alive[r] = 0;
      next[l] = next[r];
      if (next[r] >= 0) prev[static_cast<size_t>(next[r])] = c.left;
      consider(prev[l], c.left);
      consider(c.left, next[l]);
    }
    size_t out = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (alive[static_cast<size_t>(i)]) ids[out++] = ids[static_cast<size_t>(i)];
    }
    ids.resize(out);
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::string source_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> index_;
  std::vector<std::string> decoded_, decoded_after_bos_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& source) : data_(data), size_(size), source_(source) {}
  template <typename T>
  T read(const char* what, int32_t token) {
    require(sizeof(T), what, token);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_bytes(size_t n, const char* what, int32_t token) {
    require(n, what, token);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  void require(size_t n, const char* what, int32_t token) {
    if (n <= size_ - pos_) return;
    if (token < 0) fail(source_, ": truncated: ", what, " needs ", n, " bytes at offset ", pos_, ", file has ", size_);
    fail(source_, ": truncated: token ", token, " ", what, " needs ", n, " bytes at offset ", pos_, ", file has ",
         size_);
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& source_;
};

}  // namespace

std::unique_ptr<Tokenizer> parse_llama2c_tokenizer(const uint8_t* data, size_t size, int32_t vocab_size,
                                                   const std::string& source) {
  check(vocab_size > kEos, source, ": llama2.c tokenizer for vocab_size ", vocab_size,
        ": expected at least 3 tokens (<unk>, <s>, </s>)");
  Reader in(data, size, source);
  const auto max_len = in.read<int32_t>("max_token_length", -1);
  check(max_len > 0 && max_len <= kMaxTokenLength, source, ": max_token_length = ", max_len,
        ", expected a value in [1, ", kMaxTokenLength, "]");
  std::vector<std::string> pieces;
  std::vector<float> scores;
  // Every token takes at least 9 bytes, so a corrupt vocab_size cannot make us reserve more than the file.
  const size_t reserve = std::min(static_cast<size_t>(vocab_size), size / 9);
  pieces.reserve(reserve);
  scores.reserve(reserve);
  for (int32_t i = 0; i < vocab_size; ++i) {
    scores.push_back(in.read<float>("score", i));
    const auto len = in.read<int32_t>("length", i);
    check(len > 0 && len <= max_len, source, ": token ", i, " has length ", len, ", expected a value in [1, ",
          max_len, "] (max_token_length)");
    std::string piece = in.read_bytes(static_cast<size_t>(len), "bytes", i);
    // run.c keeps pieces as C strings; a NUL would silently cut the piece, so the file is malformed.
    check(piece.find('\0') == std::string::npos, source, ": token ", i, " contains a NUL byte");
    pieces.push_back(std::move(piece));
  }
  check(in.remaining() == 0, source, ": ", in.remaining(), " bytes follow the ", vocab_size,
        " tokens the model's vocab_size implies (tokenizer for a different model?)");
  return std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores), source);
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  return parse_llama2c_tokenizer(file->data(), file->size(), vocab_size, path);
}

}  // namespace futransformer
