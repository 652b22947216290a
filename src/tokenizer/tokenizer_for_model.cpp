// Picks the tokenizer that belongs to a model: an explicit file (its kind recognised by content), else the one
// stored in the checkpoint (GGUF), else the one next to it (HF directory).
#include <fstream>

#include "futransformer/error.h"
#include "futransformer/model.h"
#include "futransformer/tokenizer.h"

namespace futransformer {
namespace {

enum class TokenizerFileKind { HfJson, Tiktoken, Llama2c };

TokenizerFileKind sniff_tokenizer_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), path, ": cannot open tokenizer file");
  char head[64] = {};
  in.read(head, sizeof(head));
  const std::streamsize n = in.gcount();
  check(n > 0, path, ": tokenizer file is empty");
  std::streamsize i = 0;
  while (i < n && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t')) ++i;
  if (i < n && head[i] == '{') return TokenizerFileKind::HfJson;
  // A tiktoken ranks file is printable text ("base64 rank" lines); llama2.c's tokenizer.bin starts with a binary
  // int32 (max_token_length), whose high bytes are zero.
  for (std::streamsize j = 0; j < n; ++j) {
    const unsigned char c = static_cast<unsigned char>(head[j]);
    if (c < 0x20 && c != '\n' && c != '\r') return TokenizerFileKind::Llama2c;
  }
  return TokenizerFileKind::Tiktoken;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_for_model(const Model& model, const std::string& explicit_path) {
  if (!explicit_path.empty()) {
    switch (sniff_tokenizer_file(explicit_path)) {
      case TokenizerFileKind::HfJson: return load_hf_tokenizer(explicit_path);
      case TokenizerFileKind::Tiktoken: return load_tiktoken_tokenizer(explicit_path);
      case TokenizerFileKind::Llama2c:
        return load_llama2c_tokenizer(explicit_path, static_cast<int32_t>(model.config.vocab_size));
    }
  }
  if (model.tokenizer) return make_gguf_tokenizer(*model.tokenizer, model.source);
  if (!model.tokenizer_path.empty()) return load_tokenizer_for_model(model, model.tokenizer_path);
  if (model.format == "llama2c")
    fail(model.source, ": a llama2.c checkpoint carries no tokenizer; pass --tokenizer FILE (its tokenizer.bin, ",
         "e.g. tok512.bin for stories260K)");
  fail(model.source, ": no tokenizer found (none inside the checkpoint, no tokenizer.json or tokenizer.model next ",
       "to it); pass --tokenizer FILE");
}

}  // namespace futransformer
