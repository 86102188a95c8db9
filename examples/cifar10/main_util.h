#pragma once
// What cifar10_train and cifar10_eval share around their work: resolving the command line,
// the reporter, and turning errors into messages and exit codes.
//
// Exit codes: 0 done; 1 an error (a message says which); 2 a bad option, config, path or file (a corrupt or mismatched checkpoint);
// 3 a non-finite loss (NumericalError); 4 out of memory. With --json the error is a JSON line
// {"event": "error", ...} on stdout; otherwise "error: ..." on stderr.

#include <functional>

#include "examples/cifar10/train_options.h"
#include "train/reporter.h"

namespace towerflow::cifar10 {

using train::Reporter;

int run_main(const TrainCommandLine& cli, const std::function<int(const Resolved&, Reporter&)>& work);

}  // namespace towerflow::cifar10
