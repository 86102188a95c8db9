#pragma once
// towerflow_export --onnx as a function: an ONNX model of a checkpoint of towerflow's CIFAR models
// (tfcnn, resnet20..110), for ONNX Runtime, TensorRT or any other ONNX consumer.
//
// Contract: the graph is the model's forward in evaluation mode (batch norm with its running
// statistics), on the checkpoint's weights, as PyTorch's module of the same name computes it
// (examples/cifar10/check_torch_load.py): input "input", float32 [batch, 3, H, W] (NCHW, batch
// symbolic; H x W the checkpoint's image_size), already normalised as the run's images were (the
// model's metadata_props hold image_size, mean, std and class_names, as the checkpoint's
// metadata); output "logits", float32 [batch, classes]. ONNX opset 13, operators Conv,
// BatchNormalization, Relu, Add, MaxPool, GlobalAveragePool, Flatten, Gemm. Errors: NotFound for
// a missing checkpoint, DataError for a tensor the model needs that is missing or misshapen
// (naming it), InvalidArgument for a model name that is not towerflow's.

#include <filesystem>
#include <string>

namespace towerflow::cifar10 {

struct ExportOptions {
  std::string checkpoint = "train_dir";  // a train_dir (latest checkpoint), a ckpt-<step> dir or a file
  std::string model = {};                // empty: from the checkpoint's metadata
  std::string onnx = {};                 // the file to write
};

struct ExportResult {
  std::filesystem::path model_file, onnx;
  std::string model;
  int nodes = 0;
  int image_height = 32, image_width = 32, classes = 10;
};

ExportResult export_onnx(const ExportOptions& options);

}  // namespace towerflow::cifar10
