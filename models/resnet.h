#pragma once
// CIFAR ResNets (He et al. 2016, section 4.2): conv3x3-16, BN, ReLU, three stages of n basic
// blocks (16, 32, 64 channels; stride 2 at the start of stages 2 and 3), global average pool,
// fc. depth = 6n + 2: 20, 32, 44, 56, 110. Where a block changes the shape, its shortcut is a
// 1x1 convolution with the block's stride and a batch norm ("downsample"); elsewhere identity.
// Names follow torchvision (conv1, bn1, layer1.0.conv1, layer2.0.downsample.0, fc).

#include <memory>

#include "core/nn/layers.h"

namespace towerflow::models {

class BasicBlock : public nn::Module {
 public:
  // readers: which ops read the block's output (OutputReaders::kConvolutionsAndResidual when
  // another block follows: bf16 precision may then store it in bf16, Note [bf16 block outputs]
  // in core/tensor/ops.cc).
  BasicBlock(const Device& device, int in_channels, int out_channels, int stride,
             nn::InitRng& rng, OutputReaders readers = OutputReaders::kAny);
  // [n, h, w, in] -> [n, h/stride, w/stride, out]
  Tensor forward(const Tensor& x) override;

 private:
  OutputReaders readers_;
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<nn::Conv2d> down_conv_;
  std::shared_ptr<nn::BatchNorm2d> down_bn_;
};

class CifarResNet : public nn::Module {
 public:
  // depth = 6n + 2; anything else throws InvalidArgument.
  CifarResNet(const Device& device, int depth, int num_classes, nn::InitRng& rng);
  // [n, 32, 32, 3] (any h, w >= 4) -> [n, num_classes]
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::Conv2d> conv1_;
  std::shared_ptr<nn::BatchNorm2d> bn1_;
  std::shared_ptr<nn::Sequential> layer1_, layer2_, layer3_;
  std::shared_ptr<nn::GlobalAvgPool> pool_;
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace towerflow::models
