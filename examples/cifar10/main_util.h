#pragma once
// What cifar10_train and cifar10_eval share around their work: resolving the command line,
// the reporter, and turning errors into messages and exit codes.
//
// Exit codes: 0 done; 1 an error (a message says which); 2 a bad flag, option, config, path or
// file (a corrupt or mismatched checkpoint, a train_dir holding an earlier run); 3 a non-finite
// loss (NumericalError); 4 out of memory; 128 + N stopped by signal N (130 SIGINT, 143 SIGTERM)
// after writing a checkpoint. With --progress json (or --json) the error is a JSON line
// {"event": "error", ...} on stdout; otherwise "error: ..." on stderr.

#include <functional>
#include <optional>

#include <CLI/CLI.hpp>

#include "examples/cifar10/train_options.h"
#include "train/reporter.h"

namespace towerflow::cifar10 {

using train::Reporter;

// Parses the command line: nullopt to go on, else the exit code (0 after --help; 2 and CLI11's
// message on stderr for a flag that is unknown, malformed or missing its value).
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

int run_main(const TrainCommandLine& cli, const std::function<int(const Resolved&, Reporter&)>& work);

}  // namespace towerflow::cifar10
