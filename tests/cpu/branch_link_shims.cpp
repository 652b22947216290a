// Branch-local link shims: src/core/model.cpp's load_model() references every format loader, but this branch
// (io-gguf) holds only the GGUF one, so the test binary could not link. These throw loudly if ever called.
// DELETE THIS FILE when merging the io-hf and llama2c branches (a duplicate-symbol error or these messages
// will show if it is forgotten).
#include "futransformer/error.h"
#include "futransformer/model.h"

namespace futransformer {

Model load_hf_model(const std::string& dir) {
  fail(dir, ": the Hugging Face loader is not on this branch (tests/cpu/branch_link_shims.cpp)");
}

Model load_llama2c_model(const std::string& path) {
  fail(path, ": the llama2.c loader is not on this branch (tests/cpu/branch_link_shims.cpp)");
}

}  // namespace futransformer
