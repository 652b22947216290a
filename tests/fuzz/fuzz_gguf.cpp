// libFuzzer target: any bytes through the GGUF parser and the Llama conversion. Error is the only acceptable
// failure; crashes, sanitizer reports, leaks and other exceptions are bugs.
#include <cstddef>
#include <cstdint>

#include "futransformer/error.h"
#include "futransformer/io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const futransformer::GgufFile file = futransformer::parse_gguf(nullptr, data, size, "fuzz.gguf");
    const futransformer::Model model = futransformer::gguf_to_model(file, "fuzz.gguf");
    // Touch every tensor's bytes so out-of-range views would be reported by ASan.
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : model.tensors)
      for (size_t i = 0; i < t.nbytes(); ++i) sink = sink ^ t.data[i];
  } catch (const futransformer::Error&) {
  }
  return 0;
}
