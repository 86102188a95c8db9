#include "models/resnet.h"

#include "core/error.h"

namespace towerflow::models {

using nn::BatchNorm2d;
using nn::Conv2d;

BasicBlock::BasicBlock(const Device& device, int in_channels, int out_channels, int stride,
                       nn::InitRng& rng, OutputReaders readers)
    : Module(device), readers_(readers) {
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(
                                        device,
                                        nn::Conv2dSpec{.in_channels = in_channels,
                                                       .out_channels = out_channels,
                                                       .kernel = 3, .stride = stride,
                                                       .padding = 1, .bias = false},
                                        rng));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(device, out_channels));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(
                                        device,
                                        nn::Conv2dSpec{.in_channels = out_channels,
                                                       .out_channels = out_channels,
                                                       .kernel = 3, .stride = 1, .padding = 1,
                                                       .bias = false},
                                        rng));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(device, out_channels));
  if (stride != 1 || in_channels != out_channels) {
    auto down = register_module("downsample", std::make_shared<nn::Sequential>(device));
    down_conv_ = std::make_shared<Conv2d>(
        device,
        nn::Conv2dSpec{.in_channels = in_channels, .out_channels = out_channels, .kernel = 1,
                       .stride = stride, .padding = 0, .bias = false},
        rng);
    down_bn_ = std::make_shared<BatchNorm2d>(device, out_channels);
    down->push_back(down_conv_);
    down->push_back(down_bn_);
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  // relu(bn1(conv1(x))) and relu(bn2(conv2(.)) + shortcut) each run as one fused batch-norm
  // pass, forward and backward: the block touches each activation twice less than unfused. Only
  // conv2 reads bn1's output, and only a batch norm each convolution's, which bf16 precision
  // may therefore store in bf16; so may bn2's, where the caller says another block reads it
  // (Note [bf16 block outputs] in core/tensor/ops.cc).
  // The projection shortcut runs first, so that its backward runs last: it then adds its input
  // gradient to conv1's as it stores it (Note [Gradients summed in place] in
  // core/tensor/autograd.cc), touching only the quarter of the pixels its 1x1 stride-2 kernel
  // reaches, where run the other way round it would write zeros to the other three quarters
  // for conv1 to add to.
  Tensor shortcut = down_conv_ ? down_bn_->forward(down_conv_->forward(x, OutputReaders::kBatchNorm)) : x;
  Tensor out = bn1_->forward_relu(conv1_->forward(x, OutputReaders::kBatchNorm), OutputReaders::kConvolutions);
  out = conv2_->forward(out, OutputReaders::kBatchNorm);
  return bn2_->forward_add_relu(out, shortcut, readers_);
}

CifarResNet::CifarResNet(const Device& device, int depth, int num_classes, nn::InitRng& rng)
    : Module(device) {
  if (depth < 8 || (depth - 2) % 6 != 0)
    raise<InvalidArgument>("CIFAR ResNet depth ", depth,
                           " must be 6n + 2 (20, 32, 44, 56, 110)");
  if (num_classes < 1)
    raise<InvalidArgument>("num_classes ", num_classes, " must be at least 1");
  const int n = (depth - 2) / 6;
  conv1_ = register_module(
      "conv1", std::make_shared<Conv2d>(device,
                                        nn::Conv2dSpec{.in_channels = 3, .out_channels = 16,
                                                       .kernel = 3, .stride = 1, .padding = 1,
                                                       .bias = false},
                                        rng));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(device, 16));
  int in = 16;
  std::shared_ptr<nn::Sequential>* stages[3] = {&layer1_, &layer2_, &layer3_};
  const int widths[3] = {16, 32, 64};
  for (int s = 0; s < 3; ++s) {
    *stages[s] = register_module("layer" + std::to_string(s + 1),
                                 std::make_shared<nn::Sequential>(device));
    for (int i = 0; i < n; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1;
      // Every block's output but the last's goes to another block (Note [bf16 block outputs]).
      const bool last = s == 2 && i == n - 1;
      (*stages[s])->push_back(std::make_shared<BasicBlock>(
          device, in, widths[s], stride, rng,
          last ? OutputReaders::kAny : OutputReaders::kConvolutionsAndResidual));
      in = widths[s];
    }
  }
  pool_ = std::make_shared<nn::GlobalAvgPool>(device);  // no state: not registered by name
  fc_ = register_module("fc", std::make_shared<nn::Linear>(device, 64, num_classes, rng));
}

Tensor CifarResNet::forward(const Tensor& x) {
  if (x.ndim() != 4 || x.dim(3) != 3)
    raise<InvalidArgument>("ResNet input must be NHWC [n, h, w, 3], got ", x.describe());
  Tensor y = bn1_->forward_relu(conv1_->forward(x, OutputReaders::kBatchNorm),
                                OutputReaders::kConvolutionsAndResidual);
  y = layer3_->forward(layer2_->forward(layer1_->forward(y)));
  {
    OpScope scope("avgpool");
    y = pool_->forward(y);
  }
  return fc_->forward(y);
}

}  // namespace towerflow::models
