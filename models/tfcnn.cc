#include "models/tfcnn.h"

#include "core/error.h"

namespace towerflow::models {

TfCnn::TfCnn(const Device& device, int num_classes, nn::InitRng& rng, int image_height, int image_width)
    : Module(device) {
  if (num_classes < 1)
    raise<InvalidArgument>("num_classes ", num_classes, " must be at least 1");
  if (image_height < 1 || image_width < 1)
    raise<InvalidArgument>("tfcnn's image size ", image_height, "x", image_width, " must be at least 1x1");
  // Two poolings of kernel 3, stride 2, padding 1: ceil(n / 2) each.
  const auto pooled = [](int n) { return (((n + 1) / 2) + 1) / 2; };
  const auto conv = [&](int in) {
    return std::make_shared<nn::Conv2d>(
        device,
        nn::Conv2dSpec{.in_channels = in, .out_channels = 64, .kernel = 5, .stride = 1,
                       .padding = 2, .bias = true},
        rng);
  };
  conv1_ = register_module("conv1", conv(3));
  conv2_ = register_module("conv2", conv(64));
  fc1_ = register_module("fc1", std::make_shared<nn::Linear>(device, 64 * pooled(image_height) * pooled(image_width), 384, rng));
  fc2_ = register_module("fc2", std::make_shared<nn::Linear>(device, 384, 192, rng));
  fc3_ = register_module("fc3", std::make_shared<nn::Linear>(device, 192, num_classes, rng));
}

Tensor TfCnn::forward(const Tensor& x) {
  const Pool2dOptions pool{.kernel = 3, .stride = 2, .padding = 1};
  Tensor y;
  {
    OpScope scope("pool1");
    // max_pool2d(relu(conv1(x))), the pool and ReLU in one pass, and conv1's bias gradient in
    // the pool's backward pass; only conv2 reads it (bf16 under bf16 precision).
    Pool2dOptions pool1 = pool;
    pool1.readers = OutputReaders::kConvolutions;
    y = conv1_->forward_max_pool_relu(x, pool1);
  }
  {
    OpScope scope("pool2");
    y = towerflow::flatten(conv2_->forward_max_pool_relu(y, pool));
  }
  {
    OpScope scope("fc1");
    y = relu(fc1_->forward(y));
  }
  {
    OpScope scope("fc2");
    y = relu(fc2_->forward(y));
  }
  return fc3_->forward(y);
}

}  // namespace towerflow::models
