// Paths the tests need: ../shared (FT_SHARED_DIR overrides) and the SmolLM2 GGUF cache.
#pragma once

#include <string>

namespace futransformer::test {

// Directory of the read-only shared data (models, tokenizers, WikiText-2).
std::string shared_dir();
// shared_dir() + "/" + relative.
std::string shared_path(const std::string& relative);
// SmolLM2-135M-Instruct Q4_1 GGUF: $FT_SMOLLM2_GGUF, else ~/.cache/futransformer/SmolLM2-135M-Instruct.Q4_1.gguf
// (scripts/fetch_smollm2.sh puts it there).
std::string smollm2_gguf_path();
bool file_exists(const std::string& path);
// The futransformer executable built alongside the tests.
std::string cli_path();
// A file of this source tree (scripts, docs): the configured source directory + "/" + relative.
std::string source_path(const std::string& relative);
// A fresh empty temporary directory (removed at process exit is not guaranteed; it lives under /tmp).
std::string make_temp_dir(const std::string& tag);

}  // namespace futransformer::test

// Skips the current test with the missing path in the message (never passes silently).
#define FT_REQUIRE_FILE(path)                                                  \
  do {                                                                         \
    const std::string ft_required_path_ = (path);                              \
    if (!::futransformer::test::file_exists(ft_required_path_))                \
      GTEST_SKIP() << "missing test file: " << ft_required_path_;              \
  } while (0)
