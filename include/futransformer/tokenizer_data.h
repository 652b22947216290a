// Tokenizer vocabulary as stored inside a checkpoint (GGUF's tokenizer.ggml.* keys), independent of how it is
// turned into a Tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace futransformer {

struct TokenizerData {
  std::string model;                  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;                    // tokenizer.ggml.pre: pre-tokenizer name ("llama-bpe", "smollm", ...), may be ""
  std::vector<std::string> tokens;    // id -> token text (byte-level BPE: GPT-2 byte-to-unicode form)
  std::vector<float> scores;          // may be empty
  std::vector<int32_t> token_types;   // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; may be empty
  std::vector<std::string> merges;    // "a b" pairs in priority order (gpt2 model)
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;               // tokenizer.ggml.add_bos_token
};

}  // namespace futransformer
