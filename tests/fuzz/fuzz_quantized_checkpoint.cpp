// libFuzzer target: a valid quantised checkpoint (tiny model, asymmetric INT4) with one of its files replaced by
// the input — byte 0 picks quantization.json, model.safetensors or tokenizer_data.json — then loaded; and the
// input as a precision recipe's text. Anything but futransformer::Error escaping, or a sanitizer report, is a bug.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>

#include "../tiny_llama.h"
#include "futransformer/error.h"
#include "futransformer/quant/quantize_model.h"
#include "futransformer/recipe.h"

namespace {

std::string make_base_dir() {
  using namespace futransformer;
  Model m = test::make_tiny_llama({}, 1);
  TokenizerData td;
  td.model = "gpt2";
  td.tokens = {"a", "b"};
  td.merges = {"a b"};
  m.tokenizer = td;
  quant::QuantizeOptions o;
  o.recipe = PrecisionRecipe::parse("int4-rtn-g32-asym");
  const std::string dir = "/tmp/fuzz_quantized_checkpoint." + std::to_string(::getpid());
  quant::write_quantized_checkpoint(quant::quantize_model(m, quant::CalibrationSet{}, o), dir);
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace futransformer;
  static const std::string dir = make_base_dir();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    PrecisionRecipe::parse(text);
  } catch (const Error&) {
  }
  if (size == 0) return 0;
  static const char* const kFiles[] = {"quantization.json", "model.safetensors", "tokenizer_data.json"};
  const std::string file = dir + "/" + kFiles[data[0] % 3];
  std::string original;
  {
    std::ifstream in(file, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(text.data() + 1, static_cast<std::streamsize>(size - 1));
  try {
    quant::load_quantized_checkpoint(dir);
  } catch (const Error&) {
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(original.data(), static_cast<std::streamsize>(original.size()));
  return 0;
}
