#pragma once
// cifar10_predict as a function: classifies image files with a checkpoint written by
// cifar10_train, preprocessed as the run's images were.
//
// Contract: the model, its classes' names, the input size (--image_size) and the normalisation
// (--mean, --std) come from the checkpoint's metadata (--model overrides the model; a bare
// .safetensors file gets tfcnn's defaults: 32x32, CIFAR-10's statistics, classes by number). Each
// input is a JPEG or PNG file, or a folder whose .jpg/.jpeg/.png files (recursively, in name order)
// are all taken. Every image is decoded, resized to the input size (bilinear, as image folders are
// in training) and normalised; the model runs in evaluation mode on the first device. Errors:
// NotFound for a missing input or a folder without images, DataError naming an undecodable file
// (nothing is printed for any image before all were read).

#include <string>
#include <vector>

#include "core/platform/options.h"
#include "examples/cifar10/train_options.h"
#include "train/reporter.h"

namespace towerflow::cifar10 {

struct PredictOptions {
  std::string checkpoint = "train_dir";  // a train_dir (latest checkpoint), a ckpt-<step> dir or a file
  std::string model = {};                // empty: from the checkpoint's metadata
  std::vector<std::string> inputs;       // image files and folders
  int top_k = 3;                         // classes listed per image (at most the model's)
  int batch = 64;                        // images per forward pass
};

struct Prediction {
  std::string path;
  std::vector<float> logits;          // one per class
  std::vector<float> probabilities;   // softmax of the logits
  std::vector<int> top;               // the top_k classes, most probable first
};

struct Predictions {
  std::vector<std::string> class_names;  // "3" where the checkpoint names none
  std::vector<Prediction> images;
};

// Classifies and prints one line per image through the reporter's output (plain: "path  cat 91.2%,
// dog 5.1%, ..."; json: {"path", "top": [{"class", "index", "prob"}...], "logits"}).
Predictions run_prediction(const TrainOptions& options, const PredictOptions& predict, ProcessOptions process,
                           train::Reporter& reporter);

}  // namespace towerflow::cifar10
