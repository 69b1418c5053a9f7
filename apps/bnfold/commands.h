#pragma once
// Each subcommand registers its options on the CLI11 app and returns the function that runs it.

#include <functional>

#include <CLI/CLI.hpp>

namespace bnfold::cli {

/// Exit codes, documented in --help and the README.
enum ExitCode : int {
  kExitOk = 0,
  kExitFindings = 1,  ///< `check` found something in a --fail-on category
  kExitInvalid = 2,   ///< usage error or invalid input
};

using CommandRunner = std::function<int()>;

CommandRunner addInfoCommand(CLI::App& app);
CommandRunner addFoldCommand(CLI::App& app);
CommandRunner addCheckCommand(CLI::App& app);

}  // namespace bnfold::cli
