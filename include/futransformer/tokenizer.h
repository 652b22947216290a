// Tokenizers: byte-level BPE (Llama-3 tiktoken file, HF tokenizer.json, GGUF gpt2 vocab+merges) and the
// llama2.c tokenizer.bin (SentencePiece-style scores). Encode never adds BOS; callers decide.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "futransformer/tokenizer_data.h"

namespace futransformer {

class Model;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text -> ids. Special tokens written in the text (e.g. "<|begin_of_text|>") are recognised when
  // parse_special is true, otherwise they are encoded as ordinary text.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const = 0;
  // ids -> text (bytes). Control tokens decode to their text form only when `keep_special`.
  virtual std::string decode(std::span<const int32_t> ids, bool keep_special = false) const = 0;
  // The bytes one generated token adds when it follows `prev` (for streaming output; llama2.c strips the
  // leading space of the first piece after BOS).
  virtual std::string piece(int32_t prev, int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;   // -1 if none
  virtual int32_t eos_id() const = 0;   // -1 if none
  // Whether prompts for this tokenizer's model conventionally start with BOS.
  virtual bool add_bos() const = 0;
  // Whether `id` ends generation (EOS, end-of-turn, ...).
  virtual bool is_end_of_generation(int32_t id) const { return id == eos_id(); }
};

// Llama-3 tiktoken ranks file (`tokenizer.model`: "base64 rank" lines) with the Llama-3 special tokens
// (128000 <|begin_of_text|> ... 128255) and the Llama-3 pre-tokenizer regex.
std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const std::string& path);
// HF tokenizer.json with a BPE model and a ByteLevel pre-tokenizer (optionally behind a Split regex).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);
// GGUF-embedded vocabulary ("gpt2" model).
std::unique_ptr<Tokenizer> make_gguf_tokenizer(const TokenizerData& data, const std::string& source);
// llama2.c tokenizer.bin for a model with `vocab_size` tokens.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size);
// The right tokenizer for a loaded model: `explicit_path` if given (tokenizer.json, tokenizer.model or
// llama2.c .bin, by content), else the one in the checkpoint, else the one next to it. Throws Error if none.
std::unique_ptr<Tokenizer> load_tokenizer_for_model(const Model& model, const std::string& explicit_path);

}  // namespace futransformer
