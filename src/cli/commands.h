// Each subcommand registers itself on the CLI11 app and runs when selected.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace futransformer::cli {

// A registered subcommand and its body (returns the process exit code).
struct Command {
  CLI::App* sub;
  std::function<int()> run;
};

Command add_generate_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_make_model_command(CLI::App& app);
Command add_quantize_command(CLI::App& app);
Command add_ppl_command(CLI::App& app);
Command add_report_command(CLI::App& app);

}  // namespace futransformer::cli
