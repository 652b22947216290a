// Karpathy's llama2.c formats: the legacy checkpoint (`run.c` / export.py legacy_export) and tokenizer.bin.
// The file-based entry points (load_llama2c_model in model.h, load_llama2c_tokenizer in tokenizer.h) map the
// file and call these; the fuzz target calls them on arbitrary bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "futransformer/model.h"
#include "futransformer/tokenizer.h"

namespace futransformer {

// Parses a legacy llama2.c checkpoint held in `data[0, size)`. Tensors that need no rearranging point into
// `data` and keep `owner` alive; Q/K weights are permuted from llama2.c's interleaved RoPE pairs into HF
// rotate-half order (owned copies). `source` names the file in every Error.
Model parse_llama2c(std::shared_ptr<const void> owner, const uint8_t* data, size_t size, const std::string& source);

// Parses a llama2.c tokenizer.bin held in `data[0, size)` for a model of `vocab_size` tokens (the file does not
// store its own count). The tokenizer copies what it needs; `data` may be freed afterwards.
std::unique_ptr<Tokenizer> parse_llama2c_tokenizer(const uint8_t* data, size_t size, int32_t vocab_size,
                                                   const std::string& source);

}  // namespace futransformer
