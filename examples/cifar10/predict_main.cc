// cifar10_predict: classifies image files or folders with a checkpoint written by cifar10_train,
// preprocessed as that run's images were (its --image_size, --mean, --std).
#include <CLI/CLI.hpp>

#include "examples/cifar10/main_util.h"
#include "examples/cifar10/predict.h"

namespace cf = towerflow::cifar10;

int main(int argc, char** argv) {
  CLI::App app{"cifar10_predict: classify images with a checkpoint written by cifar10_train.\n"
               "  cifar10_predict --checkpoint train_dir cat.png photos/"};
  app.get_formatter()->column_width(44);
  cf::PredictOptions predict;
  app.add_option("--checkpoint", predict.checkpoint,
                 "a train_dir (its latest checkpoint), a ckpt-<step> directory, or a model .safetensors file")
      ->capture_default_str();
  app.add_option("--model", predict.model, "the model (default: the one recorded in the checkpoint)");
  app.add_option("--top_k", predict.top_k, "classes listed per image, most probable first")->capture_default_str();
  app.add_option("--batch_size", predict.batch, "images per forward pass")->capture_default_str();
  app.add_option("images", predict.inputs, "JPEG or PNG files, and folders (their images, recursively)");
  cf::TrainCommandLine cli;
  cli.add_to(app, {"devices", "progress", "json"});
  if (auto code = cf::parse_command_line(app, argc, argv)) return *code;
  return cf::run_main(cli, [&](const cf::Resolved& r, cf::Reporter& reporter) {
    cf::run_prediction(r.train, predict, r.process, reporter);
    return 0;
  });
}
