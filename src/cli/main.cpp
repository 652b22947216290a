// futransformer: run Llama-family models (CPU reference engine; Hopper GPU engine where available).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "futransformer/error.h"

int main(int argc, char** argv) {
  namespace cli = futransformer::cli;
  CLI::App app{"futransformer: Llama-family inference with FP8 prefill and INT4 decode on Hopper GPUs"};
  app.set_version_flag("--version", "futransformer 0.1.0");
  app.require_subcommand(1);
  const std::vector<cli::Command> commands = {cli::add_generate_command(app), cli::add_info_command(app),
                                              cli::add_make_model_command(app), cli::add_quantize_command(app),
                                              cli::add_ppl_command(app), cli::add_report_command(app)};
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const cli::Command& c : commands) {
      known = known || c.sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + c.sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "error: unknown command '%s' (expected one of: %s; see --help)\n", argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (const cli::Command& c : commands)
      if (c.sub->parsed()) return c.run();
  } catch (const futransformer::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 2;
}
