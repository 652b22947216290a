// The one byte-level BPE engine behind the tiktoken, tokenizer.json and GGUF loaders. The loaders only translate
// their file into a BpeSpec; everything about encoding and decoding lives here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "futransformer/tokenizer.h"
#include "tokenizer/regex_split.h"

namespace futransformer::bpe {

enum class TokenKind : uint8_t {
  missing,  // an id no file entry defines: decoding it is an error
  normal,   // a BPE token; `bytes` are what it stands for
  control,  // special token: found in text only with parse_special, decoded only with keep_special
  user,     // added non-special token: always found in text, always decoded as its text
  text,     // vocabulary entry not in byte-level spelling: never produced by encode, decoded as its text
};

// (left id, right id) -> merge priority (lower merges first) and the id of the merged token, in an
// open-addressing table: Llama-3 has ~280k pairs and std::unordered_map would triple their memory.
class PairTable {
 public:
  struct Entry {
    uint64_t key;  // (left << 32) | right; kEmpty marks a free slot
    int32_t rank;
    int32_t merged;
  };
  void reserve(size_t pairs);
  // Keeps the first priority given for a pair (llama.cpp and tiktoken both do).
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  const Entry* find(int32_t left, int32_t right) const;
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  void grow();
  std::vector<Entry> slots_;
  size_t count_ = 0;
};

struct BpeSpec {
  std::string source;                 // file name for error messages
  std::vector<std::string> bytes;     // id -> bytes (normal) or text (control/user)
  std::vector<TokenKind> kinds;       // id -> kind; same size as `bytes`
  PairTable pairs;
  PreTokenizer pre;
  // A whole pre-token that is itself a normal token encodes as that token without merging (tiktoken always;
  // tokenizer.json "ignore_merges").
  bool whole_piece_lookup = false;
  // Bytes without a single-byte token (SmolLM2 lacks 21 of them) cannot round-trip; each file format has its
  // reference implementation's answer.
  enum class MissingByte {
    error,       // refuse the vocabulary (tiktoken assumes all 256)
    block_drop,  // the byte stays a symbol no merge involves, then yields nothing (llama.cpp, GGUF)
    skip,        // the byte is dropped before merging, so its neighbours may merge (HF without unk_token)
    block_unk,   // like block_drop but yields unk_id (HF with unk_token)
  };
  MissingByte missing_byte = MissingByte::error;
  int32_t unk_id = -1;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::vector<int32_t> end_of_generation;  // ids besides eos that end generation
  bool add_bos = false;
};

// Validates the spec (ids in range; the single-byte tokens as missing_byte demands) and builds the tokenizer.
// Throws Error naming spec.source.
std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec);

// The whole file as bytes; Error naming `path` when it cannot be read.
std::string read_whole_file(const std::string& path);

}  // namespace futransformer::bpe
