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
  CLI11_PARSE(app, argc, argv);
  return cf::run_main(cli, [](const cf::Resolved& r, cf::Reporter& reporter) {
    cf::run_training(r.train, r.process, reporter);
    return 0;
  });
}
