#include "test_paths.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <random>

namespace futransformer::test {

std::string shared_dir() {
  if (const char* env = std::getenv("FT_SHARED_DIR"); env && *env) return env;
  return FT_DEFAULT_SHARED_DIR;
}

std::string shared_path(const std::string& relative) { return shared_dir() + "/" + relative; }

std::string smollm2_gguf_path() {
  if (const char* env = std::getenv("FT_SMOLLM2_GGUF"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/futransformer/SmolLM2-135M-Instruct.Q4_1.gguf";
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string cli_path() { return FT_CLI_PATH; }

std::string source_path(const std::string& relative) { return std::string(FT_SOURCE_DIR) + "/" + relative; }

std::string make_temp_dir(const std::string& tag) {
  std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("futransformer-" + tag + "-" + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace futransformer::test
