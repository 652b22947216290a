// GPT-2's byte-to-unicode table: byte-level BPE vocabularies (tokenizer.json, GGUF "gpt2") spell every byte as
// one printable code point so that token strings are valid, whitespace-free text.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace futransformer::bpe {

// The byte-level spelling of raw bytes (UTF-8 of the mapped code points).
std::string bytes_to_byte_level(std::string_view bytes);
// The bytes a byte-level token string stands for; nullopt when the string is not valid UTF-8 or holds a code
// point outside the table (such tokens are plain text, e.g. "<|endoftext|>" written raw in some vocabularies).
std::optional<std::string> byte_level_to_bytes(std::string_view text);

}  // namespace futransformer::bpe
