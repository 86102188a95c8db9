#include "core/nn/layers.h"

#include <cmath>

#include "core/error.h"

namespace towerflow::nn {

// ---- Conv2d -----------------------------------------------------------------------------------

Conv2d::Conv2d(const Device& device, Conv2dSpec spec, InitRng& rng) : Module(device), spec_(spec) {
  if (spec.in_channels < 1 || spec.out_channels < 1 || spec.kernel < 1 || spec.stride < 1 ||
      spec.padding < 0)
    raise<InvalidArgument>("Conv2d: in_channels ", spec.in_channels, ", out_channels ",
                           spec.out_channels, ", kernel ", spec.kernel, ", stride ", spec.stride,
                           " must be positive and padding ", spec.padding, " non-negative");
  Tensor weight =
      Tensor::empty({spec.out_channels, spec.in_channels, spec.kernel, spec.kernel}, device);
  weight_ = spec.learn_weight ? register_parameter("weight", weight) : register_buffer("weight", weight);
  kaiming_normal_fan_out(weight_, rng);
  if (spec.bias) {
    bias_ = register_parameter("bias", Tensor::empty({spec.out_channels}, device));
    const double fan_in = static_cast<double>(spec.in_channels) * spec.kernel * spec.kernel;
    uniform_init(bias_, 1.0 / std::sqrt(fan_in), rng);
  }
}

Tensor Conv2d::forward(const Tensor& x) { return forward(x, OutputReaders::kAny); }

Tensor Conv2d::forward(const Tensor& x, OutputReaders readers) {
  OpScope scope(path());
  return conv2d(x, weight_, bias_, {.stride = spec_.stride, .padding = spec_.padding, .readers = readers});
}

Tensor Conv2d::forward_max_pool_relu(const Tensor& x, Pool2dOptions pool) {
  OpScope scope(path());
  return conv2d_max_pool2d_relu(x, weight_, bias_, {.stride = spec_.stride, .padding = spec_.padding}, pool);
}

// ---- BatchNorm2d ------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(const Device& device, int channels, float eps, float momentum)
    : BatchNorm2d(device, channels, BatchNorm2dSpec{.eps = eps, .momentum = momentum}) {}

BatchNorm2d::BatchNorm2d(const Device& device, int channels, BatchNorm2dSpec spec)
    : Module(device), eps_(spec.eps), momentum_(spec.momentum) {
  if (channels < 1) raise<InvalidArgument>("BatchNorm2d: channels ", channels, " must be >= 1");
  if (!(spec.eps > 0.0f) || !(spec.momentum >= 0.0f && spec.momentum <= 1.0f))
    raise<InvalidArgument>("BatchNorm2d: eps ", spec.eps, " must be > 0 and momentum ",
                           spec.momentum, " in [0, 1] (PyTorch's convention: the weight of the "
                           "batch's statistics)");
  Tensor ones = Tensor::full({channels}, 1.0f, device);
  weight_ = spec.learn_scale ? register_parameter("weight", ones) : register_buffer("weight", ones);
  bias_ = register_parameter("bias", Tensor::zeros({channels}, device));
  running_mean_ = register_buffer("running_mean", Tensor::zeros({channels}, device));
  running_var_ = register_buffer("running_var", Tensor::full({channels}, 1.0f, device));
}

BatchNormOptions BatchNorm2d::options() const {
  return {.training = is_training(), .momentum = momentum_, .eps = eps_, .sync = sync_};
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  OpScope scope(path());
  return batch_norm(x, weight_, bias_, running_mean_, running_var_, options());
}

Tensor BatchNorm2d::forward_relu(const Tensor& x, OutputReaders readers) {
  OpScope scope(path());
  BatchNormOptions opts = options();
  opts.readers = readers;
  return batch_norm_relu(x, weight_, bias_, running_mean_, running_var_, opts);
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual, OutputReaders readers) {
  OpScope scope(path());
  BatchNormOptions opts = options();
  opts.readers = readers;
  return batch_norm_add_relu(x, residual, weight_, bias_, running_mean_, running_var_, opts);
}

// ---- Linear -----------------------------------------------------------------------------------

Linear::Linear(const Device& device, int in_features, int out_features, InitRng& rng, bool bias)
    : Module(device) {
  if (in_features < 1 || out_features < 1)
    raise<InvalidArgument>("Linear: in_features ", in_features, " and out_features ",
                           out_features, " must be >= 1");
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight_ = register_parameter("weight", Tensor::empty({out_features, in_features}, device));
  uniform_init(weight_, bound, rng);
  if (bias) {
    bias_ = register_parameter("bias", Tensor::empty({out_features}, device));
    uniform_init(bias_, bound, rng);
  }
}

Tensor Linear::forward(const Tensor& x) {
  OpScope scope(path());
  return linear(x, weight_, bias_);
}

// ---- stateless layers -------------------------------------------------------------------------

Tensor ReLU::forward(const Tensor& x) {
  OpScope scope(path());
  return relu(x);
}

Tensor GELU::forward(const Tensor& x) {
  OpScope scope(path());
  return gelu(x);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  OpScope scope(path());
  return max_pool2d(x, opts_);
}

Tensor GlobalAvgPool::forward(const Tensor& x) {
  OpScope scope(path());
  return global_avg_pool(x);
}

Tensor Flatten::forward(const Tensor& x) {
  OpScope scope(path());
  return towerflow::flatten(x);
}

Dropout::Dropout(const Device& device, float p, std::uint64_t seed)
    : Module(device), p_(p), seed_(seed) {
  if (!(p >= 0.0f && p < 1.0f))
    raise<InvalidArgument>("Dropout: p = ", p, " must be in [0, 1)");
}

Tensor Dropout::forward(const Tensor& x) {
  OpScope scope(path());
  Tensor y = dropout(x, p_, is_training(), seed_, offset_);
  if (is_training()) offset_ += static_cast<std::uint64_t>(x.numel());
  return y;
}

// ---- Sequential -------------------------------------------------------------------------------

void Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& layer : layers_) y = layer->forward(y);
  return y;
}

}  // namespace towerflow::nn
