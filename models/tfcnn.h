#pragma once
// The TensorFlow CIFAR-10 tutorial network, without LRN: conv5x5-64 (pad 2), ReLU, max-pool 3/2
// pad 1, conv5x5-64, ReLU, max-pool 3/2 pad 1, flatten (PyTorch's c, h, w order), fc 4096-384,
// ReLU, fc 384-192, ReLU, fc 192-classes. Names conv1, conv2, fc1, fc2, fc3.

#include <memory>

#include "core/nn/layers.h"

namespace towerflow::models {

class TfCnn : public nn::Module {
 public:
  TfCnn(const Device& device, int num_classes, nn::InitRng& rng, int image_height = 32, int image_width = 32);
  // [n, image_height, image_width, 3] -> [n, num_classes] (other sizes fail at fc1, naming the shapes)
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Linear> fc1_, fc2_, fc3_;
};

}  // namespace towerflow::models
