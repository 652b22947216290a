// libFuzzer target for the llama2.c formats. The first byte picks the parser: odd -> checkpoint on the rest,
// even -> tokenizer.bin, whose vocab_size is the next two bytes (little-endian) and whose file is the rest.
// A loaded tokenizer then encodes and decodes fixed texts. Only futransformer::Error may escape the parsers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "futransformer/error.h"
#include "futransformer/io/llama2c.h"

namespace {

void fuzz_model(const uint8_t* data, size_t size) {
  try {
    const futransformer::Model m = futransformer::parse_llama2c(nullptr, data, size, "fuzz.bin");
    // Reading both ends of every tensor lets AddressSanitizer catch a view that leaves the input.
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : m.tensors) {
      const size_t n = t.nbytes();
      if (n == 0) continue;
      sink = sink ^ t.data[0] ^ t.data[n - 1];
    }
  } catch (const futransformer::Error&) {
  }
}

void fuzz_tokenizer(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const int32_t vocab_size = data[0] | (data[1] << 8);
  try {
    const auto tok = futransformer::parse_llama2c_tokenizer(data + 2, size - 2, vocab_size, "fuzz-tok.bin");
    const std::string texts[] = {"Once upon a time", "h\xC3\xA9llo {x} \xE2\x82\xAC\x80\xFF\xF0\x9F\x98\x80\x80\x80",
                                 std::string("nul\0byte", 8), " "};
    for (const std::string& text : texts) {
      std::vector<int32_t> ids = {tok->bos_id()};
      for (int32_t id : tok->encode(text)) ids.push_back(id);
      tok->decode(ids);
      tok->decode(ids, true);
    }
  } catch (const futransformer::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    fuzz_model(data + 1, size - 1);
  } else {
    fuzz_tokenizer(data + 1, size - 1);
  }
  return 0;
}
