// towerflow_export: writes an ONNX model of a checkpoint written by cifar10_train.
//   towerflow_export --checkpoint train_dir --onnx model.onnx
#include <CLI/CLI.hpp>

#include "core/error.h"
#include "examples/cifar10/main_util.h"
#include "examples/cifar10/onnx_export.h"

namespace cf = towerflow::cifar10;

int main(int argc, char** argv) {
  CLI::App app{"towerflow_export: write an ONNX model (opset 13) of a checkpoint written by cifar10_train.\n"
               "  towerflow_export --checkpoint train_dir --onnx model.onnx"};
  app.get_formatter()->column_width(44);
  cf::ExportOptions o;
  app.add_option("--checkpoint", o.checkpoint,
                 "a train_dir (its latest checkpoint), a ckpt-<step> directory, or a model .safetensors file")
      ->capture_default_str();
  app.add_option("--model", o.model, "the model (default: the one recorded in the checkpoint)");
  app.add_option("--onnx", o.onnx, "the ONNX file to write (input \"input\" NCHW, normalised; output \"logits\")")
      ->required();
  cf::TrainCommandLine cli;
  cli.add_to(app, {"progress", "json"});
  if (auto code = cf::parse_command_line(app, argc, argv)) return *code;
  return cf::run_main(cli, [&](const cf::Resolved&, cf::Reporter& reporter) {
    const cf::ExportResult r = cf::export_onnx(o);
    reporter.block("export", "towerflow_export",
                   {{"checkpoint", r.model_file.string()},
                    {"model", towerflow::str(r.model, " (", r.classes, " classes)")},
                    {"onnx", towerflow::str(r.onnx.string(), ": opset 13, ", r.nodes, " nodes, input \"input\" [batch, 3, ",
                                            r.image_height, ", ", r.image_width, "] normalised as in training, output \"logits\"")}});
    return 0;
  });
}
