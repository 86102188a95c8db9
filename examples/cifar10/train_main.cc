// cifar10_train: trains a CIFAR model on every visible device with towers, evaluates it, saves
// it, and reports what happened. `cifar10_train --help` lists every flag with its default.
#include <CLI/CLI.hpp>

#include "core/error.h"
#include "examples/cifar10/main_util.h"
#include "examples/cifar10/training.h"

namespace cf = towerflow::cifar10;

int main(int argc, char** argv) {
  CLI::App app{"cifar10_train: train a CIFAR model with one tower per device, evaluate it, checkpoint it.\n"
               "With no flags: the built-in dataset on every visible device (two CPU towers without a GPU)."};
  app.get_formatter()->column_width(44);
  cf::TrainCommandLine cli;
  cli.add_to(app);
  if (auto code = cf::parse_command_line(app, argc, argv)) return *code;
  return cf::run_main(cli, [](const cf::Resolved& r, cf::Reporter& reporter) {
    towerflow::train::StopOnSignal signals;  // Ctrl-C / SIGTERM: finish the step, checkpoint, exit 128 + N
    cf::FitResult result = cf::run_training(r.train, r.process, reporter, {&signals}, r.given);
    if (!signals.received()) return 0;
    reporter.message(towerflow::LogLevel::Warning,
                     towerflow::str("stopped by ", result.stop_reason, " after step ", result.steps, "; the checkpoint is ",
                                    result.last_checkpoint.string(), "; continue with --resume"));
    return 128 + signals.received();
  });
}
