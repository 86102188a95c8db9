#pragma once
// Models by name: the CIFAR networks, built on a device with deterministic initialisation.
//
//   auto model = towerflow::models::make_model("resnet20", Device::cpu(0), {.num_classes = 10});
//   ModelFactory f = towerflow::models::factory("tfcnn", {.seed = 7});   // for the tower builder
//
// Contract:
// - Names: "tfcnn" (the TensorFlow CIFAR-10 tutorial network without LRN: conv5x5-64, relu,
//   max-pool 3/2 pad 1, conv5x5-64, relu, max-pool 3/2 pad 1, fc-384, fc-192, fc-classes; 32x32
//   input) and "resnet20", "resnet32", "resnet44", "resnet56", "resnet110" (He et al. 2016 CIFAR
//   ResNets: 16/32/64 channels, 1x1 conv + BN projection where the shape changes), and
//   "airbench94" (models/airbench.h: the network of the airbench94 speed recipe; its whitening
//   layer is set from data by Airbench94::whiten, and its initialisation is its own). An unknown
//   name throws NotFound listing the known ones.
// - Input NHWC float32 [n, 32, 32, 3]; output logits [n, num_classes].
// - Parameter and buffer names and layouts are those of the equivalent PyTorch module's
//   state_dict (torchvision-style: conv1, bn1, layer{1,2,3}.{i}.{conv1,bn1,conv2,bn2},
//   layer{2,3}.0.downsample.{0,1}, fc; tfcnn: conv1, conv2, fc1, fc2, fc3).
// - Initialisation is a pure function of the seed (same values on every device and platform):
//   convolutions Kaiming-normal (fan_out, ReLU gain, as torchvision's ResNet), linear layers and
//   conv biases PyTorch's default uniform(+-1/sqrt(fan_in)), batch norm gamma 1, beta 0, running
//   mean 0, running variance 1.
// - The returned model is flattened (Module::flatten) and in training mode.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/module.h"
#include "models/airbench.h"  // IWYU pragma: export

namespace towerflow::models {

struct ModelOptions {
  int num_classes = 10;
  std::uint64_t seed = 0;
  // The input images' size. The ResNets pool globally and take any size; tfcnn's first linear
  // layer is sized for it (64 * ceil(h/4) * ceil(w/4) inputs).
  int image_height = 32, image_width = 32;
};

std::shared_ptr<nn::Module> make_model(const std::string& name, const Device& device,
                                       ModelOptions opts = {});
// make_model bound to a name and options: what the tower builder takes.
nn::ModelFactory factory(const std::string& name, ModelOptions opts = {});
std::vector<std::string> model_names();

// Forward multiply-adds per 32x32 image (convolutions and linear layers), for GFLOP/s figures.
std::int64_t forward_macs_per_image(const std::string& name, int num_classes = 10);

}  // namespace towerflow::models
