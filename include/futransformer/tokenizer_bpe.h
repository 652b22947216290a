// Byte-level BPE tokenizers built from file contents already in memory (the load_* functions in tokenizer.h read
// the file and call these). `source` names the content in error messages.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "futransformer/tokenizer.h"

namespace futransformer {

// Llama-3 tiktoken ranks ("base64token rank" per line, ranks a permutation of 0..N-1). The Llama 3.1 special
// tokens take ids N.. N+255 (N = 128000 for the real file): BOS N, EOS N+1; <|eom_id|> and <|eot_id|> also end
// generation; add_bos is true.
std::unique_ptr<Tokenizer> parse_tiktoken(std::string_view content, const std::string& source);

// HF tokenizer.json content with a BPE model over a byte-level vocabulary. BOS/EOS come from the post_processor
// template (its leading special token is BOS, and add_bos is then true) or, failing that, from the first
// added token found among the usual names (<|begin_of_text|>, <s>, <|im_start|>, <|endoftext|> for BOS;
// <|end_of_text|>, </s>, <|im_end|>, <|endoftext|> for EOS). <|eot_id|>, <|eom_id|>, <|im_end|> and
// <|endoftext|> also end generation when present.
std::unique_ptr<Tokenizer> parse_hf_tokenizer_json(std::string_view content, const std::string& source);

}  // namespace futransformer
