// Runs the futransformer executable as a user would (a real process, through the shell) and captures its exit
// code, stdout and stderr; shared by the CLI tests.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "test_paths.h"

namespace futransformer::test {

struct CliResult {
  int exit_code;     // -1 when the process did not exit normally
  std::string out;   // stdout
  std::string err;   // stderr
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Single-quotes a path for the shell command line (test paths hold no single quotes).
inline std::string quote(const std::string& s) { return "'" + s + "'"; }

// `args` is appended to the executable's path as shell text, so callers quote paths with quote().
inline CliResult run_cli(const std::string& args) {
  const std::string dir = make_temp_dir("cli");
  const std::string cmd = cli_path() + " " + args + " >" + dir + "/out 2>" + dir + "/err";
  const int status = std::system(cmd.c_str());
  CliResult r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir + "/out"), slurp(dir + "/err")};
  std::remove((dir + "/out").c_str());
  std::remove((dir + "/err").c_str());
  std::remove(dir.c_str());
  return r;
}

}  // namespace futransformer::test
