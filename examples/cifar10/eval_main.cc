// cifar10_eval: evaluates a checkpoint on the test split (top-1 accuracy and loss), on every
// visible device with towers, as cifar10_train does at the end of training.
#include <CLI/CLI.hpp>

#include "core/error.h"
#include "examples/cifar10/main_util.h"
#include "examples/cifar10/training.h"

namespace cf = towerflow::cifar10;

int main(int argc, char** argv) {
  CLI::App app{"cifar10_eval: evaluate a checkpoint written by cifar10_train on the test split."};
  app.get_formatter()->column_width(44);
  cf::EvalOptions eval;
  app.add_option("--checkpoint", eval.checkpoint,
                 "a train_dir (its latest checkpoint), a ckpt-<step> directory, or a model .safetensors file")
      ->capture_default_str();
  app.add_option("--model", eval.model, "the model (default: the one recorded in the checkpoint)");
  app.add_option("--confusion", eval.confusion,
                 "write the confusion matrix, each class's accuracy and top-5 as JSON to this file "
                 "(scripts/plot_confusion.py draws it)");
  cf::TrainCommandLine cli;
  cli.add_to(app, {"data_dir", "dataset", "loader_threads", "builtin_train_size", "builtin_test_size", "devices",
                   "num_gpus", "batch_size", "split", "split_remainder", "seed", "progress", "json"});
  if (auto code = cf::parse_command_line(app, argc, argv)) return *code;
  return cf::run_main(cli, [&](const cf::Resolved& r, cf::Reporter& reporter) {
    cf::run_evaluation(r.train, eval, r.process, reporter, r.given);
    return 0;
  });
}
