#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "futransformer/error.h"
#include "futransformer/mapped_file.h"

namespace futransformer::bpe {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: pair keys are small, clustered integers
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Pre-tokens longer than this are rare and mostly unique; caching them would only cost memory.
constexpr size_t kMaxCachedPiece = 64;
// The cache lives for one encode() call; clearing it past this size bounds memory on huge inputs.
constexpr size_t kMaxCacheEntries = size_t{1} << 17;

// Per-call working memory, so that a Tokenizer is immutable and encode() is safe from several threads.
struct EncodeState {
  struct Symbol {
    int32_t id;    // -1 once merged into its left neighbour; kNoToken for a byte without a token
    int32_t next;  // index of the next live symbol, -1 at the end
    int32_t prev;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // symbol index: symbols are in text order, so smaller is further left
    int32_t left_id;
    int32_t right_id;
    int32_t merged;
    // std heaps are max-heaps: "greater" puts the lowest rank, then the leftmost pair, on top.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<std::string_view> pieces, scratch;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> cached_ids;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec);

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override;
  std::string decode(std::span<const int32_t> ids, bool keep_special) const override;
  std::string piece(int32_t prev, int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(s_.bytes.size()); }
  int32_t bos_id() const override { return s_.bos_id; }
  int32_t eos_id() const override { return s_.eos_id; }
  bool add_bos() const override { return s_.add_bos; }
  bool is_end_of_generation(int32_t id) const override {
    return id == s_.eos_id || std::find(s_.end_of_generation.begin(), s_.end_of_generation.end(), id) !=
                                  s_.end_of_generation.end();
  }

 private:
  void encode_plain(std::string_view text, EncodeState& st, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, EncodeState& st, std::vector<int32_t>& out) const;
  void merge(std::string_view piece, EncodeState& st, std::vector<int32_t>& out) const;
  void push_candidate(EncodeState& st, int32_t left) const;
  static constexpr int32_t kNoToken = -2;  // symbol of a byte the vocabulary has no token for
  void append_bytes(int32_t id, bool keep_special, std::string& out) const;

