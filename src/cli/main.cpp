// futransformer command-line tool (subcommands are added by src/cli/cmd_*.cpp).
#include <cstdio>

int main(int argc, char** argv) {
  std::fprintf(stderr, "futransformer: no subcommands yet\n");
  return 2;
}
