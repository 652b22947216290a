// BRANCH-ONLY LINK SHIM — revert this file's commit when merging. model.cpp's load_model() references the GGUF
// and llama2.c loaders, which other branches provide; without them the test binary of the io-hf branch cannot
// link. The definitions are weak and live in the test binary only, and fail loudly if ever called.
#include "futransformer/error.h"
#include "futransformer/model.h"

namespace futransformer {

[[gnu::weak]] Model load_gguf_model(const std::string& path) {
  fail(path, ": load_gguf_model is not part of the io-hf branch (link shim; delete tests/cpu/zz_link_shim_*)");
}

[[gnu::weak]] Model load_llama2c_model(const std::string& path) {
  fail(path, ": load_llama2c_model is not part of the io-hf branch (link shim; delete tests/cpu/zz_link_shim_*)");
}

}  // namespace futransformer