  BpeSpec s_;
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<std::string_view, int32_t> normal_ids_;  // views into s_.bytes, which never changes
  // Control and user tokens by their first byte, longest first, so the longest match at a position wins.
  std::array<std::vector<int32_t>, 256> specials_by_first_byte_;
  bool has_specials_ = false;
};

BpeTokenizer::BpeTokenizer(BpeSpec spec) : s_(std::move(spec)) {
  const std::string& src = s_.source;
  check(!s_.bytes.empty() && s_.bytes.size() == s_.kinds.size(), src, ": empty or inconsistent vocabulary");
  check(s_.bytes.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), src, ": vocabulary of ",
        s_.bytes.size(), " tokens is too large");
  byte_ids_.fill(-1);
  normal_ids_.reserve(s_.bytes.size());
  for (size_t id = 0; id < s_.bytes.size(); ++id) {
    const std::string& b = s_.bytes[id];
    const auto i = static_cast<int32_t>(id);
    if (s_.kinds[id] == TokenKind::normal) {
      normal_ids_.emplace(b, i);  // the first id wins for duplicated strings
      if (b.size() == 1 && byte_ids_[static_cast<unsigned char>(b[0])] < 0)
        byte_ids_[static_cast<unsigned char>(b[0])] = i;
    } else if ((s_.kinds[id] == TokenKind::control || s_.kinds[id] == TokenKind::user) && !b.empty()) {
      specials_by_first_byte_[static_cast<unsigned char>(b[0])].push_back(i);
      has_specials_ = true;
    }
  }
  if (s_.missing_byte == BpeSpec::MissingByte::error)
    for (int b = 0; b < 256; ++b)
      check(byte_ids_[b] >= 0, src, ": vocabulary has no token for byte 0x", std::hex, b,
            " (byte-level BPE needs all 256 single-byte tokens)");
  for (auto& ids : specials_by_first_byte_)
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return s_.bytes[a].size() > s_.bytes[b].size(); });
  auto valid = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < s_.bytes.size() && s_.kinds[id] != TokenKind::missing;
  };
  check(s_.missing_byte != BpeSpec::MissingByte::block_unk || valid(s_.unk_id), src, ": unknown-token id ",
        s_.unk_id, " is not a token of the vocabulary");
  check(s_.bos_id == -1 || valid(s_.bos_id), src, ": BOS id ", s_.bos_id, " is not a token of the vocabulary");
  check(s_.eos_id == -1 || valid(s_.eos_id), src, ": EOS id ", s_.eos_id, " is not a token of the vocabulary");
  for (int32_t id : s_.end_of_generation)
    check(valid(id), src, ": end-of-generation id ", id, " is not a token of the vocabulary");
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool parse_special) const {
  EncodeState st;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (!has_specials_) {
    encode_plain(text, st, out);
    return out;
  }
  size_t segment_start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t found = -1;
    for (int32_t id : specials_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (s_.kinds[id] == TokenKind::control && !parse_special) continue;
      if (text.substr(i).starts_with(s_.bytes[id])) {
        found = id;
        break;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    encode_plain(text.substr(segment_start, i - segment_start), st, out);
    out.push_back(found);
    i += s_.bytes[found].size();
    segment_start = i;
  }
  encode_plain(text.substr(segment_start), st, out);
  return out;
}

void BpeTokenizer::encode_plain(std::string_view text, EncodeState& st, std::vector<int32_t>& out) const {
  pre_tokenize(s_.pre, text, st.pieces, st.scratch);
  for (std::string_view piece : st.pieces) encode_piece(piece, st, out);
}

void BpeTokenizer::encode_piece(std::string_view piece, EncodeState& st, std::vector<int32_t>& out) const {
  if (piece.size() == 1 && byte_ids_[static_cast<unsigned char>(piece[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (s_.whole_piece_lookup) {
    if (auto it = normal_ids_.find(piece); it != normal_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    if (auto it = st.cache.find(piece); it != st.cache.end()) {
      const auto [offset, count] = it->second;
      out.insert(out.end(), st.cached_ids.begin() + offset, st.cached_ids.begin() + offset + count);
      return;
    }
  }
  const size_t first = out.size();
  merge(piece, st, out);
  if (cacheable) {
    if (st.cache.size() >= kMaxCacheEntries) {
      st.cache.clear();
      st.cached_ids.clear();
    }
    const auto offset = static_cast<uint32_t>(st.cached_ids.size());
    st.cached_ids.insert(st.cached_ids.end(), out.begin() + first, out.end());
    st.cache.emplace(std::string(piece), std::make_pair(offset, static_cast<uint32_t>(out.size() - first)));
  }
}

void BpeTokenizer::push_candidate(EncodeState& st, int32_t left) const {
  const int32_t right = st.symbols[left].next;
  if (right < 0) return;
  const int32_t left_id = st.symbols[left].id, right_id = st.symbols[right].id;
  if (left_id < 0 || right_id < 0) return;
  if (const PairTable::Entry* e = s_.pairs.find(left_id, right_id)) {
    st.heap.push_back({e->rank, left, left_id, right_id, e->merged});
    std::push_heap(st.heap.begin(), st.heap.end());
  }
}

// Repeatedly merges the adjacent pair with the lowest priority, leftmost first — tiktoken's rule and HF's — with
// a heap of candidates so that long pre-tokens cost O(n log n) instead of O(n^2). Stale candidates (a side
// already merged away) are recognised by their ids and dropped.
void BpeTokenizer::merge(std::string_view piece, EncodeState& st, std::vector<int32_t>& out) const {
  check(piece.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), s_.source, ": pre-token of ",
        piece.size(), " bytes is too long to encode");
  st.symbols.clear();
  for (unsigned char c : piece) {
    const int32_t id = byte_ids_[c];
    if (id < 0 && s_.missing_byte == BpeSpec::MissingByte::skip) continue;
    // A missing byte keeps kNoToken: no pair contains it, so it blocks merges across it.
    st.symbols.push_back({id < 0 ? kNoToken : id, 0, 0});
  }
  const auto n = static_cast<int32_t>(st.symbols.size());
  if (n == 0) return;
  for (int32_t i = 0; i < n; ++i) {
    st.symbols[i].next = i + 1 < n ? i + 1 : -1;
    st.symbols[i].prev = i - 1;
  }
  st.heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(st, i);
  while (!st.heap.empty()) {
    std::pop_heap(st.heap.begin(), st.heap.end());
    const EncodeState::Candidate c = st.heap.back();
    st.heap.pop_back();
    EncodeState::Symbol& left = st.symbols[c.left];
    if (left.id != c.left_id || left.next < 0) continue;
    EncodeState::Symbol& right = st.symbols[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.merged;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) st.symbols[left.next].prev = c.left;
    if (left.prev >= 0) push_candidate(st, left.prev);
    push_candidate(st, c.left);
  }
  for (int32_t i = 0; i >= 0; i = st.symbols[i].next) {
    if (st.symbols[i].id != kNoToken) out.push_back(st.symbols[i].id);
    else if (s_.missing_byte == BpeSpec::MissingByte::block_unk) out.push_back(s_.unk_id);
  }
}

void BpeTokenizer::append_bytes(int32_t id, bool keep_special, std::string& out) const {
  check(id >= 0 && static_cast<size_t>(id) < s_.bytes.size() && s_.kinds[id] != TokenKind::missing, s_.source,
        ": token id ", id, " is not in the vocabulary (", s_.bytes.size(), " ids)");
  if (s_.kinds[id] == TokenKind::control && !keep_special) return;
  out += s_.bytes[id];
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool keep_special) const {
  std::string out;
  for (int32_t id : ids) append_bytes(id, keep_special, out);
  return out;
}

// Byte-level tokens carry their own spaces, so a piece never depends on the previous token.
std::string BpeTokenizer::piece(int32_t /*prev*/, int32_t id) const {
  std::string out;
  append_bytes(id, false, out);
  return out;
}

}  // namespace

void PairTable::reserve(size_t pairs) {
  size_t capacity = 16;
  while (capacity * 3 < pairs * 4) capacity *= 2;  // load factor <= 3/4
  if (capacity <= slots_.size()) return;
  std::vector<Entry> old = std::move(slots_);
  slots_.assign(capacity, Entry{kEmpty, 0, 0});
  count_ = 0;
  for (const Entry& e : old)
    if (e.key != kEmpty) insert(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key), e.rank, e.merged);
}

void PairTable::grow() { reserve(std::max<size_t>(count_ + 1, slots_.size())); }  // doubles the slots

void PairTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((count_ + 1) * 4 > slots_.size() * 3) grow();
  const uint64_t key = pair_key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == key) return;
    if (slots_[i].key == kEmpty) {
      slots_[i] = {key, rank, merged};
      ++count_;
      return;
    }
  }
}

const PairTable::Entry* PairTable::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  const uint64_t key = pair_key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == key) return &slots_[i];
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec) { return std::make_unique<BpeTokenizer>(std::move(spec)); }

std::string read_whole_file(const std::string& path) {
  const auto file = MappedFile::open(path);
  return std::string(reinterpret_cast<const char*>(file->data()), file->size());
}

}  // namespace futransformer::bpe
