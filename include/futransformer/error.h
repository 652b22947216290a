// Errors: every failure the user can cause (bad file, bad flag, unsupported shape) is reported as one
// futransformer::Error whose message names the file/tensor/field and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace futransformer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// fail("file.gguf: tensor 'x' has ", n, " dims, expected 2") throws Error with the concatenated message.
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

// check(cond, ...) fails with the message when cond is false.
template <typename... Args>
void check(bool cond, Args&&... args) {
  if (!cond) fail(std::forward<Args>(args)...);
}

}  // namespace futransformer
