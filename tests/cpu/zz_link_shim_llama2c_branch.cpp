// BRANCH-ONLY LINK SHIM — revert this file's commit when merging. model.cpp's load_model() references the HF and
// GGUF loaders, which other branches provide; without them the test binary of the llama2c branch cannot link.
// The definitions are weak and live in the test binary only, so forgetting to delete the file after the merge
// makes the HF/GGUF tests fail loudly with the message below rather than silently.
#include "futransformer/error.h"
#include "futransformer/model.h"

namespace futransformer {

[[gnu::weak]] Model load_hf_model(const std::string& dir) {
  fail(dir, ": load_hf_model is not part of the llama2c branch (link shim; delete tests/cpu/zz_link_shim_*)");
}

[[gnu::weak]] Model load_gguf_model(const std::string& path) {
  fail(path, ": load_gguf_model is not part of the llama2c branch (link shim; delete tests/cpu/zz_link_shim_*)");
}

}  // namespace futransformer
